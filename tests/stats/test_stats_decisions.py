"""The decisions built on estimates: verdict's exact rule, steady_state for warm-up, precise_enough."""

from __future__ import annotations

import math

import pytest

from polymorph.contract.stats import Estimate, Verdict, paired_ratio, precise_enough, steady_state, verdict


def est(lo: float, hi: float, value: float | None = None) -> Estimate:
    return Estimate(value=(lo + hi) / 2 if value is None else value, lo=lo, hi=hi, n=8, confidence=0.95)


@pytest.mark.parametrize(
    ("lo", "hi", "min_ratio", "expected"),
    [
        (1.06, 1.10, 1.05, Verdict.BETTER),
        (1.05, 1.10, 1.05, Verdict.INCONCLUSIVE),  # strict: lo must exceed min_ratio
        (1.01, 1.10, 1.05, Verdict.INCONCLUSIVE),  # faster, but not by min_ratio beyond noise
        (1.01, 1.10, 1.00, Verdict.BETTER),
        (0.98, 1.02, 1.00, Verdict.INCONCLUSIVE),
        (0.90, 0.99, 1.05, Verdict.WORSE),
        (0.90, 1.00, 1.05, Verdict.INCONCLUSIVE),  # strict: hi must be below 1
        (0.0, math.inf, 1.0, Verdict.INCONCLUSIVE),
    ],
)
def test_verdict_higher_is_better(lo: float, hi: float, min_ratio: float, expected: Verdict) -> None:
    assert verdict(est(lo, hi, value=lo if math.isinf(hi) else None), min_ratio) == expected


@pytest.mark.parametrize(
    ("lo", "hi", "min_ratio", "expected"),
    [
        (0.85, 0.95, 1.05, Verdict.BETTER),  # hi < 1/1.05 = 0.952
        (0.85, 0.96, 1.05, Verdict.INCONCLUSIVE),
        (0.85, 0.99, 1.00, Verdict.BETTER),
        (1.01, 1.20, 1.05, Verdict.WORSE),
        (1.00, 1.20, 1.05, Verdict.INCONCLUSIVE),
    ],
)
def test_verdict_lower_is_better(lo: float, hi: float, min_ratio: float, expected: Verdict) -> None:
    assert verdict(est(lo, hi), min_ratio, higher_is_better=False) == expected


def test_verdict_values_are_the_wire_strings() -> None:
    assert [v.value for v in Verdict] == ["better", "worse", "inconclusive"]
    assert Verdict("better") is Verdict.BETTER


def test_latency_ratio_of_a_faster_build_is_better_lower_is_better() -> None:
    itl_candidate = [20.1, 20.3, 19.8, 20.0, 20.2, 19.9]
    itl_baseline = [25.0, 25.4, 24.9, 25.2, 25.1, 24.8]
    assert verdict(paired_ratio(itl_candidate, itl_baseline), 1.05, higher_is_better=False) == Verdict.BETTER


@pytest.mark.parametrize(
    ("passes", "tolerance", "expected"),
    [
        ([1344.0, 2187.0], 0.05, False),
        ([1344.0, 2187.0, 2883.0], 0.05, False),
        ([1344.0, 2187.0, 2883.0, 2809.0], 0.05, True),  # 2.6% apart
        ([1344.0, 2187.0, 2883.0, 2809.0], 0.02, False),
        ([1511.0, 2310.0, 2415.0, 1896.0, 1744.0], 0.05, False),  # the issue's unsettled run
        ([100.0, 105.0], 0.05 / 1.05 + 1e-12, True),  # |a - b| / max(a, b) = 5/105
        ([100.0, 105.0], 0.047, False),
        ([100.0, 100.0], 0.0, True),
        ([100.0], 0.5, False),  # one pass is not yet steady
    ],
)
def test_steady_state(passes: list[float], tolerance: float, expected: bool) -> None:
    assert steady_state(passes, tolerance) is expected


def test_warm_up_loop_over_the_issue_passes_takes_four() -> None:
    trace = [1344.0, 2187.0, 2883.0, 2809.0, 2694.0]
    taken = next(i for i in range(1, len(trace) + 1) if steady_state(trace[:i], 0.05))
    assert taken == 4


@pytest.mark.parametrize(
    ("lo", "hi", "value", "target", "expected"),
    [
        (0.98, 1.02, 1.0, 0.02, True),
        (0.97, 1.03, 1.0, 0.02, False),
        (1.9, 2.1, 2.0, 0.05, True),  # relative: 0.1 / 2 = 5%
        (0.0, math.inf, 1.0, 10.0, False),
    ],
)
def test_precise_enough(lo: float, hi: float, value: float, target: float, expected: bool) -> None:
    assert precise_enough(Estimate(value, lo, hi, 5, 0.95), target) is expected


def test_adaptive_repeats_narrow_the_interval() -> None:
    candidate = [
        1030.0,
        1041.0,
        1022.0,
        1035.0,
        1028.0,
        1039.0,
        1026.0,
        1033.0,
        1031.0,
        1037.0,
        1029.0,
        1034.0,
    ]
    baseline = [1000.0, 1006.0, 995.0, 1003.0, 998.0, 1004.0, 997.0, 1001.0, 999.0, 1005.0, 996.0, 1002.0]
    widths = [paired_ratio(candidate[:n], baseline[:n]).half_width for n in (4, 8, 12)]
    assert widths[0] > widths[1] > widths[2]
    assert not precise_enough(paired_ratio(candidate[:4], baseline[:4]), 0.01)
    assert precise_enough(paired_ratio(candidate, baseline), 0.01)
