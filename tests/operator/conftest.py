"""Fixtures of the operator's integration tests: the real control plane (``control_plane``, session;
``real_cluster``, one per test, with the CRDs), the operator process on it (``real_operator``), a
node agent whose pods are stand-ins (``real_kubelet``: engines report ready, sandboxes finish on
``sandboxes_done``), a real Prometheus and the fake engine endpoints it scrapes (``engines``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import NS, REPO, Api, FakeEngine, OperatorProcess

from support.control_plane import ControlPlane, control_plane
from support.node_agent import NodeAgent
from support.prometheus import PrometheusServer, prometheus
from support.waiting import wait_for

__all__ = ["control_plane", "prometheus"]


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
    """``real_operator(**flags)``: the operator process against the real control plane, as its admin
    (or as ``kubeconfig=`` says, e.g. ``ControlPlane.user_kubeconfig``, an admin of its own name)."""
    started: list[OperatorProcess] = []
    (tmp_path / "store").mkdir()

    def start(kubeconfig: Path | None = None, **flags: Any) -> OperatorProcess:
        log = tmp_path / f"operator-{flags.get('pod_id') or 'standalone'}.log"
        proc = OperatorProcess(kubeconfig or real_cluster[2], prometheus.url, tmp_path / "store", log,
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


_FINISH = """
import pathlib, sys, time
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.2)
"""


def _stand_in(sandboxes_done: Path) -> Callable[[Any], list[str]]:
    """A container's stand-in: an engine answers 200 on its (mapped) readiness port (the metrics come
    from FakeEngine); a sandbox's agent exits 0 once ``sandboxes_done`` exists (the campaign's
    documents are the test's to write), which completes its pod; anything else sleeps."""

    def stand_in(container: Any) -> list[str]:
        if container.name == "agent" and container.argv[1:3] == ["sandbox", "agent"]:
            return [sys.executable, "-c", _FINISH, str(sandboxes_done)]
        if container.probe is None:
            return [sys.executable, "-c", "import time; time.sleep(3600)"]
        return [sys.executable, "-c", _READY, str(container.probe[1])]

    return stand_in


@pytest.fixture
def sandboxes_done(tmp_path: Path) -> Path:
    """Create this file and the sandbox pods ``real_kubelet`` runs finish: their agents exit 0."""
    return tmp_path / "sandboxes-done"


@pytest.fixture
def real_kubelet(
    real_cluster: tuple[ControlPlane, Api, Path], tmp_path: Path, sandboxes_done: Path
) -> Iterator[NodeAgent]:
    """A node agent on the real control plane whose containers are stand-ins: the real Deployment
    and ReplicaSet controllers then report the operator's Deployments ready, and the real Job
    controller completes a sandbox Job once ``sandboxes_done`` exists."""
    agent = NodeAgent(real_cluster[0].node_kubeconfig("node-1"), "node-1", tmp_path / "node",
                      stand_in=_stand_in(sandboxes_done)).start()  # fmt: skip
    yield agent
    agent.close()
    real_cluster[0].remove_node("node-1")


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
