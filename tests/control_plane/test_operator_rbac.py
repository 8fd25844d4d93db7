"""The operator under the chart's RBAC on the real control plane: the authorizer denies it nothing.

``helm install`` puts ``charts/polymorph`` (watching one namespace: a Role and RoleBinding there,
nothing cluster-scoped) into the real control plane. The operator runs as a local process (the
chart's own pod has no node here) as the chart's ServiceAccount, through a kubeconfig that holds
a token from the TokenRequest API, so kube-apiserver's RBAC authorizer decides every call it
makes. A ModelDeployment and a CompileJob are applied; the operator makes their children
(Service, Deployment, ConfigMap, Job) and writes their status and Events; both are deleted,
and the operator lets them go. The API server's
audit log then shows every request of the ServiceAccount: none was forbidden, and each is one
that the chart's rendered bindings grant.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from charts.chart_rbac import audit, audited_calls, effective_permissions, forbidden
from support import yamls
from support.control_plane import ControlPlane
from support.operator_process import OperatorProcess
from support.prometheus import PrometheusServer
from support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "crds" / "examples"
RELEASE = "pm"
ACCOUNT = "pm-polymorph"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def manifest(name: str, namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = yamls.load((EXAMPLES / name).read_text())
    doc["metadata"]["namespace"] = namespace
    return doc


@pytest.fixture
def release(
    kubectl: Kubectl, helm: Callable[..., str], crds: None, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """(the release namespace, the watched namespace) of a ``helm install`` of the chart."""
    tag = uuid.uuid4().hex[:6]
    home, watched = f"pm-{tag}", f"w-{tag}"
    kubectl("create", "namespace", home)
    kubectl("create", "namespace", watched)
    chart = str(REPO / "charts" / "polymorph")
    helm("install", RELEASE, chart, "-n", home, "--set-json", f"watchNamespaces={json.dumps([watched])}")
    (tmp_path / "manifest.yaml").write_text(helm("get", "manifest", RELEASE, "-n", home))
    yield home, watched
    kubectl("delete", "namespace", home, watched, "--wait=false")


def test_the_operator_is_denied_nothing_under_the_charts_rbac(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    release: tuple[str, str],
    prometheus: PrometheusServer,
    tmp_path: Path,
) -> None:
    home, watched = release
    token = kubectl("create", "token", ACCOUNT, "-n", home, "--duration=1h").stdout.strip()
    username = f"system:serviceaccount:{home}:{ACCOUNT}"
    config = control_plane.kubeconfig_with_token(tmp_path / "operator.kubeconfig", token, user=username)
    (tmp_path / "store").mkdir()
    operator = OperatorProcess(
        config, prometheus.url, tmp_path / "store", tmp_path / "operator.log", namespace=watched,
        env={"PYTHONPATH": str(REPO / "tests")},
    ).start(timeout=60)  # fmt: skip
    try:
        kubectl("apply", "-f", "-", stdin=json.dumps(manifest("modeldeployment-minimal.yaml", watched)))
        kubectl("apply", "-f", "-", stdin=json.dumps(manifest("compilejob-standalone.yaml", watched)))

        def made() -> bool:
            names = kubectl("get", "deploy,svc,jobs,configmaps", "-n", watched, "-o", "name").stdout.split()
            return {
                "deployment.apps/qwen-0-5b",
                "service/qwen-0-5b",
                "job.batch/tiny-llama-cpu-search",
            } <= set(names)

        wait_for("the operator's children", made, timeout=90)
        phase = "jsonpath={.status.phase}"
        wait_for("the ModelDeployment's status", lambda: kubectl("get", "modeldeployments", "qwen-0-5b", "-n",
                 watched, "-o", phase).stdout, timeout=60)  # fmt: skip
        wait_for("the CompileJob's status", lambda: kubectl("get", "compilejobs", "tiny-llama-cpu-search", "-n",
                 watched, "-o", phase).stdout, timeout=60)  # fmt: skip
        events = kubectl("get", "events", "-n", watched, "-o", "jsonpath={.items[*].reason}").stdout.split()
        assert events, "the operator recorded no Event"
        # Deleted while the operator runs: kopf's finalizers go, and the namespace can go too. With
        # a parallel test worker on the same two cores, the CompileJob's deletion once took over a
        # minute: the wait is generous.
        kubectl("delete", "compilejob", "tiny-llama-cpu-search", "-n", watched, "--timeout=180s")
        kubectl("delete", "modeldeployment", "qwen-0-5b", "-n", watched, "--timeout=180s")
    finally:
        operator.stop()

    requests = control_plane.audit(username)
    assert requests, f"no audited request of {username}"
    assert forbidden(requests) == []
    docs = [d for d in yamls.load_all((tmp_path / "manifest.yaml").read_text()) if d]
    refused, _unused = audit(effective_permissions(docs, ACCOUNT, home), audited_calls(requests))
    assert refused == [], refused
    assert "Forbidden" not in (tmp_path / "operator.log").read_text()
