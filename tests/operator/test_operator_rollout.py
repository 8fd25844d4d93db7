"""Rollouts through the real operator process on the real control plane: a slower canary rolls back;
Prometheus stopped mid-rollout gives no decision and Degraded (once), then the rollout resumes;
SIGKILL mid-rollout and a restart continue without repeating a step; a manual approval, then an
abort. The real Deployment and ReplicaSet controllers report the operator's Deployments ready from
pods that a node agent runs (readiness stand-ins); the engines' metrics come from FakeEngine."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from documents import NEW, SLOW, figures
from operator_harness import GROUP, Api, FakeEngine, OperatorProcess, wait_for

from support.control_plane import ControlPlane
from support.node_agent import NodeAgent
from support.prometheus import PrometheusServer


def deployment(
    ns: str, on_failure: str = "Rollback", pause: str = "3s", policy: str = "Auto"
) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {
            "model": {"uri": "tiny"},
            "hardware": {"accelerator": "cpu"},
            "replicas": 4,
            "recompile": {"enabled": False},
            "build": {"policy": policy},
            "rollout": {
                "steps": [{"weight": 25, "pause": pause}, {"weight": 50, "pause": pause}],
                "analysis": {"interval": "2s", "failureLimit": 1},
                "onFailure": on_failure,
            },
        },
    }


def status(api: Api) -> dict[str, Any]:
    return (api.md("chat") or {}).get("status") or {}


def state(api: Api) -> dict[str, Any]:
    """``status.rollout``: the one record of the rollout, which the operator resumes from."""
    st = status(api)
    assert set(st.get("polymorph") or {}) <= {"seq"}, st["polymorph"]  # no second, untyped copy
    return st.get("rollout") or {}


def hand_over(api: Api, build: str) -> None:
    """What a Succeeded CompileJob does (covered end to end in test_operator_loop): a candidate build."""
    candidate = {"id": build, "uri": f"file:///store/{build}", "figures": figures(130).model_dump()}
    api.patch(
        f"{GROUP}/namespaces/{api.ns}/modeldeployments/chat/status", {"status": {"candidateBuild": candidate}}
    )


def start(
    api: Api, engines: Callable[..., FakeEngine], canary_itl: float, build: str = NEW, **kw: str
) -> None:
    for _ in range(2):
        engines("chat", "stable", "reference").serve(prompt=64, generated=32, itl_s=0.02)
    for _ in range(2):
        engines("chat", "canary", build).serve(prompt=64, generated=32, itl_s=canary_itl)
    api.create(f"{GROUP}/namespaces/{api.ns}/modeldeployments", deployment(api.ns, **kw))
    wait_for("the stable Deployment", lambda: api.deployment("chat"))
    hand_over(api, build)


def test_slower_canary_rolls_back(
    real_cluster: tuple[ControlPlane, Api, Path],
    real_operator: Callable[..., OperatorProcess],
    engines: Callable[..., FakeEngine],
    real_kubelet: NodeAgent,
) -> None:
    _, api, _ = real_cluster
    real_operator()
    start(api, engines, canary_itl=0.04, build=SLOW)  # half the per-request decode speed
    wait_for("the canary", lambda: api.deployment("chat-canary"))
    wait_for("RolledBack", lambda: state(api).get("phase") == "RolledBack", timeout=40)
    assert api.deployment("chat-canary") is None
    stable = api.deployment("chat")
    assert stable is not None and stable["spec"]["replicas"] == 4
    assert stable["spec"]["template"]["metadata"]["annotations"]["polymorph.dev/build-id"] == "reference"
    failed = api.events("AnalysisFailed")
    assert (
        len(failed) == 2
        and "throughput 0.5" in failed[0]["message"]
        and "(min 0.98): Fail" in failed[0]["message"]
    )
    st = status(api)
    assert st["activeBuild"]["id"] == "reference" and st["history"][-1]["outcome"] == "RolledBack"
    assert st["rollout"]["phase"] == "RolledBack" and st["rollout"]["fromBuild"] == "reference"
    assert st["rollout"]["target"] == "RolledBack" and "analysis failed 2 times" in st["rollout"]["reason"]
    values = {v["name"]: v for v in st["rollout"]["analysis"]}
    assert values["throughput"]["min"] == 0.98 and values["throughput"]["verdict"] == "Fail"
    assert values["throughput"]["value"] < 0.6
    # At most one sample per serving pod (2 per track). A pod can have none in a run: a rate over
    # the 2 s interval needs two of the 1 s scrapes inside it, and on a loaded machine a late
    # scrape leaves one (seen once: stable 1).
    samples = values["throughput"]["samples"]
    assert 1 <= samples["canary"] <= 2 and 1 <= samples["stable"] <= 2, samples
    assert len(api.events("RolledBack")) == 1
    time.sleep(2)  # the same candidate is not rolled out again
    assert api.deployment("chat-canary") is None and len(api.events("CanaryStep")) == 1


def test_prometheus_outage_and_operator_kill_mid_rollout(
    real_cluster: tuple[ControlPlane, Api, Path],
    real_operator: Callable[..., OperatorProcess],
    engines: Callable[..., FakeEngine],
    real_kubelet: NodeAgent,
    prometheus: PrometheusServer,
) -> None:
    _, api, _ = real_cluster
    op = real_operator()
    start(api, engines, canary_itl=0.015)
    wait_for("step 1 settled", lambda: state(api).get("stepStartedAt"), timeout=30)

    # Prometheus goes away before the step's first analysis: no decision, Degraded once.
    prometheus.stop()
    wait_for("Degraded", lambda: any(c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "PrometheusUnavailable" for c in status(api).get("conditions", [])), timeout=20)  # fmt: skip
    time.sleep(4)  # longer than the step's pause and two analysis intervals
    s = state(api)
    assert (
        s["phase"] == "Progressing" and s["step"] == 0 and s.get("lastVerdict") is None and s["failures"] == 0
    )
    assert api.events("AnalysisPassed") == [] and api.events("AnalysisFailed") == []
    assert len(api.events("Degraded")) == 1
    assert status(api)["phase"] == "Degraded"

    # Prometheus is back: Recovered, then analysis passes and the rollout goes on to step 2.
    prometheus.start()
    wait_for("step 2", lambda: state(api).get("step") == 1, timeout=40)
    assert len(api.events("Recovered")) == 1 and len(api.events("Degraded")) == 1
    degraded = next(c for c in status(api)["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"

    # SIGKILL mid-step-2, restart: it continues from status, without repeating the step.
    wait_for("step 2 settled", lambda: state(api).get("stepStartedAt"), timeout=20)
    op.kill()
    before = len(api.events("CanaryStep"))
    op.start()
    wait_for(
        "promotion after the restart", lambda: status(api).get("activeBuild", {}).get("id") == NEW, timeout=40
    )
    steps = [e["message"] for e in api.events("CanaryStep")]
    assert before == 2 and len(steps) == 2, steps
    assert len(api.events("Promoted")) == 1
    assert status(api)["history"][-1]["outcome"] == "Promoted"


def test_manual_approval_then_abort(
    real_cluster: tuple[ControlPlane, Api, Path],
    real_operator: Callable[..., OperatorProcess],
    engines: Callable[..., FakeEngine],
    real_kubelet: NodeAgent,
) -> None:
    _, api, _ = real_cluster
    real_operator()
    start(api, engines, canary_itl=0.015, policy="Manual", pause="1h")
    waiting = wait_for("WaitingForApproval", lambda: api.events("WaitingForApproval"))
    assert f"polymorph.dev/approve={NEW}" in waiting[0]["message"]
    time.sleep(2)
    assert api.deployment("chat-canary") is None and len(api.events("WaitingForApproval")) == 1
    path = f"{GROUP}/namespaces/{api.ns}/modeldeployments/chat"
    api.patch(path, {"metadata": {"annotations": {"polymorph.dev/approve": NEW}}})
    canary = wait_for("the approved canary", lambda: api.deployment("chat-canary"))
    assert canary["spec"]["replicas"] == 1
    # polymorph.dev/abort: "true" ends it: stable back to all replicas, the canary removed.
    api.patch(path, {"metadata": {"annotations": {"polymorph.dev/abort": "true"}}})
    wait_for("Aborted", lambda: state(api).get("phase") == "Aborted", timeout=20)
    wait_for("the canary removed", lambda: api.deployment("chat-canary") is None)
    assert (api.deployment("chat") or {})["spec"]["replicas"] == 4
    assert (
        status(api)["history"][-1]["outcome"] == "Aborted" and status(api)["activeBuild"]["id"] == "reference"
    )
    assert len(api.events("Aborted")) == 1
