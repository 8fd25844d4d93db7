"""Bad input to every public function fails with a ValueError whose message is one sentence."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from polymorph.contract.stats import (
    Estimate,
    median,
    median_ci,
    paired_ratio,
    precise_enough,
    ratio,
    steady_state,
    t_quantile,
    verdict,
)

GOOD = [1.0, 2.0, 3.0, 4.0]
EST = Estimate(1.1, 1.0, 1.2, 4, 0.95)

BAD_CALLS: list[tuple[str, Callable[[], object], str]] = [
    ("median empty", lambda: median([]), "empty"),
    ("median nan", lambda: median([1.0, math.nan]), r"xs\[1\] must be finite"),
    ("median inf", lambda: median([math.inf]), "finite"),
    ("median string", lambda: median("123"), "string"),  # type: ignore[arg-type]
    ("median text item", lambda: median([1.0, "2"]), "number"),  # type: ignore[list-item]
    ("median bool item", lambda: median([True, 2.0]), "number"),
    ("median not a sequence", lambda: median(3.0), "sequence"),  # type: ignore[arg-type]
    ("median_ci empty", lambda: median_ci([]), "empty"),
    ("median_ci confidence 1", lambda: median_ci(GOOD, 1.0), "confidence"),
    ("median_ci confidence 0", lambda: median_ci(GOOD, 0.0), "confidence"),
    ("median_ci confidence nan", lambda: median_ci(GOOD, math.nan), "confidence"),
    ("paired zero", lambda: paired_ratio([1.0, 0.0], [1.0, 1.0]), r"candidate\[1\] must be positive"),
    ("paired negative", lambda: paired_ratio([1.0, 1.0], [1.0, -2.0]), r"baseline\[1\] must be positive"),
    ("paired nan", lambda: paired_ratio([math.nan], [1.0]), "finite"),
    ("paired empty", lambda: paired_ratio([], []), "empty"),
    ("paired lengths", lambda: paired_ratio([1.0, 2.0], [1.0]), "same number of passes"),
    ("paired seed", lambda: paired_ratio(GOOD, GOOD, seed=-1), "seed"),
    ("paired confidence", lambda: paired_ratio(GOOD, GOOD, confidence=95), "confidence"),
    ("ratio zero", lambda: ratio([0.0, 1.0], [1.0, 1.0]), "positive"),
    ("ratio empty baseline", lambda: ratio(GOOD, []), "baseline must hold"),
    ("ratio resamples", lambda: ratio(GOOD, GOOD, resamples=10), "resamples"),
    ("ratio seed float", lambda: ratio(GOOD, GOOD, seed=1.5), "seed"),  # type: ignore[arg-type]
    ("verdict min_ratio below 1", lambda: verdict(EST, 0.98), "min_ratio must be >= 1"),
    ("verdict min_ratio nan", lambda: verdict(EST, math.nan), "min_ratio"),
    ("verdict not an estimate", lambda: verdict(1.1, 1.05), "Estimate"),  # type: ignore[arg-type]
    ("steady empty", lambda: steady_state([], 0.05), "empty"),
    ("steady negative pass", lambda: steady_state([1.0, -1.0], 0.05), "positive"),
    ("steady tolerance", lambda: steady_state(GOOD, -0.1), "tolerance"),
    ("precise target", lambda: precise_enough(EST, 0.0), "target_half_width"),
    ("precise not an estimate", lambda: precise_enough(None, 0.02), "Estimate"),  # type: ignore[arg-type]
    ("t p", lambda: t_quantile(1.0, 3), "p must"),
    ("t df", lambda: t_quantile(0.9, 0), "df must"),
]


@pytest.mark.parametrize(
    ("call", "pattern"), [(c, p) for _, c, p in BAD_CALLS], ids=[n for n, _, _ in BAD_CALLS]
)
def test_bad_input_is_one_clear_sentence(call: Callable[[], object], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern) as info:
        call()
    message = str(info.value)
    assert message.endswith(".") and "\n" not in message
    assert message.count(". ") == 0  # one sentence


def test_tiny_samples_give_honest_intervals() -> None:
    one = paired_ratio([1100.0], [1000.0])
    assert (one.value, one.lo, one.hi, one.n) == (pytest.approx(1.1), 0.0, math.inf, 1)
    assert verdict(one, 1.0) == "inconclusive"
    two = paired_ratio([1100.0, 1120.0], [1000.0, 1000.0])
    assert 0 < two.lo < two.value < two.hi < math.inf
    assert verdict(two, 1.05) == "inconclusive"  # t with df = 1 is wide
    assert ratio([1100.0], [1000.0, 1010.0]).hi == math.inf
    assert median_ci([5.0]).confidence == 0.0


def test_identical_ratios_give_a_zero_width_interval() -> None:
    est = paired_ratio([1020.0, 2040.0, 510.0, 1020.0, 3060.0], [1000.0, 2000.0, 500.0, 1000.0, 3000.0])
    assert est.lo == pytest.approx(1.02) and est.hi == pytest.approx(1.02)
