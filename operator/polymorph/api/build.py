"""Build manifests and experiment records, shared by the engine, the agents and the operator.

A build is identified by the sha256 of its canonical archive (see ``polymorph.store``).
An experiment record is one line of a campaign ledger.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field

from polymorph.api.common import StrictModel, WorkloadProfile

ExperimentStatus = Literal["passed", "rejected", "failed", "crashed", "timeout"]


def _now() -> datetime:
    return datetime.now(UTC)


class Figures(StrictModel):
    """Benchmark figures for one build on one workload; ``noise`` is the relative spread of the objective."""

    outputTokensPerSecond: float
    totalTokensPerSecond: float
    ttftP50Ms: float
    ttftP95Ms: float
    itlP50Ms: float
    itlP95Ms: float
    noise: float = Field(ge=0, description="(max - min) / median of outputTokensPerSecond over repeats")
    repeats: list[float] = Field(default_factory=list, description="outputTokensPerSecond of each repeat")


class Verification(StrictModel):
    """How a build compared with the reference's golden outputs.

    ``tokenAgreement`` is the fraction of teacher-forced decode steps whose greedy token equals
    the golden one; ``logitError`` is the largest max|logits - golden| / max|golden| over prompts
    and steps; ``finite`` is false when any logit is NaN or infinite (which never passes).
    ``polymorph_engine.verify`` computes them.
    """

    tokenAgreement: float
    logitError: float
    finite: bool
    passed: bool


class TokenUsage(StrictModel):
    inputTokens: int = 0
    outputTokens: int = 0


class Timings(StrictModel):
    loadS: float = 0.0
    verifyS: float = 0.0
    benchS: float = 0.0
    totalS: float = 0.0


class ExperimentRecord(StrictModel):
    """One experiment: a build run through verification and benchmark in a hot engine."""

    build: str
    status: ExperimentStatus
    workloadHash: str = ""
    parent: str | None = None
    name: str = ""
    description: str = ""
    knobs: dict[str, Any] = Field(default_factory=dict)
    verification: Verification | None = None
    figures: Figures | None = None
    error: str | None = None
    timings: Timings = Field(default_factory=Timings)
    sandbox: int = 0
    agent: str = ""
    usage: TokenUsage | None = None
    startedAt: datetime = Field(default_factory=_now)


class BuildManifest(StrictModel):
    """What the store keeps beside a build archive: ``builds/<sha256>.json``."""

    id: str
    name: str
    parent: str | None = None
    description: str = ""
    knobs: dict[str, Any] = Field(default_factory=dict)
    model: str = ""
    hardware: str = ""
    workload: WorkloadProfile | None = None
    figures: Figures | None = None
    createdAt: datetime = Field(default_factory=_now)
