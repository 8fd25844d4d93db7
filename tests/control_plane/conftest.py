"""Fixtures of the tests against the real control plane (``support.control_plane``).

- ``control_plane`` (session, tests/conftest.py): etcd, kube-apiserver, kube-controller-manager
  and kube-scheduler, started once for every test of the worker process that asks for it, these
  and tests/operator's alike, with the project's CRDs; each test works in a namespace of its own,
  and a test that changes cluster-scoped state puts it back.
- ``kubectl`` (session): the real kubectl as the admin, ``kubectl(*args, stdin=..., check=...)``.
- ``crds`` (session): the project's CRDs applied with that kubectl and Established.
- ``namespace`` (function): a fresh namespace, deleted after the test.
- ``prometheus`` (function): the real Prometheus server (``support.prometheus``), for the operator.
- ``helm`` (session): the real helm as the admin, ``helm(*args)``; a failure raises with its stderr.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.control_plane import ControlPlane
from support.k8s_binaries import helm as helm_binary
from support.k8s_binaries import kubectl as kubectl_binary
from support.prometheus import prometheus

__all__ = ["prometheus"]

REPO = Path(__file__).resolve().parents[2]
CRD_NAMES = ("compilejobs.polymorph.dev", "modeldeployments.polymorph.dev")

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    home = tmp_path_factory.mktemp("kubectl-home")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(control_plane.kubeconfig)}

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(kubectl_binary()), *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    return run


@pytest.fixture(scope="session")
def helm(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    home = tmp_path_factory.mktemp("helm-home")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}  # fmt: skip

    def run(*args: str) -> str:
        done = subprocess.run(
            [str(helm_binary()), "--kubeconfig", str(control_plane.kubeconfig), *args],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    return run


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES))


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false")
