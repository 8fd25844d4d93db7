"""Fixtures of the operator's integration tests: the real control plane (``control_plane`` of
tests/conftest.py, one per worker process, with the CRDs, shared with tests/control_plane), a
fresh namespace on it for each test (``ns``) and the admin's
client scoped to it (``real_cluster``), the operator process watching that namespace
(``real_operator``), a node agent whose pods are stand-ins (``real_kubelet``: engines report
ready, sandboxes finish on ``sandboxes_done``), a real Prometheus and the fake engine endpoints it
scrapes (``engines``).

The tests share the control plane and are kept apart by their namespaces: on the way out, ``ns``
deletes what a test made in its own, the workloads so that no controller keeps making pods for a
later test's node, and the ModelDeployments and CompileJobs with kopf's finalizers taken off (the
operator has stopped), so that a later cluster-wide operator (tests/control_plane's peering
test) finds none of them. A test that changes cluster-scoped state (a CRD) puts it back itself."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import GROUP, REPO, Api, FakeEngine, OperatorProcess

from support.control_plane import ControlPlane
from support.node_agent import NodeAgent
from support.prometheus import PrometheusServer, prometheus
from support.waiting import wait_for

__all__ = ["prometheus"]

_NAMESPACES = itertools.count(1)


@pytest.fixture
def ns(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace (``inference-<n>``) with its default service account, for this test alone.
    On the way out, its Deployments, ReplicaSets, Jobs, Pods, Services, ModelDeployments and
    CompileJobs are deleted (the namespace stays): the Deployment, ReplicaSet and Job controllers
    would otherwise keep making pods that the scheduler binds to a later test's node, and a
    Service holds one of the few ClusterIPs. No operator watches this namespace any more, so the
    ModelDeployments and CompileJobs that carry kopf's finalizers lose them here and go: a
    cluster-wide operator of a later test would otherwise act on them."""
    name = f"inference-{next(_NAMESPACES)}"
    with control_plane.api(timeout=30) as client:
        api = Api(control_plane.url, client, ns=name)
        api.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        account = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        wait_for("the default service account", lambda: api.get(account))
        yield name
        background = "?propagationPolicy=Background"
        for collection in (  # the owners first, so that none makes a pod again
            f"/apis/apps/v1/namespaces/{name}/deployments{background}",
            f"/apis/apps/v1/namespaces/{name}/replicasets{background}",
            f"/apis/batch/v1/namespaces/{name}/jobs{background}",
            f"/api/v1/namespaces/{name}/pods?gracePeriodSeconds=0",
            f"{GROUP}/namespaces/{name}/modeldeployments{background}",
            f"{GROUP}/namespaces/{name}/compilejobs{background}",
        ):
            api.delete(collection)
        for service in api.items(f"/api/v1/namespaces/{name}/services"):
            api.delete(f"/api/v1/namespaces/{name}/services/{service['metadata']['name']}")
        for kind in ("modeldeployments", "compilejobs"):
            for item in api.items(f"{GROUP}/namespaces/{name}/{kind}"):
                if item["metadata"].get("finalizers"):
                    unheld = client.patch(
                        f"{GROUP}/namespaces/{name}/{kind}/{item['metadata']['name']}",
                        json={"metadata": {"finalizers": None}},
                        headers={"Content-Type": "application/merge-patch+json"},
                    )
                    assert unheld.status_code in (200, 404), unheld.text


@pytest.fixture
def real_cluster(control_plane: ControlPlane, ns: str) -> Iterator[tuple[ControlPlane, Api, Path]]:
    """(the shared control plane, api as the admin in ``ns``, the admin's kubeconfig)."""
    api = Api(control_plane.url, control_plane.api(timeout=10), ns=ns)
    yield control_plane, api, control_plane.kubeconfig
    api.client.close()


@pytest.fixture
def real_operator(
    real_cluster: tuple[ControlPlane, Api, Path], ns: str, prometheus: PrometheusServer, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """``real_operator(**flags)``: the operator process against the real control plane, watching
    ``ns``, as its admin (or as ``kubeconfig=`` says, e.g. ``ControlPlane.user_kubeconfig``, an
    admin of its own name)."""
    started: list[OperatorProcess] = []
    (tmp_path / "store").mkdir()

    def start(kubeconfig: Path | None = None, **flags: Any) -> OperatorProcess:
        flags.setdefault("namespace", ns)
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
    real_cluster: tuple[ControlPlane, Api, Path], ns: str, tmp_path: Path, sandboxes_done: Path
) -> Iterator[NodeAgent]:
    """A node agent on the real control plane whose containers are stand-ins: the real Deployment
    and ReplicaSet controllers then report the operator's Deployments ready, and the real Job
    controller completes a sandbox Job once ``sandboxes_done`` exists. Its node (``node-<ns>``, a
    name no other test's node had) is removed afterwards, with the pods still bound to it."""
    node = f"node-{ns}"
    agent = NodeAgent(real_cluster[0].node_kubeconfig(node), node, tmp_path / "node",
                      stand_in=_stand_in(sandboxes_done)).start()  # fmt: skip
    yield agent
    agent.close()
    real_cluster[0].remove_node(node)


@pytest.fixture
def engines(prometheus: PrometheusServer, ns: str) -> Iterator[Callable[..., FakeEngine]]:
    """``engines(md, track, build)``: a fake engine pod scraped by Prometheus with ``namespace=<ns>``."""
    made: list[FakeEngine] = []

    def make(md: str, track: str, build: str) -> FakeEngine:
        engine = FakeEngine(md, track, build)
        prometheus.add_target(engine.address, namespace=ns)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        prometheus.remove_target(engine.address)
        engine.close()
