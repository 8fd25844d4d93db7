"""Measuring builds so that verdicts hold up: warm-up to a steady state, adaptive repeats, paired passes.

Owns the measurement protocol of campaign experiments (``run.run_experiment`` calls it):
- ``warm_up``: unmeasured passes after a swap until two consecutive ones agree within
  ``MeasurePolicy.warmup_tolerance`` (``polymorph.contract.stats.steady_state``), or ``max_warmup`` passes;
  it returns their throughputs (kept in the record: ``Figures.warmupRepeats``). First passes
  after a swap are slow (graph captures, kernel compiles, allocator, clocks), and one fixed
  warm-up pass was not enough.
- ``measure_one``: warm-up, then measured passes until the median's 95% interval
  (``stats.median_ci``) is within ``target_half_width``, with at least ``min_passes`` and at
  most ``max_passes`` passes, and no new pass once ``time_cap_s`` of measuring has passed.
- ``measure_paired``: a candidate against a baseline, both loaded in one engine. Both warm up,
  then pairs run in ABBA order (pair 0: candidate, baseline; pair 1: baseline, candidate; ...)
  so that a linear drift over a pair cancels across two pairs, and pairs are added until the
  paired ratio's interval (``stats.paired_ratio``) is within the target, under the same caps,
  or until it lies wholly below 1 (after ``min_passes`` pairs, or already after
  ``min_losing_passes`` when its half-width is within ``LOSING_SLACK`` times the target): a candidate that is surely slower needs no precise figure
  (no decision about it can come out "better"), and ending it early keeps the budget for the rest.
  A ratio whose interval lies wholly above ``FAR_RATIO`` (a candidate surely 1.5x its baseline
  or more) stops at ``MeasurePolicy.far_width`` times the target: no decision about it is close.
  A baseline that is already warm (``baseline_warm``: held
  loaded, with its cache, since an earlier experiment warmed it) runs one unmeasured pass
  instead of warming up to a steady state again (none when screening).
  Pair ``i`` is (the candidate's ``i``-th pass, the baseline's ``i``-th pass).

``waits_more`` tells when a CPU-time measurement would flatter a candidate that waits (its
wall time exceeds its CPU time by much more than the baseline's does in the same pairs), and
``as_wall`` re-judges such a measurement by the passes' wall times.

A pass is any callable returning a ``bench.PassResult`` and time comes from an injected
``clock``, so the stopping rules are tested with scripted passes and a fake clock. It knows
nothing about builds, engines, verification or processes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from polymorph.contract.stats import Estimate, median_ci, paired_ratio, precise_enough, steady_state
from polymorph_engine.experiment.bench import PassResult, throughput

__all__ = [
    "CPU_TARGET",
    "CPU_TIME_CAP",
    "FAR_RATIO",
    "GPU_TARGET",
    "GPU_TIME_CAP",
    "SCREEN_PASSES",
    "MeasurePolicy",
    "Measurement",
    "PairedMeasurement",
    "as_wall",
    "measure_one",
    "measure_paired",
    "waits_more",
    "warm_up",
]

GPU_TARGET = 0.02
"""Default relative CI half-width on an accelerator, where a fixed workload repeats within 1-2%."""
CPU_TARGET = 0.04
"""Default relative CI half-width on a CPU (a shared machine's scheduler adds noise)."""

CPU_TIME_CAP = 2.0
"""Default seconds of measuring per experiment on a CPU (a demo campaign runs 30 in minutes)."""
GPU_TIME_CAP = 10.0
"""Default seconds of measuring per experiment on an accelerator: a pairing with a slow, noisy
reference build (30 tok/s against 200) reaches the 2% target in 8-10 s, not in 5. Screening
(``MeasurePolicy.screening``) takes ``SCREEN_TIME`` of it."""

SCREEN_PASSES = 3
"""Pairs a screening measurement takes before its interval is judged (``MeasurePolicy.screening``)."""
SCREEN_WIDTH = 2.5
"""A screening measurement's target half-width, in multiples of the full one."""
SCREEN_TIME = 0.2
"""A screening measurement's time cap, as a fraction of the full one."""
SCREEN_WARMUP = 2
"""A screening measurement's warm-up passes at most (per build): the first pass after a swap
captures the sampled shapes' graphs and compiles their kernels; the second runs them warm."""

LOSING_SLACK = 1.5
"""A surely slower candidate may stop early with an interval up to this many times the target half-width."""
FAR_RATIO = 1.5
"""A paired ratio whose interval lies wholly above this is far ahead of its baseline, and stops at
``MeasurePolicy.far_width`` times the target half-width (after ``min_passes`` pairs). What a
campaign decides about such a build (the gate, 1.05x by default; a race with builds a few percent
from it, paired with those) is far from this ratio, so a 2% figure costs more than it tells: the
leader's final pairing with the reference on llama-8b (H100, the chat profile) ran 16 pairs, 13.9
s, to take 5.04x to within 2.3%. A wider interval only makes a gate harder to clear; it never
makes a winner."""

Pass = Callable[[], PassResult]


@dataclass(frozen=True)
class MeasurePolicy:
    """When warm-up ends and when measuring stops."""

    min_passes: int = 5
    """Measured passes (pairs when paired) before the interval is judged; 5 gives the trimmed mean
    one trimmed pair per side."""
    max_passes: int = 40
    target_half_width: float = CPU_TARGET
    time_cap_s: float = CPU_TIME_CAP
    """Seconds of measuring after which no new pass (pair) starts, even short of the target."""
    min_losing_passes: int = 3
    """Pairs after which a paired measurement whose interval lies wholly below 1 stops (at most
    ``min_passes``): stopping early can only cost a loser its precision, never make a winner."""
    min_warmup: int = 2
    max_warmup: int = 10
    warmup_tolerance: float = 0.05
    confidence: float = 0.95
    rewarm_baseline: bool = True
    """Whether a baseline held warm since an earlier experiment runs one unmeasured pass first."""
    far_width: float = SCREEN_WIDTH
    """A paired ratio far ahead of its baseline (``FAR_RATIO``) stops at this many times the target."""

    def screening(self) -> MeasurePolicy:
        """The short protocol for screening many candidates: ``SCREEN_PASSES`` pairs at least, a
        target ``SCREEN_WIDTH`` times wider, ``SCREEN_TIME`` of the time cap. Its verdicts are
        ranked like any other; what is kept is raced again by the full protocol. The candidate
        warms up for at most ``SCREEN_WARMUP`` passes, and a baseline held warm measures at once:
        the ABBA order cancels a drift across the pairs, and the race settles what was kept."""
        return replace(
            self,
            min_passes=min(self.min_passes, SCREEN_PASSES),
            min_losing_passes=min(self.min_losing_passes, SCREEN_PASSES - 1),
            target_half_width=self.target_half_width * SCREEN_WIDTH,
            time_cap_s=self.time_cap_s * SCREEN_TIME,
            min_warmup=min(self.min_warmup, SCREEN_WARMUP),
            max_warmup=min(self.max_warmup, SCREEN_WARMUP),
            rewarm_baseline=False,
            far_width=1.0,  # the screen's target is wide already
        )

    def __post_init__(self) -> None:
        if self.min_passes < 1:
            raise ValueError(f"min_passes must be >= 1, got {self.min_passes}")
        if self.max_passes < self.min_passes:
            raise ValueError(f"max_passes ({self.max_passes}) must be >= min_passes ({self.min_passes})")
        if not self.target_half_width > 0:
            raise ValueError(f"target_half_width must be > 0 (such as 0.02), got {self.target_half_width}")
        if not self.far_width >= 1:
            raise ValueError(f"far_width must be >= 1 (a multiple of the target), got {self.far_width}")
        if self.min_warmup < 0 or self.max_warmup < self.min_warmup:
            raise ValueError(
                f"warm-up needs 0 <= min_warmup <= max_warmup, got {self.min_warmup} and {self.max_warmup}"
            )


@dataclass(frozen=True)
class Measurement:
    """One build's measured passes (after ``warmup`` unmeasured ones) and its median with a CI."""

    passes: list[PassResult]
    warmup: list[float]
    """Throughput of each unmeasured warm-up pass."""
    estimate: Estimate
    seconds: float
    warmup_s: float = 0.0
    """Of ``seconds``: the unmeasured warm-up passes'."""


@dataclass(frozen=True)
class PairedMeasurement:
    """Interleaved passes of a candidate and a baseline, and candidate / baseline with a CI."""

    candidate: list[PassResult]
    baseline: list[PassResult]
    candidate_warmup: list[float]
    baseline_warmup: list[float]
    """Throughput of each build's unmeasured warm-up passes."""
    estimate: Estimate
    seconds: float
    warmup_s: float = 0.0
    """Of ``seconds``: both builds' unmeasured warm-up passes'."""


def warm_up(run_pass: Pass, policy: MeasurePolicy) -> list[float]:
    """Run unmeasured passes until the last two agree within the tolerance (or the cap); their throughputs."""
    seen: list[float] = []
    while len(seen) < policy.max_warmup:
        seen.append(max(throughput(run_pass()), 1e-9))
        if len(seen) >= max(2, policy.min_warmup) and steady_state(seen, policy.warmup_tolerance):
            break
    return seen


def _enough(
    n: int, estimate: Estimate, policy: MeasurePolicy, elapsed: float, *, paired: bool = False
) -> bool:
    if paired and estimate.hi < 1.0:
        if n >= policy.min_passes:
            return True
        if n >= policy.min_losing_passes and estimate.half_width <= LOSING_SLACK * policy.target_half_width:
            return True
    if n < policy.min_passes:
        return False
    target = policy.target_half_width
    if paired and estimate.lo > FAR_RATIO:
        target *= policy.far_width
    return n >= policy.max_passes or elapsed >= policy.time_cap_s or precise_enough(estimate, target)


def measure_one(
    run_pass: Pass, policy: MeasurePolicy, clock: Callable[[], float] = time.perf_counter
) -> Measurement:
    """Warm up, then measure until the median is precise enough (see the module docstring)."""
    started = clock()
    warmup = warm_up(run_pass, policy)
    measuring = clock()
    passes: list[PassResult] = []
    while True:
        passes.append(run_pass())
        estimate = median_ci([throughput(p) for p in passes], policy.confidence)
        if estimate.value > 0 and _enough(len(passes), estimate, policy, clock() - measuring):
            break
        if estimate.value <= 0 and len(passes) >= policy.min_passes:
            break  # a build that generates nothing: more passes will not help
    return Measurement(passes, warmup, estimate, clock() - started, measuring - started)


MIN_PAIRS = 2
"""A paired measurement takes at least this many pairs, whatever the policy allows: one pair's
interval is unbounded, so it is no verdict (and its bounds are not finite numbers to record)."""


def measure_paired(
    run_candidate: Pass,
    run_baseline: Pass,
    policy: MeasurePolicy,
    clock: Callable[[], float] = time.perf_counter,
    *,
    baseline_warm: bool = False,
) -> PairedMeasurement:
    """Warm up both, then ABBA pairs until candidate / baseline is precise enough (see the module docstring)."""
    started = clock()
    candidate_warmup = warm_up(run_candidate, policy)
    if baseline_warm:
        baseline_warmup = [max(throughput(run_baseline()), 1e-9)] if policy.rewarm_baseline else []
    else:
        baseline_warmup = warm_up(run_baseline, policy)
    measuring = clock()
    cand: list[PassResult] = []
    base: list[PassResult] = []
    while True:
        if len(cand) % 2 == 0:
            cand.append(run_candidate())
            base.append(run_baseline())
        else:
            base.append(run_baseline())
            cand.append(run_candidate())
        estimate = paired_ratio(
            [max(throughput(p), 1e-9) for p in cand],
            [max(throughput(p), 1e-9) for p in base],
            policy.confidence,
        )
        if len(cand) >= MIN_PAIRS and _enough(len(cand), estimate, policy, clock() - measuring, paired=True):
            break
    return PairedMeasurement(
        cand, base, candidate_warmup, baseline_warmup, estimate, clock() - started, measuring - started
    )


WAIT_FACTOR = 1.5
"""``waits_more``: how much more wall time per CPU second the candidate may take than the baseline."""


def _waiting(p: PassResult) -> float:
    return p.wall_s / max(p.duration_s, 1e-9)


def waits_more(candidate: list[PassResult], baseline: list[PassResult]) -> bool:
    """True when, in the median pair, the candidate's wall/CPU time ratio exceeds the baseline's by
    ``WAIT_FACTOR``: it waits (sleeps, locks, I/O) rather than computes, so CPU time would flatter it.

    Judged pair by pair: the two passes of a pair run back to back, so a machine whose load comes
    and goes (preemption stretches wall time, not CPU time) stretches both alike, where the medians
    of each build's passes taken apart could differ by the load of different moments."""
    return (
        statistics.median(_waiting(c) / _waiting(b) for c, b in zip(candidate, baseline, strict=True))
        > WAIT_FACTOR
    )


def as_wall(paired: PairedMeasurement, confidence: float = 0.95) -> PairedMeasurement:
    """``paired`` with every pass timed by its wall time, and the ratio taken again."""

    def wall(passes: list[PassResult]) -> list[PassResult]:
        return [replace(p, duration_s=p.wall_s) for p in passes]

    cand, base = wall(paired.candidate), wall(paired.baseline)
    estimate = paired_ratio(
        [max(throughput(p), 1e-9) for p in cand], [max(throughput(p), 1e-9) for p in base], confidence
    )
    return replace(paired, candidate=cand, baseline=base, estimate=estimate)
