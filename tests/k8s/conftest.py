"""Fixtures for the emulator's own tests: a running emulator, an HTTP client on it, the project CRDs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support import yamls
from support.k8s_emulator import EmulatorThread, k8s_emulator

__all__ = ["k8s_emulator"]

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"


@pytest.fixture
def api(k8s_emulator: EmulatorThread) -> Iterator[httpx.Client]:
    """A plain HTTP client on the emulator: the wire protocol, nothing in between."""
    with httpx.Client(base_url=k8s_emulator.url, timeout=10) as client:
        yield client


@pytest.fixture
def crds(api: httpx.Client) -> None:
    """The project's CRDs created, and the ``inference`` namespace with them."""
    for path in sorted(CRDS.glob("*.yaml")):
        response = api.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=yamls.load(path.read_text())
        )
        assert response.status_code == 201, response.text
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "inference"}}
    assert api.post("/api/v1/namespaces", json=namespace).status_code == 201
