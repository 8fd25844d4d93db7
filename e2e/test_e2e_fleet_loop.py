"""The whole loop, end to end, on the real Kubernetes control plane; only the kubelet stands in.

Real ``kubectl`` applies the CRDs and a ModelDeployment to the real kube-apiserver; ``helm``
installs the chart; the real ``polymorph operator`` process runs as the chart's ServiceAccount
under RBAC; the upstream Deployment, ReplicaSet and Job controllers make the pods and the node
agent runs them as processes of the real engine entrypoints (tiny CPU model); the real
Prometheus scrapes them; S3 is moto's server; a traffic generator sends completions and shifts
the workload shape. Afterwards, the API server's audit log shows that RBAC refused the operator
nothing and that the chart grants what it used.

The one scenario (``scenario.py``): a pin never compiles or rolls out -> the shift and the pin
removed -> drift -> CompileJob -> sandbox experiments (SearchAgent, hot reload) -> best build in
S3 -> canary at 33% and 66% -> analysis on live metrics -> promotion; drift back against the
promoted build's profile held by the cooldown; ``policy: Manual`` never rolls out unapproved;
approved, a candidate compiled from a deliberately slowed base fails analysis and rolls back.
Asserts the final state, the status fields and the ordered Events with their numbers; then
every query of the chart's Grafana dashboard (``dashboard.py``) returns data from this run's
Prometheus, which scrapes the operator as well as the engines.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dashboard
from charts.chart_rbac import (
    audit,
    audited_calls,
    documented_unexercised,
    effective_permissions,
    forbidden,
    rbac_table,
)
from harness import RELEASE, RELEASE_NS, Fleet
from scenario import MD, Scenario
from support import yamls

pytestmark = pytest.mark.slow
BUILD = re.compile(r"^sha256:[0-9a-f]{64}$")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """The fleet, its process logs in ``tmp_path`` (or in ``$E2E_WORKDIR``, kept for reading)."""
    workdir = Path(os.environ.get("E2E_WORKDIR") or tmp_path)
    workdir.mkdir(parents=True, exist_ok=True)
    with Fleet(workdir) as running:
        yield running


def reasons(events: list[dict[str, Any]]) -> list[str]:
    return [e["reason"] for e in events]


def messages(events: list[dict[str, Any]], reason: str) -> list[str]:
    return [e["message"] for e in events if e["reason"] == reason]


def in_order(seen: list[str], expected: list[str]) -> bool:
    """``expected`` is a subsequence of ``seen``."""
    it = iter(seen)
    return all(any(r == want for r in it) for want in expected)


def test_fleet_loop_promotes_then_rolls_back_a_slower_build(fleet: Fleet) -> None:
    started = time.monotonic()
    lines: list[str] = []

    def say(text: str) -> None:
        lines.append(f"{time.monotonic() - started:6.1f}s {text}")
        print(lines[-1], flush=True)

    story = Scenario(fleet, say)
    try:
        _run(fleet, story)
    except BaseException:
        if fleet.operator is not None:
            print(fleet.operator.tail(40))
        if fleet.node is not None:
            print("node agent errors:", fleet.node.errors[-5:])
        raise
    finally:
        story.close()
    # No bound on the whole run's time: each wait has its own, named in its failure.
    if fleet.control_plane is not None:
        _rbac_as_used(fleet)


def _rbac_as_used(fleet: Fleet) -> None:
    """The real RBAC authorizer refused the operator nothing over the whole scenario, and the
    chart grants exactly what it used, except the verbs its table lists as unexercised, each
    with the reason."""
    requests = fleet.operator_requests()
    assert requests and forbidden(requests) == []
    docs = [d for d in yamls.load_all(fleet.helm("get", "manifest", RELEASE, "-n", RELEASE_NS)) if d]
    refused, unused = audit(effective_permissions(docs, RELEASE, RELEASE_NS), audited_calls(requests))
    assert refused == [], refused
    assert unused == documented_unexercised(rbac_table()), unused


def _run(fleet: Fleet, story: Scenario) -> None:
    since = time.time()
    # 1. Pinned: drift is measured, nothing compiles, nothing rolls out.
    pinned = story.apply_pinned()
    assert pinned["status"]["drift"]["score"] == 1.0
    assert pinned["status"]["activeBuild"]["id"] == story.base
    assert pinned["compilejobs"] == [] and pinned["canary"] is None
    assert "DriftDetected" not in reasons(pinned["events"])
    stable = fleet.deployment(MD)
    assert stable is not None and stable["status"]["readyReplicas"] == 3
    pods = fleet.pods(f"polymorph.dev/model-deployment={MD}")
    assert [p["status"]["phase"] for p in pods] == ["Running"] * 3

    # 2. The shift, the pin removed: drift -> exactly one CompileJob -> its sandbox Job -> a best build in S3.
    compiled = story.shift_and_unpin()
    cj = compiled["compilejob"]
    st = cj["status"]
    assert st["phase"] == "Succeeded", st
    assert cj["metadata"]["ownerReferences"][0]["name"] == MD and cj["spec"]["baseBuild"] == story.base
    profile = cj["spec"]["workload"]["profile"]
    prompts = dict(zip(profile["inputTokens"]["bounds"], profile["inputTokens"]["counts"], strict=True))
    short = sum(count for bound, count in prompts.items() if bound <= 64)
    assert short >= 0.9 * sum(prompts.values()), profile  # compiled for shape B's prompts
    assert st["experiments"]["total"] >= 2 and st["experiments"]["passed"] >= 2
    best = st["best"]
    assert BUILD.match(best["build"]) and best["speedup"] > 1.0, best
    assert st["ledgerUri"].startswith("s3://polymorph-e2e/")
    assert [s["index"] for s in st["sandboxes"]] == [0]
    assert fleet.store.has_build(best["build"]), "the best build is in S3"
    manifest = fleet.store.get_manifest(best["build"])
    assert manifest.parent is not None
    job = fleet.kubectl(
        "-n", "inference", "get", "job", cj["metadata"]["name"], "-o", "jsonpath={.status.succeeded}"
    )
    assert job == "1"

    # 3. Canary at 33% (1 of 3) and 66% (2 of 3), analysis on live metrics, promotion.
    promoted = story.promotion(best["build"])
    status = promoted["status"]
    assert status["activeBuild"]["id"] == best["build"]
    assert status["activeBuild"]["profile"] == profile
    assert status["history"][-1]["outcome"] == "Promoted" and status["history"][-1]["fromBuild"] == story.base
    stable = promoted["stable"]
    assert stable["spec"]["replicas"] == 3 and stable["status"]["readyReplicas"] == 3
    assert stable["spec"]["template"]["metadata"]["annotations"]["polymorph.dev/build-id"] == best["build"]
    events = promoted["events"]
    assert in_order(reasons(events), ["DriftDetected", "CompileJobCreated", "CompileJobSucceeded", "CanaryStep",
                                      "AnalysisPassed", "CanaryStep", "AnalysisPassed", "Promoted"]), reasons(events)  # fmt: skip
    assert reasons(events).count("DriftDetected") == 1 and reasons(events).count("CompileJobCreated") == 1
    assert re.search(r"drift 1\.00 >= 0\.25 over \d+ requests", messages(events, "DriftDetected")[0])
    steps = messages(events, "CanaryStep")
    assert len(steps) == 2
    assert steps[0].startswith("step 1/2") and "(1 of 3 replicas on the canary, 2 stable)" in steps[0]
    assert steps[1].startswith("step 2/2") and "(2 of 3 replicas on the canary, 1 stable)" in steps[1]
    passed = messages(events, "AnalysisPassed")
    ratio = float(re.search(r"throughput ([0-9.]+)", passed[0]).group(1))  # type: ignore[union-attr]
    assert ratio >= 0.9 and "(min 0.9): Pass" in passed[0], passed[0]
    assert messages(events, "Promoted") == [f"{best['build']} now serves all 3 replicas (was {story.base})"]

    # 4. Back to shape A: drift against the promoted build's profile; the cooldown holds the next job.
    back = story.drift_back()
    assert 0.25 <= back["status"]["drift"]["score"] < 1.0, back["status"]["drift"]
    assert len(back["compilejobs"]) == 1

    # 5. Manual: the slowed candidate waits unapproved; approved, it fails analysis and rolls back.
    rolled = story.manual_then_rollback(profile)
    assert rolled["compilejob"]["status"]["phase"] == "Succeeded"
    candidate = rolled["candidate"]
    assert BUILD.match(candidate) and candidate not in (best["build"], rolled["slowed"])
    assert fleet.store.get_manifest(candidate).parent == rolled["slowed"]
    unapproved = rolled["unapproved"]
    assert unapproved["canary"] is None and unapproved["active"] == best["build"]
    assert (
        len(unapproved["waiting"]) == 1
        and f"polymorph.dev/approve={candidate}" in unapproved["waiting"][0]["message"]
    )
    status = rolled["status"]
    assert status["activeBuild"]["id"] == best["build"], "the rollback keeps the promoted build"
    assert status["activeBuild"].get("profile") == profile, (
        "and what it was tuned for",
        status["activeBuild"],
        status.get("drift"),
    )
    assert status["rollout"]["phase"] == "RolledBack"
    assert status["history"][-1]["outcome"] == "RolledBack" and status["history"][-1]["build"] == candidate
    values = {v["name"]: v for v in status["rollout"]["analysis"]}
    assert values["throughput"]["verdict"] == "Fail" and values["throughput"]["value"] < 0.9
    assert values["throughput"]["min"] == 0.9
    stable = rolled["stable"]
    assert stable["spec"]["template"]["metadata"]["annotations"]["polymorph.dev/build-id"] == best["build"]
    assert stable["spec"]["replicas"] == 3
    events = rolled["events"]
    tail = reasons(events)[len(promoted["events"]) :]
    assert in_order(tail, ["CompileJobSucceeded", "WaitingForApproval", "CanaryStep", "AnalysisFailed",
                           "AnalysisFailed", "RolledBack"]), tail  # fmt: skip
    failed = messages(events[len(promoted["events"]) :], "AnalysisFailed")
    # Two failures in a row roll back (failureLimit 1). On two busy shared cores one analysis at
    # the first step can read the slower canary within bounds; the canary then moves on and the
    # failures come at the second step: either way it is the same rule.
    assert len(failed) >= 2 and all("(min 0.9): Fail" in m for m in failed), failed
    assert re.match(r"step ([12]), failure 1 of 2", failed[-2]), failed
    assert failed[-1].startswith(failed[-2].split(",")[0] + ", failure 2 of 2"), failed
    assert len(messages(events, "RolledBack")) == 1 and reasons(events).count("Promoted") == 1

    # 6. Every query of the chart's Grafana dashboard returns data from this run's Prometheus.
    panels = dashboard.capture(
        fleet.prometheus_url, since, time.time(), namespace="inference", model_deployment=MD
    )
    (fleet.workdir / "dashboard-capture.json").write_text(json.dumps(panels))
    assert dashboard.missing(panels) == [], dashboard.missing(panels)

    # What GitOps tools and people see of the loop: every version of the deployment and its
    # CompileJobs that the waits read, through the real kstatus library and the Argo CD health
    # scripts, and the kubectl polymorph plugin (through the real kubectl) on the final state.
    seen = story.gitops_report(fleet.workdir)
    assert seen["problems"] == [], seen["problems"]
    view = seen["json"]
    assert view["rollout"]["phase"] == "RolledBack" and view["kstatus"] == "Failed"
    assert view["activeBuild"]["id"] == best["build"] and view["candidateBuild"]["id"] == candidate
    last = view["lastCompileJob"]
    assert last["name"] == f"{MD}-slowed" and last["phase"] == "Succeeded"
    assert last["leaderboard"][0]["role"] == "best" and last["leaderboard"][0]["build"] == candidate
    text = seen["get"]
    assert f"ModelDeployment inference/{MD}" in text and "RolledBack" in text and "Leaderboard" in text
    assert "threshold >= 0.9" in text and "Fail" in text and candidate[:19] in text
    assert MD in seen["list"] and "RolledBack" in seen["list"]
    # With --store, the leaderboard comes from the CompileJob's ledgers in S3: paired experiments.
    ledger = seen["ledger"]["lastCompileJob"]
    assert ledger["leaderboardFrom"] == "ledger" and ledger["ledgerRecords"] >= 2, ledger
    assert all(r["ci"][0] <= r["speedup"] <= r["ci"][1] and r["pairs"] >= 1 for r in ledger["leaderboard"])
