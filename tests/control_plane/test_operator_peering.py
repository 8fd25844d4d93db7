"""Two operator replicas with kopf peering, installed by the chart on the real control plane:
exactly one acts, and when it stops the standby takes over.

``helm install`` with ``replicas: 2`` puts the chart's peering into the real API server: kopf's
peering CRD and the peering object (a post-install hook, created once the CRD is served), with
the rules for it in the chart's RBAC. Both install modes run: cluster-wide (a ClusterRole and a
ClusterKopfPeering) and one watched namespace (a Role and a KopfPeering there). The chart's own
pods have no node here; the two replicas run as local processes, as the chart's ServiceAccount
with a token from the TokenRequest API. kopf pauses a replica that sees a live peer of higher
*or equal* priority, so each process takes its own (random) priority.

The API server's audit log then holds every call of that ServiceAccount: the authorizer refused
none, each is one the chart's rendered bindings grant, and what the chart grants beyond the
watched-namespace rows (CRD scanning, the peering object) was used; test_operator_loop measures
the watched rows.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from charts.chart_rbac import audit, audited_calls, effective_permissions, forbidden, rbac_table
from support import yamls
from support.control_plane import ControlPlane
from support.operator_process import OperatorProcess
from support.prometheus import PrometheusServer
from support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
RECONCILES = "polymorph_operator_reconciles_total"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def deployment(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": namespace},
        "spec": {"model": {"uri": "tiny"}, "hardware": {"accelerator": "cpu"}, "replicas": 2,
                 "recompile": {"enabled": False}},
    }  # fmt: skip


@pytest.fixture(params=["cluster-wide", "namespaced"])
def mode(request: pytest.FixtureRequest) -> str:
    result: str = request.param
    return result


@pytest.fixture
def installed(
    mode: str, kubectl: Kubectl, helm: Callable[..., str], crds: None
) -> Iterator[tuple[str, str, str]]:
    """(release name, release namespace, watched namespace) of the chart with two replicas."""
    tag = uuid.uuid4().hex[:6]
    release, home, watched = f"peer-{tag}", f"peer-{tag}", f"watched-{tag}"
    kubectl("create", "namespace", home)
    kubectl("create", "namespace", watched)
    values = ["--set", "replicas=2"]
    if mode == "namespaced":
        values += ["--set-json", f"watchNamespaces={json.dumps([watched])}"]
    helm("install", release, str(REPO / "charts" / "polymorph"), "-n", home, *values)
    yield release, home, watched
    helm("uninstall", release, "-n", home)
    kubectl("delete", "namespace", home, watched, "--wait=false")
    # The chart keeps kopf's peering CRD on uninstall; the control plane is shared with
    # tests/operator, whose peering test starts with none, so it is deleted here (and waited for).
    crd = "clusterkopfpeerings.kopf.dev" if mode == "cluster-wide" else "kopfpeerings.kopf.dev"
    kubectl("delete", "crd", crd, "--timeout=60s")


def test_two_replicas_one_acts_and_the_standby_takes_over(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    helm: Callable[..., str],
    installed: tuple[str, str, str],
    mode: str,
    prometheus: PrometheusServer,
    tmp_path: Path,
) -> None:
    release, home, watched = installed
    account = f"{release}-polymorph"
    peering = (
        ["clusterkopfpeering", "polymorph"]
        if mode == "cluster-wide"
        else ["kopfpeering", "polymorph", "-n", watched]
    )
    kubectl("get", *peering)  # the chart's post-install hook made it
    token = kubectl("create", "token", account, "-n", home, "--duration=1h").stdout.strip()
    username = f"system:serviceaccount:{home}:{account}"
    config = control_plane.kubeconfig_with_token(tmp_path / "operator.kubeconfig", token, user=username)
    (tmp_path / "store").mkdir()
    # helm applies the chart's CRDs again, and the API server then rebuilds their storage for a
    # few seconds, answering lists with 429 "storage is (re)initializing". A replica whose first
    # list is retried through that window can finish it after it paused for its peer, and act
    # once on what it lists (seen under load): so the replicas start once the resources are served.
    for resource in ("modeldeployments", "compilejobs"):
        wait_for(
            f"{resource} served", lambda r=resource: kubectl("get", r, "-A", check=False).returncode == 0
        )
    replicas = {
        pod: OperatorProcess(
            config, prometheus.url, tmp_path / "store", tmp_path / f"operator-{pod}.log",
            namespace=watched if mode == "namespaced" else None, standalone=False, pod_id=pod,
            env={"PYTHONPATH": str(REPO / "tests")},
        ).start(timeout=60)
        for pod in ("replica-a", "replica-b")
    }  # fmt: skip
    try:

        def peers() -> dict[str, Any]:
            got = json.loads(kubectl("get", *peering, "-o", "json").stdout)
            return dict(got.get("status") or {})

        def stable_replicas() -> int | None:
            got = kubectl(
                "get", "deployment", "chat", "-n", watched, "-o", "jsonpath={.spec.replicas}", check=False
            )
            return int(got.stdout) if got.returncode == 0 and got.stdout else None

        seen = wait_for("both replicas in the peering", lambda: len(peers()) == 2 and peers(), timeout=60)
        priorities = {pod: int(info["priority"]) for pod, info in seen.items()}
        assert set(priorities) == set(replicas) and len(set(priorities.values())) == 2, priorities
        active = max(priorities, key=priorities.__getitem__)
        standby = next(pod for pod in replicas if pod != active)
        # Cluster-wide, objects of other tests may exist: a replica can act on them before it sees
        # its peer. From here on the standby decides nothing.
        paused_at = replicas[standby].metric_total(RECONCILES)

        kubectl("apply", "-f", "-", stdin=json.dumps(deployment(watched)))
        wait_for("the stable Deployment (some replica acts)", lambda: stable_replicas() == 2, timeout=60)
        assert replicas[active].metric_total(RECONCILES) > 0
        assert replicas[standby].metric_total(RECONCILES) == paused_at  # the standby decided nothing

        # The active replica stops (a clean exit takes it out of the peering): the standby resumes.
        replicas[active].stop()
        wait_for("the active replica gone from the peering", lambda: set(peers()) == {standby}, timeout=60)
        kubectl(
            "patch",
            "modeldeployment",
            "chat",
            "-n",
            watched,
            "--type=merge",
            "-p",
            '{"spec": {"replicas": 3}}',
        )
        wait_for("the standby acting on a change", lambda: stable_replicas() == 3, timeout=60)
        assert replicas[standby].metric_total(RECONCILES) > paused_at
        # Deleted while an operator runs: kopf's finalizer goes, so the namespace can go too.
        kubectl("delete", "modeldeployment", "chat", "-n", watched, "--timeout=60s")
    finally:
        for proc in replicas.values():
            proc.stop()

    # RBAC as used: the real authorizer refused nothing; the chart grants every call, and what it
    # grants beyond the watched-namespace rows (measured by test_operator_loop) this scenario used.
    requests = control_plane.audit(username)
    assert requests and forbidden(requests) == []
    docs = [d for d in yamls.load_all(helm("get", "manifest", release, "-n", home)) if d]
    refused, unused = audit(effective_permissions(docs, account, home), audited_calls(requests))
    assert refused == [], refused
    watched_rows = {use for row in rbac_table() if row.where == "watched" for use in row.uses()}
    assert unused <= watched_rows, sorted(unused - watched_rows)
