"""CompileJob decisions and status: drift opens one (threshold, minRequests, cooldown, running, pinned),
its manifest, its resolution for the sandbox, and status from the store's documents and the Job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from polymorph.contract.api import CompileJob, Figures, Histogram, ModelDeployment, Objective, WorkloadProfile
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.documents import (
    CampaignResult,
    Counts,
    Progress,
    ProgressBest,
    ProgressBudget,
    ResultBest,
    Standing,
)
from polymorph.core.compilejobs import (
    JobObservation,
    candidate_from_result,
    compilejob_name,
    compilejob_status,
    drift_decision,
    plan_compilejob,
    resolve,
)

EXAMPLES = Path(__file__).parents[2] / "crds" / "examples"
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
SHORT = WorkloadProfile(
    inputTokens=Histogram(bounds=[128, 512], counts=[100, 0]),
    outputTokens=Histogram(bounds=[64], counts=[100]),
    concurrency=4,
)
LONG = WorkloadProfile(
    inputTokens=Histogram(bounds=[128, 8192], counts=[0, 100]),
    outputTokens=Histogram(bounds=[64], counts=[100]),
    concurrency=4,
)
BUILD = "sha256:" + "ab" * 32


def md(status: dict[str, Any] | None = None, **spec: Any) -> ModelDeployment:
    doc = yaml.safe_load((EXAMPLES / "modeldeployment-full.yaml").read_text())
    doc["metadata"]["uid"] = "uid-md"
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    if status is not None:
        doc["status"] = status
    return ModelDeployment.model_validate(doc)


TUNED = {"activeBuild": {"id": "reference", "profile": SHORT.model_dump()}}


@pytest.mark.parametrize(
    ("deployment", "live", "requests", "opens", "why"),
    [
        (md(TUNED), LONG, 500, True, "drift 1.00 >= 0.25 over 500 requests"),
        (md(TUNED), SHORT, 500, False, "drift 0.00 is below 0.25"),
        (md(TUNED), LONG, 100, False, "100 requests in the window, 200 needed"),
        (md(TUNED), None, 0, False, "no traffic in the window"),
        (md(TUNED, build={"pinned": BUILD}), LONG, 500, False, f"pinned to {BUILD}"),
        (md(TUNED, recompile={"enabled": False}), LONG, 500, False, "recompile.enabled is false"),
        (md({**TUNED, "lastCompileJob": {"name": "j", "phase": "Running", "createdAt": "2026-01-01T00:00:00Z"}}),
         LONG, 500, False, "CompileJob j is still Running"),
        (md({**TUNED, "lastCompileJob": {"name": "j", "phase": "Succeeded", "createdAt": "2026-01-01T09:00:00Z"}}),
         LONG, 500, False, "cooldown 6h since j runs until 2026-01-01T15:00:00+00:00"),
        (md({**TUNED, "lastCompileJob": {"name": "j", "phase": "Failed", "createdAt": "2026-01-01T05:00:00Z"}}),
         LONG, 500, True, "drift 1.00 >= 0.25 over 500 requests"),
        # The reference build was tuned for nothing: any traffic counts as full drift.
        (md(), SHORT, 500, True, "drift 1.00 >= 0.25 over 500 requests"),
    ],
)  # fmt: skip
def test_drift_decision(
    deployment: ModelDeployment, live: WorkloadProfile | None, requests: int, opens: bool, why: str
) -> None:
    decision = drift_decision(deployment, live, requests, NOW)
    assert decision.open is opens
    assert decision.why == why
    if live is not None:
        assert decision.score is not None and 0 <= decision.score <= 1 and decision.reasons


def test_name_is_stable_within_a_cooldown_period() -> None:
    d = md(TUNED)
    assert compilejob_name(d, NOW) == compilejob_name(d, NOW + timedelta(minutes=5))
    assert compilejob_name(d, NOW) != compilejob_name(d, NOW + timedelta(hours=6))
    assert compilejob_name(d, NOW).startswith("llama-8b-chat-")


def test_plan_compilejob_from_the_template() -> None:
    manifest = plan_compilejob(md(TUNED), LONG, NOW)
    job = CompileJob.model_validate(manifest)
    assert job.spec.deploymentRef is not None and job.spec.deploymentRef.name == "llama-8b-chat"
    assert job.spec.workload is not None and job.spec.workload.profile == LONG
    assert job.spec.budget.maxExperiments == 200 and job.spec.gates.minSpeedup == 1.05
    assert job.spec.baseBuild == "reference"
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-md"


def test_resolve_fills_model_hardware_and_live_workload() -> None:
    doc = yaml.safe_load((EXAMPLES / "compilejob-deploymentref.yaml").read_text())
    del doc["spec"]["workload"]
    job = CompileJob.model_validate(doc)
    with pytest.raises(ValueError, match="no live traffic profile yet"):
        resolve(job, md())
    with pytest.raises(ValueError, match="does not exist"):
        resolve(job, None)
    live = md({"trafficProfile": {"profile": LONG.model_dump()}})
    resolved = resolve(job, live)
    assert resolved.spec.deploymentRef is None
    assert resolved.spec.model == live.spec.model and resolved.spec.hardware == live.spec.hardware
    assert resolved.spec.workload is not None and resolved.spec.workload.profile == LONG
    assert resolved.spec.agent == job.spec.agent


FIG = Figures(
    outputTokensPerSecond=100,
    totalTokensPerSecond=150,
    ttftP50Ms=1,
    ttftP95Ms=2,
    itlP50Ms=3,
    itlP95Ms=4,
    noise=0.01,
)


def progress(i: int, state: str, total: int, best: float | None) -> Progress:
    base = Standing(build="sha256:" + "00" * 32, value=100, noise=0.01, sandbox=i, figures=FIG)
    return Progress(
        sandbox=i, sandboxes=2, agent="search", state=state, stopReason=None, message="m", counts=Counts(passed=total, total=total),  # type: ignore[arg-type]
        baseline=base,
        best=None if best is None else ProgressBest(**base.model_dump() | {"build": BUILD, "value": best}, speedup=best / 100, speedupNoise=0.02, significant=True),
        startedAt=NOW, updatedAt=NOW, elapsedS=1, budget=ProgressBudget(maxExperiments=10, experimentsLeft=5, deadlineS=60, secondsLeft=30),
        tokens=TokenUsage(), workloadHash="h",
    )  # fmt: skip


def result(improved: bool) -> CampaignResult:
    base = Standing(build="sha256:" + "00" * 32, value=100, noise=0.01, sandbox=0, figures=FIG)
    best = ResultBest(
        **base.model_dump() | {"build": BUILD, "value": 130},
        speedup=1.3,
        speedupNoise=0.02,
        knobs={},
        uri="s3://b/builds/x.tar.gz",
    )
    return CampaignResult(
        state="improved" if improved else "noImprovement", message="msg", objective=Objective(), minSpeedup=1.05,
        baseBuild=base.build, experiments=Counts(passed=7, rejected=1, total=8), baseline=base,
        best=best if improved else None, workload=LONG,
    )  # fmt: skip


def job_cj() -> CompileJob:
    doc = yaml.safe_load((EXAMPLES / "compilejob-standalone.yaml").read_text())
    doc["metadata"].update(uid="u", generation=1)
    return CompileJob.model_validate(doc)


def test_status_pending_running_succeeded() -> None:
    cj = job_cj()
    s = compilejob_status(cj, [], None, JobObservation(exists=True), "s3://b/cj/", NOW)
    assert s.phase == "Pending" and s.jobName == cj.metadata.name and s.ledgerUri == "s3://b/cj/"
    running = compilejob_status(cj, [progress(0, "running", 3, 110), progress(1, "running", 2, None)], None,
                                JobObservation(exists=True, active=2), "u", NOW)  # fmt: skip
    assert running.phase == "Running"
    assert [(p.index, p.phase, p.experiments, p.bestValue) for p in running.sandboxes] == [
        (0, "Running", 3, 110),
        (1, "Running", 2, None),
    ]
    assert running.experiments is not None and running.experiments.total == 5
    assert running.best is not None and running.best.speedup == pytest.approx(1.1)
    assert running.baseline is not None and running.baseline.speedup == 1.0
    cj2 = cj.model_copy(update={"status": running})
    done = compilejob_status(cj2, [progress(0, "finished", 4, 130), progress(1, "finished", 4, None)], result(True),
                             JobObservation(exists=True, succeeded=2, finished="Complete"), "u", NOW)  # fmt: skip
    assert done.phase == "Succeeded" and done.finishedAt == NOW
    assert done.best is not None and done.best.uri == "s3://b/builds/x.tar.gz" and done.best.speedup == 1.3
    assert done.experiments is not None and done.experiments.total == 8 and done.experiments.rejected == 1
    assert next(c for c in done.conditions if c.type == "Succeeded").status == "True"


@pytest.mark.parametrize(
    ("res", "job", "phase"),
    [
        (None, JobObservation(exists=True, failed=2, finished="Failed", reason="DeadlineExceeded"), "Failed"),
        (
            result(True),
            JobObservation(exists=True, finished="Failed", reason="DeadlineExceeded"),
            "Succeeded",
        ),
        (result(False), JobObservation(exists=True, finished="Complete"), "Succeeded"),
    ],
)
def test_status_terminal(res: CampaignResult | None, job: JobObservation, phase: str) -> None:
    s = compilejob_status(job_cj(), [], res, job, "u", NOW)
    assert s.phase == phase
    if res is None:
        assert "DeadlineExceeded" in (s.message or "")


def test_terminal_status_is_kept() -> None:
    cj = job_cj()
    done = compilejob_status(cj, [], result(True), JobObservation(exists=True, finished="Complete"), "u", NOW)
    later = compilejob_status(
        cj.model_copy(update={"status": done}),
        [],
        None,
        JobObservation(exists=False),
        "u",
        NOW + timedelta(hours=1),
    )
    assert later.phase == "Succeeded" and later.finishedAt == NOW


def test_candidate_from_result() -> None:
    cand = candidate_from_result(result(True))
    assert cand is not None and cand.id == BUILD and cand.profile == LONG and cand.figures == FIG
    assert candidate_from_result(result(False)) is None
