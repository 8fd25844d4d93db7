"""Table tests of the drift score: identical profiles score 0, disjoint ones 1, mixtures in between."""

from __future__ import annotations

import pytest

from polymorph.contract.api import Histogram, WorkloadProfile
from polymorph.core.drift import SATURATION_DOUBLINGS, emd_log2, score

BOUNDS = [128, 512, 2048, 8192]


def profile(
    inp: list[int], out: list[int], concurrency: int = 8, bounds: list[int] = BOUNDS
) -> WorkloadProfile:
    return WorkloadProfile(
        inputTokens=Histogram(bounds=bounds, counts=inp),
        outputTokens=Histogram(bounds=[64, 256, 1024], counts=out),
        concurrency=concurrency,
    )


SHORT = profile([100, 0, 0, 0], [100, 0, 0])
LONG = profile([0, 0, 0, 100], [0, 0, 100])
HALF = profile([50, 0, 0, 50], [50, 0, 50])


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (SHORT, SHORT, 0.0),
        (profile([40, 30, 20, 10], [50, 40, 10]), profile([40, 30, 20, 10], [50, 40, 10]), 0.0),
        # Counts scaled by a constant are the same distribution.
        (profile([4, 3, 2, 1], [5, 4, 1]), profile([400, 300, 200, 100], [500, 400, 100]), 0.0),
        (SHORT, LONG, 1.0),  # 128 -> 8192 tokens is 6 doublings: saturated
        (SHORT, HALF, 0.5),  # half of the traffic moved all the way
        (LONG, HALF, 0.5),
    ],
)
def test_score_table(a: WorkloadProfile, b: WorkloadProfile, expected: float) -> None:
    result = score(a, b)
    assert result.score == pytest.approx(expected, abs=1e-9)
    assert 0.0 <= result.score <= 1.0
    assert len(result.reasons) == 3


def test_half_way_lies_strictly_between() -> None:
    near = profile([0, 100, 0, 0], [100, 0, 0])  # 128 -> 512: 2 doublings of 3
    quarter = profile([75, 25, 0, 0], [100, 0, 0])
    assert 0 < score(SHORT, quarter).score < score(SHORT, near).score < 1
    assert score(SHORT, near).score == pytest.approx(2 / SATURATION_DOUBLINGS, abs=1e-4)


def test_symmetric_and_monotone_in_mixing() -> None:
    scores = []
    for moved in (0, 10, 25, 50, 75, 100):
        mixed = profile([100 - moved, 0, 0, moved] if moved < 100 else [0, 0, 0, 100], [100, 0, 0])
        scores.append(score(SHORT, mixed).score)
        assert score(SHORT, mixed).score == pytest.approx(score(mixed, SHORT).score)
    assert scores == sorted(scores)
    assert scores[0] == 0 and scores[-1] == 1


def test_concurrency_change_is_a_reason() -> None:
    result = score(
        profile([1, 0, 0, 0], [1, 0, 0], concurrency=4), profile([1, 0, 0, 0], [1, 0, 0], concurrency=16)
    )
    assert result.score == pytest.approx(2 / 3, abs=1e-3)
    assert result.reasons[0].startswith("concurrency 4 -> 16")
    assert result.components["inputTokens"] == 0


def test_reasons_name_the_histogram_and_distance() -> None:
    result = score(SHORT, profile([0, 100, 0, 0], [100, 0, 0]))
    assert result.reasons[0] == "input length moved 2.00 doublings (median 128 -> 512 tokens): 0.67"


def test_different_bucket_bounds_compare() -> None:
    # The same traffic described with the engine's finer buckets is (almost) no drift.
    coarse = profile([0, 100, 0, 0], [100, 0, 0])
    fine = profile([0, 0, 100, 0, 0], [100, 0, 0], bounds=[128, 256, 512, 1024, 2048])
    assert score(coarse, fine).score == 0.0
    assert emd_log2(coarse.inputTokens, fine.inputTokens) == 0.0
