"""Campaign documents as sandboxes write them (the compile loop's own classes), for the tests to put in the store."""

from __future__ import annotations

from datetime import UTC, datetime

from polymorph.contract.api import Figures, Objective, WorkloadProfile
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

BASE = "sha256:" + "0" * 64
NEW = "sha256:" + "ab" * 32
SLOW = "sha256:" + "cd" * 32


def figures(tok_s: float) -> Figures:
    return Figures(outputTokensPerSecond=tok_s, totalTokensPerSecond=tok_s * 1.5, ttftP50Ms=10, ttftP95Ms=20,
                   itlP50Ms=5, itlP95Ms=8, noise=0.01)  # fmt: skip


def progress(
    sandbox: int, sandboxes: int, state: str, experiments: int, best: str | None, value: float
) -> Progress:
    base = Standing(build=BASE, value=100.0, noise=0.01, sandbox=sandbox, figures=figures(100))
    now = datetime.now(UTC)
    return Progress(
        sandbox=sandbox, sandboxes=sandboxes, agent="search", state=state, stopReason=None,  # type: ignore[arg-type]
        message=f"{experiments} experiments", counts=Counts(passed=experiments, total=experiments), baseline=base,
        best=None if best is None else ProgressBest(build=best, value=value, noise=0.01, sandbox=sandbox,
                                                    figures=figures(value), speedup=value / 100, speedupNoise=0.02,
                                                    significant=True),
        startedAt=now, updatedAt=now, elapsedS=1.0,
        budget=ProgressBudget(maxExperiments=10, experimentsLeft=10 - experiments, deadlineS=600, secondsLeft=590),
        tokens=TokenUsage(), workloadHash="h",
    )  # fmt: skip


def result(best: str, value: float, workload: WorkloadProfile | None, uri: str) -> CampaignResult:
    base = Standing(build=BASE, value=100.0, noise=0.01, sandbox=0, figures=figures(100))
    return CampaignResult(
        state="improved", message=f"{best} is {value / 100:.2f}x the baseline", objective=Objective(), minSpeedup=1.05,
        baseBuild=BASE, experiments=Counts(passed=9, rejected=1, total=10), baseline=base,
        best=ResultBest(build=best, value=value, noise=0.01, sandbox=0, figures=figures(value), speedup=value / 100,
                        speedupNoise=0.02, knobs={"kv_cache": "static"}, uri=uri),
        workload=workload,
    )  # fmt: skip
