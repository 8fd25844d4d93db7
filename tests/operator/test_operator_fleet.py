"""The fleet drift cycle at 500 deployments: a fixed number of PromQL queries, however large the fleet.

The cycle runs in-process against the real control plane (``real_cluster``: the status writes and
CompileJobs go through the real API server, its schema and CEL rules); the Prometheus seam is a
plain function answering the three profile queries for every deployment, which also counts what
it is asked. The real-Prometheus, real-process version is bench/fleet_drift.py: the last test runs
it on a fleet of three, on a control plane it starts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from operator_harness import GROUP, REPO, Api

from polymorph.clients.kube import KubeClient, load_configuration
from polymorph.clients.prometheus import CountingQuery, PrometheusUnavailable
from polymorph.contract.store import LocalStore
from polymorph.core.promql import Series
from polymorph.core.resources import ClusterSettings
from polymorph.handlers.context import AnalysisCache, Context, Health
from polymorph.handlers.fleet import drift_cycle
from polymorph.handlers.observability import OperatorMetrics
from polymorph.handlers.settings import OperatorConfig
from support.control_plane import ControlPlane
from support.control_plane_build import VERSION

SHORT = {
    "inputTokens": {"bounds": [64], "counts": [100]},
    "outputTokens": {"bounds": [32], "counts": [100]},
    "concurrency": 2,
}


def body(ns: str, i: int, window: str) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": f"md-{i:03d}", "namespace": ns},
        "spec": {"model": {"uri": "tiny"}, "hardware": {"accelerator": "cpu"},
                 "recompile": {"window": window, "minRequests": 10, "cooldown": "6h"}},
    }  # fmt: skip


def answers(ns: str, drifted: set[str], names: list[str], asked: list[str]) -> Any:
    def query(promql: str) -> list[Series]:
        asked.append(promql)
        out: list[Series] = []
        for name in names:
            labels = {"namespace": ns, "model_deployment": name}
            if "prompt_tokens_bucket" in promql:
                le = 4096.0 if name in drifted else 64.0
                out += [({**labels, "le": str(le)}, 100.0), ({**labels, "le": "+Inf"}, 100.0)]
            elif "generation_tokens_bucket" in promql:
                out += [({**labels, "le": "32.0"}, 100.0), ({**labels, "le": "+Inf"}, 100.0)]
            else:
                out.append((labels, 2.0))
        return out

    return query


@pytest.fixture
def fleet(
    real_cluster: tuple[ControlPlane, Api, Path], ns: str
) -> tuple[Api, dict[tuple[str, str], list[dict[str, Any]]]]:
    _, api, _ = real_cluster
    index: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for i in range(500):
        created = api.create(
            f"{GROUP}/namespaces/{ns}/modeldeployments", body(ns, i, "1m" if i % 2 else "5m")
        )
        tuned = {"activeBuild": {"id": "reference", "profile": SHORT}}
        created = api.patch(
            f"{GROUP}/namespaces/{ns}/modeldeployments/{created['metadata']['name']}/status",
            {"status": tuned},
        )
        index[(ns, created["metadata"]["name"])] = [created]
    return api, index


def context(kubeconfig: Path, ns: str, query: Any, tmp_path: Path) -> Context:
    config = OperatorConfig(namespaces=(ns,), all_namespaces=False, prometheus_url="http://unused", store=str(tmp_path),
                            drift_interval_s=60, cluster=ClusterSettings(store=str(tmp_path)))  # fmt: skip
    metrics = OperatorMetrics()
    return Context(config=config, kube=KubeClient(load_configuration(str(kubeconfig))), query=CountingQuery(query, metrics.on_query),
                   store=LocalStore(tmp_path), metrics=metrics, health=Health(), analysis=AnalysisCache(30))  # fmt: skip


def test_500_deployments_take_six_queries_for_two_windows(
    real_cluster: tuple[ControlPlane, Api, Path],
    fleet: tuple[Api, dict[tuple[str, str], list[dict[str, Any]]]],
    tmp_path: Path,
    ns: str,
) -> None:
    api, index = fleet
    names = [key[1] for key in index]

    # Prometheus down first: no data, so no decision and no write (one query tried, then the cycle stops).
    def down(_: str) -> list[Series]:
        raise PrometheusUnavailable("Prometheus at http://x is unreachable: ConnectionError")

    ctx = context(real_cluster[2], ns, down, tmp_path)
    report = asyncio.run(drift_cycle(ctx, index, {}))
    assert report.error is not None and report.queries == 1 and report.written == 0 and report.opened == 0
    assert ctx.health.prometheus_error is not None and api.compilejobs() == []

    # Prometheus answers: 3 profile queries per distinct window, whatever the fleet's size.
    drifted = set(names[:10])
    asked: list[str] = []
    ctx = context(real_cluster[2], ns, answers(ns, drifted, names, asked), tmp_path)
    report = asyncio.run(drift_cycle(ctx, index, {}))
    assert report.deployments == 500
    assert report.queries == 6 == len(asked)  # 3 profile queries x 2 distinct windows
    assert {q.split("[")[-1].split("]")[0] for q in asked} == {"1m", "5m"}
    assert report.opened == 10 and report.written == 500
    assert len(api.compilejobs()) == 10
    scores = {api.md(n)["status"]["drift"]["score"] for n in (names[0], names[-1])}  # type: ignore[index]
    assert scores == {1.0, 0.0}


def test_the_fleet_benchmark_runs_on_a_real_control_plane(tmp_path: Path) -> None:
    """bench/fleet_drift.py starts the control plane, Prometheus and the operator, and measures."""
    out = tmp_path / "fleet.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fleet_drift.py"), "--deployments", "3", "--drifted", "1",
         "--cycles", "1", "--drift-interval", "1", "--scrape-interval", "1s", "--timeout", "100",
         "--out", str(out)],
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["versions"]["kubernetes"] == VERSION and doc["deployments"] == 3
    assert doc["queries_per_cycle"] == [3] and doc["steady_cycle_s"]["n"] == 1
    assert doc["first_cycle_status_writes"] == 3 and doc["first_cycle_compilejobs_opened"] == 1
    assert doc["steady_cycle_status_writes"] == [0] and doc["compilejobs"] == 1
    assert doc["drift_score_of_a_drifted_and_a_steady_deployment"] == [1.0, 0.0]
    assert doc["operator_prometheus_errors"] == 0.0
