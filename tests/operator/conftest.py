"""Fixtures of the operator's integration tests: the emulator with the CRDs, a real Prometheus,
fake engine endpoints it scrapes, a Deployment-readiness stand-in, and the operator process;
the real control plane (``control_plane``, session; ``real_cluster``, one per test) with the
operator on it (``real_operator``) and a node agent whose pods report ready (``real_kubelet``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import NS, REPO, Api, FakeEngine, Kubelet, OperatorProcess

from support.control_plane import ControlPlane, control_plane
from support.k8s_emulator import EmulatorThread
from support.node_agent import NodeAgent
from support.prometheus import PrometheusServer, prometheus
from support.waiting import wait_for

__all__ = ["control_plane", "prometheus"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[EmulatorThread, Api, Path]]:
    """The emulator with the project's CRDs and the ``inference`` namespace: (emulator, api, kubeconfig)."""
    with EmulatorThread() as running:
        api = Api(running.url)
        for path in sorted((REPO / "crds").glob("*.yaml")):
            api.create(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(path.read_text())
            )
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield running, api, running.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def real_cluster(tmp_path: Path) -> Iterator[tuple[ControlPlane, Api, Path]]:
    """A fresh real control plane (``support.control_plane``, about 5 s) with the project's CRDs and
    the ``inference`` namespace: (control plane, api as the admin, the admin's kubeconfig). One per
    test: kopf's finalizers would keep a shared namespace from being deleted once the operator stops."""
    with ControlPlane(tmp_path / "control-plane", crds=sorted((REPO / "crds").glob("*.yaml"))) as running:
        api = Api(running.url, running.api(timeout=10))
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_for(
            "the default service account", lambda: api.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default")
        )
        yield running, api, running.kubeconfig
        api.client.close()


@pytest.fixture
def real_operator(
    real_cluster: tuple[ControlPlane, Api, Path], prometheus: PrometheusServer, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """``real_operator(**flags)``: the operator process against the real control plane, as its admin."""
    started: list[OperatorProcess] = []
    (tmp_path / "store").mkdir()

    def start(**flags: Any) -> OperatorProcess:
        log = tmp_path / f"operator-{flags.get('pod_id') or 'standalone'}.log"
        proc = OperatorProcess(real_cluster[2], prometheus.url, tmp_path / "store", log,
                               env={"PYTHONPATH": str(REPO / "tests")}, **flags)  # fmt: skip
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()


_READY = """
import http.server, sys
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *_):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
"""


def _ready_stand_in(container: Any) -> list[str]:
    """An engine container's stand-in: 200 on its (mapped) readiness port; the metrics come from FakeEngine."""
    if container.probe is None:
        return [sys.executable, "-c", "import time; time.sleep(3600)"]
    return [sys.executable, "-c", _READY, str(container.probe[1])]


@pytest.fixture
def real_kubelet(real_cluster: tuple[ControlPlane, Api, Path], tmp_path: Path) -> Iterator[NodeAgent]:
    """A node agent on the real control plane whose containers are readiness stand-ins: the real
    Deployment and ReplicaSet controllers then report the operator's Deployments ready."""
    agent = NodeAgent(real_cluster[0].node_kubeconfig("node-1"), "node-1", tmp_path / "node",
                      stand_in=_ready_stand_in).start()  # fmt: skip
    yield agent
    agent.close()


@pytest.fixture
def kubelet(cluster: tuple[EmulatorThread, Api, Path]) -> Iterator[Kubelet]:
    k = Kubelet(cluster[1])
    yield k
    k.close()


@pytest.fixture
def engines(prometheus: PrometheusServer) -> Iterator[Callable[..., FakeEngine]]:
    """``engines(md, track, build)``: a fake engine pod scraped by Prometheus with ``namespace=inference``."""
    made: list[FakeEngine] = []

    def make(md: str, track: str, build: str) -> FakeEngine:
        engine = FakeEngine(md, track, build)
        prometheus.add_target(engine.address, namespace=NS)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        prometheus.remove_target(engine.address)
        engine.close()


@pytest.fixture
def operator(
    cluster: tuple[EmulatorThread, Api, Path], prometheus: PrometheusServer, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """``operator(**flags)``: the operator process started against the emulator, stopped at the end."""
    started: list[OperatorProcess] = []
    store = tmp_path / "store"
    store.mkdir()

    def start(**flags: Any) -> OperatorProcess:
        log = tmp_path / f"operator-{flags.get('pod_id') or 'standalone'}.log"
        env = {"PYTHONPATH": str(REPO / "tests")}
        proc = OperatorProcess(cluster[2], prometheus.url, store, log, env=env, **flags)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()
