"""Estimates and intervals: median, the order-statistic median CI, Student's t quantile, Estimate itself."""

from __future__ import annotations

import math
import random
import statistics
from fractions import Fraction

import pytest

from polymorph.contract.stats import Estimate, median, median_ci, t_quantile


def reference_rank(n: int, confidence: float) -> tuple[int, Fraction]:
    """Obviously-right twin of the order-statistic search: exact rational binomial sums."""
    best = (1, 1 - Fraction(2, 2**n))
    for rank in range(1, (n + 1) // 2 + 1):
        coverage = 1 - 2 * Fraction(sum(math.comb(n, k) for k in range(rank)), 2**n)
        if coverage >= Fraction(confidence):
            best = (rank, coverage)
    return best


def test_median_matches_statistics() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([-5.0]) == -5.0


@pytest.mark.parametrize("n", range(1, 61))
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_median_ci_matches_exact_binomial_reference(n: int, confidence: float) -> None:
    xs = [float(i) for i in range(n)]
    random.Random(n).shuffle(xs)
    est = median_ci(xs, confidence)
    rank, coverage = reference_rank(n, confidence)
    assert (est.lo, est.hi) == (float(rank - 1), float(n - rank))
    assert est.confidence == pytest.approx(float(coverage), abs=1e-9)
    assert est.value == statistics.median(xs)
    assert est.n == n


@pytest.mark.parametrize(
    ("n", "lo_rank", "coverage"),
    [
        (1, 1, 0.0),  # a single point covers nothing
        (2, 1, 0.5),
        (5, 1, 0.9375),  # 95% unreachable: min..max, and say what it covers
        (6, 1, 0.96875),  # first n where 95% is reached
        (9, 2, 1 - 2 * 10 / 512),
        (10, 2, 1 - 2 * 11 / 1024),
    ],
)
def test_median_ci_small_n_table(n: int, lo_rank: int, coverage: float) -> None:
    est = median_ci([float(i + 1) for i in range(n)])
    assert est.lo == lo_rank and est.hi == n + 1 - lo_rank
    assert est.confidence == pytest.approx(coverage)


def test_median_ci_large_n_is_fast_and_near_normal_theory() -> None:
    n = 100_000
    est = median_ci([float(i) for i in range(n)])
    # normal approximation of the rank: n/2 - 1.96 sqrt(n)/2
    assert abs(est.lo - (n / 2 - 1.959964 * math.sqrt(n) / 2)) < 3


def test_median_ci_negative_and_zero_values_are_fine() -> None:
    est = median_ci([-3.0, -1.0, 0.0, 1.0, 2.0, 5.0, -2.0])
    assert est.lo <= est.value <= est.hi
    assert median_ci([0.0, 0.0, 0.0, 0.0, 0.0, 0.0]).half_width == math.inf


def test_median_ci_covers_true_median_in_simulation() -> None:
    rng = random.Random(7)
    true_median = 1000.0
    covered = 0
    for _ in range(200):
        xs = [true_median * rng.lognormvariate(0.0, 0.05) for _ in range(15)]
        est = median_ci(xs)
        covered += est.lo <= true_median <= est.hi
    assert covered >= 180  # exact coverage for n = 15 is 96.5%


def test_median_ci_of_bimodal_passes_is_wide_not_falsely_tight() -> None:
    rng = random.Random(3)
    xs = [rng.choice([700.0, 1000.0]) * rng.gauss(1.0, 0.005) for _ in range(20)]
    est = median_ci(xs)
    low_mode, high_mode = sum(x < 850 for x in xs), sum(x > 850 for x in xs)
    assert low_mode >= 5 and high_mode >= 5  # the draw really is bimodal
    assert est.lo < 850 < est.hi  # the interval spans both modes


def test_t_quantile_matches_closed_forms_and_tables() -> None:
    for p in (0.6, 0.9, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    table = {3: 3.182446, 4: 2.776445, 10: 2.228139, 30: 2.042272}
    for df, q in table.items():
        assert t_quantile(0.975, df) == pytest.approx(q, rel=1e-6)
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, rel=1e-5)
    assert t_quantile(0.025, 4) == -t_quantile(0.975, 4)
    assert t_quantile(0.5, 3) == 0.0


def test_estimate_half_width_and_display() -> None:
    est = Estimate(value=2.0, lo=1.9, hi=2.3, n=7, confidence=0.95)
    assert est.half_width == pytest.approx(0.1)
    assert str(est) == "2 ±10.0% (n=7)"
    assert Estimate(value=0.0, lo=-1.0, hi=1.0, n=3, confidence=0.95).half_width == math.inf
    assert Estimate(value=1.0, lo=0.0, hi=math.inf, n=1, confidence=0.95).half_width == math.inf


@pytest.mark.parametrize(
    "kwargs",
    [
        {"value": math.nan, "lo": 0.0, "hi": 1.0, "n": 1, "confidence": 0.95},
        {"value": 2.0, "lo": 0.0, "hi": 1.0, "n": 1, "confidence": 0.95},
        {"value": 1.0, "lo": math.nan, "hi": 1.0, "n": 1, "confidence": 0.95},
        {"value": 1.0, "lo": 0.0, "hi": 2.0, "n": 0, "confidence": 0.95},
        {"value": 1.0, "lo": 0.0, "hi": 2.0, "n": 3, "confidence": 1.5},
    ],
)
def test_estimate_rejects_inconsistent_fields(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"^An estimate"):
        Estimate(**kwargs)  # type: ignore[arg-type]
