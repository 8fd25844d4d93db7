"""Measurement protocol: warm-up to a steady state, adaptive repeats, paired ABBA passes.

Passes are scripted (a ``PassResult`` of a chosen duration) and time is a fake clock that each
pass advances, so every stopping rule is checked exactly, without sleeps. The end-to-end A/A
check on the real engine is in test_engine_experiment_paired.py.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from polymorph.contract.stats import paired_ratio
from polymorph_engine.experiment.bench import PassResult
from polymorph_engine.experiment.measure import (
    MeasurePolicy,
    PairedMeasurement,
    as_wall,
    measure_one,
    measure_paired,
    waits_more,
    warm_up,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scripted(
    tps: Iterator[float] | list[float], clock: Clock, log: list[str] | None = None, name: str = ""
) -> Callable[[], PassResult]:
    """A pass of 100 tokens at each next throughput; it advances the clock by its duration."""
    source = iter(tps)

    def run() -> PassResult:
        rate = next(source)
        clock.now += 100 / rate
        if log is not None:
            log.append(name)
        return PassResult(duration_s=100 / rate, input_tokens=10, output_tokens=100)

    return run


def steady(value: float) -> Iterator[float]:
    while True:
        yield value


def jittered(value: float, jitter: float, seed: int = 0) -> Iterator[float]:
    """Throughputs with seeded Gaussian noise of relative sd ``jitter`` (kept positive)."""
    rng = random.Random(seed)
    while True:
        yield value * max(0.2, 1 + rng.gauss(0.0, jitter))


def test_warm_up_runs_until_two_consecutive_passes_agree() -> None:
    clock = Clock()
    # The slow first passes after a swap, from the ledger; then steady.
    run = scripted([1344, 2187, 2883, 2809, 2694, 2700], clock)
    # 2883 and 2809 agree within 5%
    assert warm_up(run, MeasurePolicy(warmup_tolerance=0.05)) == pytest.approx([1344, 2187, 2883, 2809])
    # A build that never settles stops at the cap.
    never = scripted([100, 200] * 20, clock)
    assert len(warm_up(never, MeasurePolicy(max_warmup=6))) == 6
    # No warm-up when the cap is 0.
    assert warm_up(scripted([1.0], clock), MeasurePolicy(min_warmup=0, max_warmup=0)) == []


def test_one_build_gets_passes_until_its_median_is_precise() -> None:
    clock = Clock()
    quiet = measure_one(scripted(jittered(1000, 0.01), clock), MeasurePolicy(min_passes=5), clock)
    assert len(quiet.passes) == 5 and len(quiet.warmup) == 2 and quiet.estimate.half_width <= 0.04
    # Noisier: more passes until the interval is within the target (or the pass cap).
    policy = MeasurePolicy(min_passes=5, max_passes=60, time_cap_s=1e9)
    noisy = measure_one(scripted(jittered(1000, 0.08, seed=5), clock), policy, clock)
    assert 5 < len(noisy.passes) < 60 and noisy.estimate.half_width <= 0.04


def test_the_time_cap_stops_adding_passes() -> None:
    clock = Clock()
    # Each pass takes 1 s of fake time; a 3 s cap ends it after the pass that crosses 3 s.
    noisy = scripted((100.0 * (1 + 0.3 * (-1) ** i) for i in range(100)), clock)
    policy = MeasurePolicy(min_passes=2, time_cap_s=3.0, target_half_width=0.001, min_warmup=2, max_warmup=2)
    m = measure_one(noisy, policy, clock)
    # Passes alternate 130 and 70 tok/s (0.77 s and 1.43 s): 2 warm-up passes, then measured passes
    # until 3 s of measuring have passed (0.77 + 1.43 + 0.77 = 2.97 s, then one more).
    assert len(m.passes) == 4


def test_paired_passes_run_in_abba_order_and_cancel_drift() -> None:
    clock = Clock()
    log: list[str] = []
    # Both builds slow down by 2% a pass (thermal drift); the candidate is 1.10x throughout.
    drift = [0.98**i for i in range(200)]
    cand = scripted((1100 * d for d in drift), clock, log, "A")
    base = scripted((1000 * d for d in drift), clock, log, "B")
    m = measure_paired(cand, base, MeasurePolicy(min_passes=6, min_warmup=2, max_warmup=2), clock)
    measured = log[4:]  # 2 + 2 warm-up passes first
    assert "".join(measured[:8]) == "ABBAABBA"
    assert len(m.candidate_warmup) == len(m.baseline_warmup) == 2 and len(m.candidate) == len(m.baseline) == 6
    assert m.estimate.value == pytest.approx(1.10, rel=0.01) and m.estimate.lo > 1.05


def test_paired_measurement_adds_pairs_until_the_ratio_is_precise() -> None:
    clock = Clock()
    cand = scripted(jittered(1200, 0.05, seed=1), clock)
    base = scripted(jittered(1000, 0.05, seed=2), clock)
    policy = MeasurePolicy(min_passes=5, max_passes=30, target_half_width=0.04, time_cap_s=1e9)
    m = measure_paired(cand, base, policy, clock)
    assert m.estimate.half_width <= 0.04 and len(m.candidate) > 5


def test_a_paired_measurement_takes_two_pairs_even_where_the_policy_allows_one() -> None:
    clock = Clock()
    policy = MeasurePolicy(min_passes=1, max_passes=1, min_warmup=0, max_warmup=0)
    m = measure_paired(
        scripted(jittered(1100, 0.02), clock), scripted(jittered(1000, 0.02, 1), clock), policy, clock
    )
    assert len(m.candidate) == len(m.baseline) == 2
    assert 0 < m.estimate.lo < m.estimate.hi < float("inf")
    # Measured alone, one pass is what such a policy asks for.
    assert len(measure_one(scripted(steady(1000.0), clock), policy, clock).passes) == 1


def test_a_surely_slower_candidate_stops_after_min_losing_passes() -> None:
    clock = Clock()
    cand = scripted(jittered(600, 0.01, seed=3), clock)
    base = scripted(jittered(1000, 0.01, seed=4), clock)
    m = measure_paired(cand, base, MeasurePolicy(min_passes=5, target_half_width=0.04, time_cap_s=1e9), clock)
    assert len(m.candidate) == 3 and m.estimate.hi < 1.0 and m.estimate.half_width <= 0.06
    # Surely slower but with a loose interval: measured on, to the minimum at least.
    loose = measure_paired(
        scripted(jittered(600, 0.05, seed=3), clock),
        scripted(jittered(1000, 0.05, seed=4), clock),
        MeasurePolicy(min_passes=5, target_half_width=0.001, time_cap_s=1e9),
        clock,
    )
    assert len(loose.candidate) == 5 and loose.estimate.hi < 1.0
    # A candidate as fast as its baseline never stops early: only an interval wholly below 1 does.
    same = measure_paired(
        scripted(jittered(1000, 0.05, seed=5), clock),
        scripted(jittered(1000, 0.05, seed=6), clock),
        MeasurePolicy(min_passes=5, max_passes=8, target_half_width=0.001, time_cap_s=1e9),
        clock,
    )
    assert len(same.candidate) == 8


def test_a_candidate_far_ahead_of_its_baseline_stops_at_a_wider_interval() -> None:
    # A fused build against a noisy reference (the reference's passes 4% apart).
    policy = MeasurePolicy(min_passes=5, max_passes=40, target_half_width=0.02, time_cap_s=1e9)

    def against_the_reference(speed: float, policy: MeasurePolicy) -> PairedMeasurement:
        clock = Clock()
        cand = scripted(jittered(speed, 0.01, seed=7), clock)
        return measure_paired(cand, scripted(jittered(1000, 0.04, seed=8), clock), policy, clock)

    # About 5x: the gate is far below, so the interval may be 2.5 times the target.
    far = against_the_reference(5000, policy)
    assert far.estimate.lo > 1.5 and 0.02 < far.estimate.half_width <= 0.05
    # The same noise at 1.2x (a race, a candidate near the gate): measured to the target.
    near = against_the_reference(1200, policy)
    assert near.estimate.half_width <= 0.02 and len(near.candidate) > len(far.candidate)
    # A screen's target is wide already: it is not widened again.
    screen = against_the_reference(5000, replace(policy, target_half_width=0.01).screening())
    assert screen.estimate.half_width <= 0.025


def test_a_warm_baseline_runs_one_warm_up_pass() -> None:
    clock = Clock()
    log: list[str] = []
    cand = scripted(jittered(1200, 0.01, seed=7), clock, log, "A")
    base = scripted(jittered(1000, 0.01, seed=8), clock, log, "B")
    policy = MeasurePolicy(min_passes=5, target_half_width=0.5, time_cap_s=1e9)
    m = measure_paired(cand, base, policy, clock, baseline_warm=True)
    assert len(m.candidate_warmup) == 2 and len(m.baseline_warmup) == 1 and log[:3] == ["A", "A", "B"]


def test_a_screen_warms_the_candidate_up_twice_at_most_and_measures_a_warm_baseline_at_once() -> None:
    clock = Clock()
    log: list[str] = []
    # A candidate still settling after two passes: the full protocol warms it up on, a screen does not.
    cand = scripted(itertools.chain([500, 900, 1100, 1190], jittered(1200, 0.01, seed=9)), clock, log, "A")
    base = scripted(jittered(1000, 0.01, seed=10), clock, log, "B")
    policy = MeasurePolicy(min_passes=5, target_half_width=0.02, time_cap_s=1e9, min_warmup=3, max_warmup=10)
    m = measure_paired(cand, base, policy.screening(), clock, baseline_warm=True)
    assert m.candidate_warmup == pytest.approx([500, 900]) and m.baseline_warmup == []
    assert "".join(log[2:8]) == "ABBAAB"  # measured pairs start right after the candidate's warm-up
    full = measure_paired(
        scripted(itertools.chain([500, 900, 1100, 1190], jittered(1200, 0.01, seed=9)), clock),
        scripted(jittered(1000, 0.01, seed=10), clock),
        policy,
        clock,
        baseline_warm=True,
    )
    assert len(full.candidate_warmup) == 5 and len(full.baseline_warmup) == 1  # 1190 and ~1200 agree


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="max_passes"):
        MeasurePolicy(min_passes=5, max_passes=4)
    with pytest.raises(ValueError, match="target_half_width"):
        MeasurePolicy(target_half_width=0)
    with pytest.raises(ValueError, match="warm-up"):
        MeasurePolicy(min_warmup=3, max_warmup=2)
    with pytest.raises(ValueError, match="far_width"):
        MeasurePolicy(far_width=0.5)


def test_a_candidate_that_waits_is_judged_by_wall_time() -> None:
    def timed(cpu: float, wall: float) -> PassResult:
        return PassResult(duration_s=cpu, input_tokens=10, output_tokens=100, wall_s=wall)

    # Both preempted alike (a loaded machine): CPU time stands.
    loaded_c = [timed(0.05, 0.10 + 0.01 * i) for i in range(6)]
    loaded_b = [timed(0.06, 0.12 + 0.01 * i) for i in range(6)]
    assert not waits_more(loaded_c, loaded_b)
    # Load that comes and goes: every other pair preempted 3x, its two passes alike, and one more
    # pair where only the candidate's pass was. Taken apart, the candidate's median wall/CPU (2.0)
    # is twice the baseline's (1.0); pair by pair the median is 1.
    bursty_c = [timed(0.05, 0.05 * (3 if i % 2 else 1)) for i in range(7)] + [timed(0.05, 0.15)]
    bursty_b = [timed(0.05, 0.05 * (3 if i % 2 else 1)) for i in range(7)] + [timed(0.05, 0.05)]
    assert not waits_more(bursty_c, bursty_b)
    # The candidate sleeps half its pass: its CPU time looks 2x better, its wall time does not.
    sleepy = [timed(0.03, 0.09) for _ in range(6)]
    steady_b = [timed(0.06, 0.06) for _ in range(6)]
    assert waits_more(sleepy, steady_b)
    est = paired_ratio([100 / 0.03] * 6, [100 / 0.06] * 6)
    judged = as_wall(PairedMeasurement(sleepy, steady_b, 2, 2, est, 1.0))
    assert judged.estimate.value == pytest.approx(0.06 / 0.09)
    assert all(p.duration_s == p.wall_s for p in judged.candidate + judged.baseline)
