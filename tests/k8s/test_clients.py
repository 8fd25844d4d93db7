"""The kubernetes Python client, a separate emulator process, and kmock's own DSL on top of the emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import kubernetes
import pytest

from support.k8s_emulator import EmulatorThread

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


@pytest.fixture
def core(k8s_emulator: EmulatorThread, tmp_path: Path) -> Iterator[kubernetes.client.CoreV1Api]:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        str(k8s_emulator.kubeconfig(tmp_path / "kubeconfig")), client_configuration=config
    )
    with kubernetes.client.ApiClient(config) as client:
        yield kubernetes.client.CoreV1Api(client)


def test_the_kubernetes_client_creates_lists_and_watches(core: kubernetes.client.CoreV1Api) -> None:
    body = kubernetes.client.V1ConfigMap(
        metadata=kubernetes.client.V1ObjectMeta(name="c", labels={"a": "b"}), data={"k": "v"}
    )
    created = core.create_namespaced_config_map("default", body)
    assert created.metadata is not None and created.metadata.uid and created.metadata.resource_version
    listed = core.list_namespaced_config_map("default", label_selector="a=b")
    assert listed.metadata is not None
    assert [c.metadata.name for c in listed.items if c.metadata] == ["c"]
    assert "default" in [n.metadata.name for n in core.list_namespace().items if n.metadata]
    core.patch_namespaced_config_map("c", "default", {"data": {"k": "w"}})
    events = list(
        kubernetes.watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=1,
        )
    )
    assert [(e["type"], e["object"].data) for e in events] == [("MODIFIED", {"k": "w"})]
    with pytest.raises(kubernetes.client.ApiException) as error:
        core.read_namespaced_config_map("missing", "default")
    assert error.value.status == 404


def test_kmock_reactions_still_take_priority(k8s_emulator: EmulatorThread) -> None:
    k8s_emulator.emulator["get /api/v1/namespaces/default/configmaps"] << 503
    with httpx.Client(base_url=k8s_emulator.url) as api:
        assert api.get("/api/v1/namespaces/default/configmaps").status_code == 503
        assert api.get("/api/v1/namespaces/kube-system/configmaps").status_code == 200
    assert len(list(k8s_emulator.emulator)) == 2  # kmock records every request


def test_the_emulator_runs_as_a_separate_process(tmp_path: Path) -> None:
    ready, kubeconfig = tmp_path / "ready.json", tmp_path / "kubeconfig"
    command = [sys.executable, "-m", "support.k8s_emulator", "--port", "0", "--ready-file", str(ready)]
    command += ["--kubeconfig", str(kubeconfig), "--preload", str(REPO / "crds")]
    env = os.environ | {"PYTHONPATH": str(TESTS)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() < deadline, "the emulator process did not become ready"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info["pid"] == process.pid and kubeconfig.exists()
        with httpx.Client(base_url=info["url"]) as api:
            resources = api.get("/apis/polymorph.dev/v1alpha1").json()["resources"]
            assert "modeldeployments" in {r["name"] for r in resources}
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
