"""Build manifests and experiment records, shared by the engine, the agents and the operator.

A build is identified by the sha256 of its canonical archive (see ``polymorph.contract.store``).
An experiment record is one line of a campaign ledger.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field

from polymorph.contract.api.common import StrictModel, WorkloadProfile

ExperimentStatus = Literal["passed", "rejected", "failed", "crashed", "timeout"]


def _now() -> datetime:
    return datetime.now(UTC)


class MeasuredShape(StrictModel):
    """The workload shape a build's figures were measured at, and how.

    ``replay``: every request of the (possibly scaled) workload ran through the scheduler each
    pass. ``sampledSteps``: each pass timed a few prefills and decode steps picked from the whole
    workload and laid every step of it out with those costs
    (``polymorph_engine.experiment.sampled``). ``scaled`` says what was changed to fit a device,
    empty when nothing was.
    """

    method: Literal["replay", "sampledSteps"]
    requests: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    promptTokensP50: int = Field(ge=1)
    promptTokensMax: int = Field(ge=1)
    outputTokensP50: int = Field(ge=1)
    outputTokensMax: int = Field(ge=1)
    cacheSlots: int = Field(
        ge=1, description="KV-cache slots the build was measured on (as serving allocates)"
    )
    cacheLen: int = Field(ge=1, description="positions each KV-cache slot holds")
    decodeSteps: int = Field(default=0, ge=0, description="decode steps one pass of the whole workload takes")
    sampled: str = Field(default="", description="what each sampled pass timed (sampledSteps only)")
    scaled: str = Field(default="", description="what was changed to fit the device; empty when nothing")

    def summary(self, scaling: bool = True) -> str:
        """One line: the shape, the method, and (``scaling``) what was scaled."""
        text = (
            f"{self.requests} requests at concurrency {self.concurrency}, prompts p50 {self.promptTokensP50} "
            f"max {self.promptTokensMax}, outputs p50 {self.outputTokensP50} max {self.outputTokensMax}, "
            f"cache {self.cacheSlots}x{self.cacheLen} ({'sampled steps' if self.method == 'sampledSteps' else 'full replay'})"
        )
        return f"{text}; {self.scaled}" if self.scaled and scaling else text


class Figures(StrictModel):
    """Benchmark figures for one build on one workload, from its measured passes.

    Every pass replays the same workload with the same prompts after warm-up to a steady state
    (``polymorph_engine.experiment.measure``). Throughputs are the median over passes; the
    latency percentiles pool every measured pass. ``noise`` is no longer a range: it is the
    relative half-width of the 95% distribution-free confidence interval of the median output
    tok/s (``polymorph.contract.stats.median_ci``: ``(ciHigh - ciLow) / 2 / outputTokensPerSecond``). It
    describes one build's own repeatability; whether a build beats another is decided only by a
    paired comparison (``ExperimentRecord.comparison``), never by comparing two ``noise`` values.
    """

    outputTokensPerSecond: float
    totalTokensPerSecond: float
    ttftP50Ms: float
    ttftP95Ms: float
    itlP50Ms: float
    itlP95Ms: float
    noise: float = Field(
        ge=0,
        description="relative half-width of the 95% CI of the median outputTokensPerSecond (order statistics)",
    )
    repeats: list[float] = Field(
        default_factory=list, description="outputTokensPerSecond of each measured pass"
    )
    ciLow: float = Field(
        default=0.0, description="lower end of the 95% CI of the median outputTokensPerSecond"
    )
    ciHigh: float = Field(
        default=0.0, description="upper end of the 95% CI of the median outputTokensPerSecond"
    )
    ttftP95Repeats: list[float] = Field(
        default_factory=list, description="TTFT p95 (ms) of each measured pass"
    )
    itlP95Repeats: list[float] = Field(default_factory=list, description="ITL p95 (ms) of each measured pass")
    warmupPasses: int = Field(
        default=0, ge=0, description="unmeasured passes run until two agreed (steady state)"
    )
    warmupRepeats: list[float] = Field(
        default_factory=list, description="outputTokensPerSecond of each unmeasured warm-up pass"
    )
    shape: MeasuredShape | None = Field(
        default=None, description="the workload shape these figures were measured at"
    )


class PairedComparison(StrictModel):
    """This experiment's build measured against another build, interleaved in one engine.

    Both builds were loaded side by side over the same weights and replayed the same prompts in
    ABBA order (candidate, baseline, baseline, candidate, ...); pair ``i`` is the candidate's
    ``i``-th pass with the baseline's ``i``-th pass, so drift common to both cancels. ``ratio``,
    ``lo`` and ``hi`` are candidate / baseline output tok/s with its ``confidence`` interval
    (``polymorph.contract.stats.paired_ratio``: 20%-trimmed mean of log ratios, Yuen interval); passes
    were added until ``halfWidth`` reached the target or a cap. ``baseline`` holds the
    baseline's figures from the same passes (so any objective can be re-paired from the lists).
    """

    against: str = Field(description="the build id of the baseline this build was paired against")
    ratio: float
    lo: float
    hi: float
    confidence: float = 0.95
    pairs: int = Field(ge=1)
    halfWidth: float = Field(ge=0, description="relative half-width of the ratio's confidence interval")
    order: Literal["ABBA"] = "ABBA"
    clock: Literal["wall", "cpu"] = "wall"
    """What timed the passes: wall time (accelerators, always with a device sync) or the worker
    process's CPU time (CPU devices, so other tenants' time slices are not charged to a build)."""
    baseline: Figures


class Verification(StrictModel):
    """How a build compared with the reference's golden outputs.

    ``tokenAgreement`` is the fraction of teacher-forced decode steps whose greedy token equals
    the golden one; ``logitError`` is the largest max|logits - golden| / max|golden| over prompts
    and steps; ``finite`` is false when any logit is NaN or infinite (which never passes).
    ``polymorph_engine.experiment.verify`` computes them.
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
    prepareS: float = 0.0
    """Of ``verifyS`` and ``benchS``: seconds the build spent preparing its caches (CUDA-graph
    captures, compiled warm-ups per bucket), not running the workload."""
    benchS: float = 0.0
    warmupS: float = 0.0
    """Of ``benchS``: the unmeasured warm-up passes (both builds' when paired)."""
    fillS: float = 0.0
    """Of ``benchS``: untimed work inside passes, both builds': a sampled pass filling its decode
    state (prefills of every slot to its context position) before the steps it times."""
    totalS: float = 0.0


class ExperimentRecord(StrictModel):
    """One experiment: a build run through verification and benchmark in a hot engine.

    With ``comparison`` it was benchmarked paired against another build in the same engine;
    only such a record can show that a build is faster (``polymorph.compile.selection``).
    """

    build: str
    status: ExperimentStatus
    workloadHash: str = ""
    parent: str | None = None
    name: str = ""
    description: str = ""
    knobs: dict[str, Any] = Field(default_factory=dict)
    inertKnobs: list[str] = Field(default_factory=list)
    """Knobs the loaded build says change nothing for this model (its hot path's ``inert_knobs``),
    such as the MoE knobs on a dense model: a search holds them at their defaults."""
    verification: Verification | None = None
    figures: Figures | None = None
    comparison: PairedComparison | None = None
    """Set when the build was measured paired against another build (``against`` in the runner)."""
    passes: int = 0
    """Measured passes of this build (pairs when paired), after warm-up."""
    halfWidth: float | None = None
    """Relative CI half-width the passes reached: of the paired ratio when paired, else of the median."""
    screen: bool = False
    """Measured by the short screening protocol (fewer passes, a wider target interval) rather
    than the full one; a screening and a full measurement of the same pairing are two experiments."""
    error: str | None = None
    timings: Timings = Field(default_factory=Timings)
    sandbox: int = 0
    agent: str = ""
    usage: TokenUsage | None = None
    startedAt: datetime = Field(default_factory=_now)


def measured_shape_of(records: Iterable[ExperimentRecord]) -> MeasuredShape | None:
    """The shape the first of ``records`` with figures was measured at (a campaign measures one)."""
    return next(
        (r.figures.shape for r in records if r.figures is not None and r.figures.shape is not None), None
    )


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
