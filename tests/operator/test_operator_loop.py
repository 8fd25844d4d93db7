"""The whole loop through the real operator process, the real control plane and a real Prometheus:
traffic shift -> exactly one CompileJob (cooldown honoured) -> Job -> store progress -> status ->
success -> canary steps with the right replica counts -> passing analysis -> promotion. The real
Job controller runs the sandbox Job, whose pods a node agent runs as stand-ins that finish once
the test has written the campaign's documents; the real Deployment and ReplicaSet controllers
report the Deployments ready from stand-ins that answer their readiness probes (the engines'
metrics come from FakeEngine). The operator runs as an identity of its own, so the API server's
audit log holds its requests alone: they are the measure of the chart's RBAC in a namespaced
install (tests/control_plane/test_operator_peering.py covers the cluster-wide and peering rows)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from documents import NEW, progress, result
from operator_harness import GROUP, Api, FakeEngine, OperatorProcess, audit_against_chart, wait_for

from charts.chart_rbac import audited_calls, documented_unexercised, forbidden, rbac_table
from polymorph.contract.api import WorkloadProfile
from polymorph.contract.store import LocalStore, progress_key, result_key
from support.control_plane import ControlPlane
from support.node_agent import NodeAgent

OPERATOR = "polymorph-operator"
"""The operator's own identity on the control plane (an admin of its own name), suffixed here with
the test's namespace: the audit log is the shared control plane's, and holds every test's requests."""


def chat(ns: str) -> dict[str, Any]:
    """The ModelDeployment the test applies, in ``ns``."""
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {
            "model": {"uri": "tiny"},
            "hardware": {"accelerator": "cpu"},
            "replicas": 4,
            "recompile": {"window": "10s", "minRequests": 20, "cooldown": "1h",
                          "compile": {"budget": {"maxExperiments": 10, "sandboxes": 2, "deadline": "1h"}}},
            "rollout": {
                "steps": [{"weight": 25, "pause": "3s"}, {"weight": 50, "pause": "3s"}],
                "analysis": {"interval": "3s", "failureLimit": 1},
            },
        },
    }  # fmt: skip


def status(api: Api) -> dict[str, Any]:
    return (api.md("chat") or {}).get("status") or {}


def build_of(deployment: dict[str, Any] | None) -> str | None:
    if deployment is None:
        return None
    return deployment["spec"]["template"]["metadata"]["annotations"]["polymorph.dev/build-id"]


def test_drift_compile_canary_promote(
    real_cluster: tuple[ControlPlane, Api, Path],
    real_operator: Callable[..., OperatorProcess],
    engines: Callable[..., FakeEngine],
    real_kubelet: NodeAgent,
    sandboxes_done: Path,
    tmp_path: Path,
    ns: str,
) -> None:
    control_plane, api, _ = real_cluster
    identity = f"{OPERATOR}-{ns}"
    op = real_operator(kubeconfig=control_plane.user_kubeconfig(identity))
    for _ in range(2):
        engines("chat", "stable", "reference").serve(prompt=64, generated=32, itl_s=0.02)
    api.create(f"{GROUP}/namespaces/{ns}/modeldeployments", chat(ns))

    # Traffic the reference build was never tuned for: drift 1, exactly one CompileJob.
    jobs = wait_for("a CompileJob", api.compilejobs, timeout=40)
    assert len(jobs) == 1
    cj = jobs[0]
    name, uid = cj["metadata"]["name"], cj["metadata"]["uid"]
    assert cj["metadata"]["ownerReferences"][0]["name"] == "chat"
    assert cj["spec"]["deploymentRef"] == {"name": "chat"} and cj["spec"]["budget"]["sandboxes"] == 2
    live = WorkloadProfile.model_validate(cj["spec"]["workload"]["profile"])
    assert live.inputTokens.bounds[0] == 64 and live.concurrency == 2
    st = wait_for("drift in status", lambda: status(api).get("drift") and status(api))
    assert st["drift"]["score"] == 1.0 and st["lastCompileJob"]["name"] == name
    assert st["trafficProfile"]["requests"] >= 20
    drift_events = api.events("DriftDetected")
    assert len(drift_events) == 1 and "drift 1.00 >= 0.25" in drift_events[0]["message"]
    assert len(api.events("CompileJobCreated")) == 1

    # The CompileJob's ConfigMap and Indexed Job.
    job = wait_for("the sandbox Job", lambda: api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}"))
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] == 2
    assert api.get(f"/api/v1/namespaces/{ns}/configmaps/{name}-spec") is not None
    wait_for("both sandbox pods started by the Job controller", lambda: (api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}") or {}).get("status", {}).get("active") == 2, timeout=30)  # fmt: skip

    # Cooldown: more drift cycles, still one job.
    time.sleep(2)
    assert len(api.compilejobs()) == 1 and len(api.events("DriftDetected")) == 1

    # The sandboxes' progress in the store -> CompileJob status.
    store = LocalStore(tmp_path / "store")
    store.put_json(
        progress_key(ns, name, uid, 0), progress(0, 2, "running", 3, NEW, 120).model_dump(mode="json")
    )
    store.put_json(
        progress_key(ns, name, uid, 1), progress(1, 2, "running", 2, None, 0).model_dump(mode="json")
    )
    cj_status = wait_for(
        "progress in CompileJob status",
        lambda: (s := (api.get(f"{GROUP}/namespaces/{ns}/compilejobs/{name}") or {}).get("status", {})).get("experiments", {}).get("total") == 5 and s,
    )  # fmt: skip
    assert cj_status["phase"] == "Running"
    assert [(s["index"], s["experiments"]) for s in cj_status["sandboxes"]] == [(0, 3), (1, 2)]
    assert cj_status["best"]["build"] == NEW

    # Success: result.json, then the sandboxes' agents exit 0 and the Job controller completes the
    # Job -> Succeeded, candidateBuild, a canary at 25%.
    store.put_json(
        result_key(ns, name, uid),
        result(NEW, 130, live, "file:///store/builds/x.tar.gz").model_dump(mode="json"),
    )
    sandboxes_done.touch()
    wait_for("the Job complete", lambda: (api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}") or {}).get("status", {}).get("succeeded") == 2, timeout=60)  # fmt: skip
    wait_for("candidateBuild", lambda: (status(api).get("candidateBuild") or {}).get("id") == NEW, timeout=30)
    assert len(api.events("CompileJobSucceeded")) >= 1
    canary = wait_for("the canary Deployment", lambda: api.deployment("chat-canary"))
    assert build_of(canary) == NEW and canary["spec"]["replicas"] == 1
    assert canary["spec"]["template"]["metadata"]["labels"]["polymorph.dev/track"] == "canary"
    wait_for(
        "stable at 3 once the canary is ready",
        lambda: (api.deployment("chat") or {})["spec"]["replicas"] == 3,
    )
    for _ in range(2):
        engines("chat", "canary", NEW).serve(prompt=64, generated=32, itl_s=0.015)  # faster per request

    # Analysis passes -> step 2 (2 + 2) -> promotion.
    wait_for(
        "step 2",
        lambda: (api.deployment("chat-canary") or {}).get("spec", {}).get("replicas") == 2,
        timeout=30,
    )
    wait_for("stable at 2", lambda: (api.deployment("chat") or {})["spec"]["replicas"] == 2)
    passed = api.events("AnalysisPassed")
    assert passed and "throughput 1.33" in passed[0]["message"] and "(min 0.98): Pass" in passed[0]["message"]
    wait_for("promotion", lambda: status(api).get("activeBuild", {}).get("id") == NEW, timeout=30)
    wait_for("the canary removed", lambda: api.deployment("chat-canary") is None)
    stable = api.deployment("chat")
    assert build_of(stable) == NEW and stable is not None and stable["spec"]["replicas"] == 4
    final = status(api)
    assert final["history"][-1]["outcome"] == "Promoted" and final["history"][-1]["build"] == NEW
    assert final["activeBuild"]["profile"] == live.model_dump(mode="json")
    assert final["activeBuild"]["figures"]["outputTokensPerSecond"] == 130
    steps = sorted(e["message"] for e in api.events("CanaryStep"))  # Events list by name, not time
    assert len(steps) == 2 and steps[0].startswith("step 1/2") and steps[1].startswith("step 2/2")
    assert len(api.events("Promoted")) == 1
    assert op.metric("polymorph_operator_drift_cycle_queries") == 3

    # The operator never wrote the spec (kopf's finalizer and status do not bump the generation).
    assert (api.md("chat") or {})["metadata"]["generation"] == 1
    # RBAC exactly as used: the chart installed for this namespace grants every call the operator
    # made (kopf's and the kubernetes client's, as the audit log records them), and every
    # permission it grants was used, except those its RBAC table lists as unexercised with the reason.
    op.stop()  # its watches end, so the audit log has every request's last stage
    requests = control_plane.audit(identity)
    assert requests and forbidden(requests) == []
    unused = audit_against_chart(audited_calls(requests), {"watchNamespaces": [ns]})
    assert unused == documented_unexercised(rbac_table()), unused
