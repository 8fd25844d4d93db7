"""Traffic drift: how far live traffic is from the profile a build was tuned for, in [0, 1], with reasons.

The metric. Each length histogram is compared by a capped earth mover's distance on a log2
token axis: match the two distributions quantile by quantile (the optimal transport in one
dimension), let each share of traffic count how many doublings it moved, capped at
``SATURATION_DOUBLINGS`` (3, an 8x change of length) and divided by it, and average over
the traffic. Without the cap this is the Wasserstein-1 distance in doublings, which the
reasons report. Mass sits at each bucket's upper bound, so two profiles with the same
bounds and counts score exactly 0, and histograms with different bucket bounds (a
CompileJob's hand-written profile against the engine's Prometheus buckets) still compare.
Concurrency (requests in flight per replica) is compared as the absolute log2 ratio over
the same saturation. The score is the largest of the three.

Why: what a build is tuned for depends on the *scale* of lengths and batch sizes (static
cache size, CUDA-graph batch sizes, attention block sizes), so moving from 256 to 512 tokens
is the same step as from 2048 to 4096. A log axis says exactly that; EMD says how much
traffic moved and how far, unlike bucket-wise distances that saturate as soon as two
histograms stop overlapping. Capping per request keeps the score linear in mixing: when half of
the traffic moves to a far-away (disjoint) profile, the score is 0.5, not 1. The maximum, not a mean, because one dimension moving a
long way is reason enough to recompile.

It knows nothing about Prometheus or Kubernetes; it gets two ``WorkloadProfile``s.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from polymorph.contract.api import Histogram, WorkloadProfile

__all__ = ["SATURATION_DOUBLINGS", "DriftResult", "emd_log2", "quantile_shift", "score"]

SATURATION_DOUBLINGS = 3.0
"""A shift of this many doublings (8x) in a histogram or in concurrency scores 1."""


@dataclass(frozen=True)
class DriftResult:
    """A drift score in [0, 1] and one sentence per dimension saying what moved and how far."""

    score: float
    reasons: list[str]
    components: dict[str, float]


def _cdf_points(h: Histogram) -> list[tuple[float, float]]:
    """``(cumulative share, log2 bound)`` per bucket, the share rising to 1."""
    total = float(sum(h.counts))
    out, running = [], 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        running += count
        if count:
            out.append((running / total, math.log2(bound)))
    return out


def _quantile(points: list[tuple[float, float]], u: float) -> float:
    """The smallest log2 length whose cumulative share reaches ``u``."""
    for share, x in points:
        if share >= u - 1e-12:
            return x
    return points[-1][1]


def quantile_shift(a: Histogram, b: Histogram) -> tuple[float, float]:
    """``(mean shift in doublings, capped score)`` between two length histograms.

    Both integrate over the traffic share u in [0, 1] the distance between the u-quantiles
    of ``a`` and ``b`` on a log2 axis: the mean shift uses it as is (this is the
    Wasserstein-1 distance), the score caps each request's move at ``SATURATION_DOUBLINGS``
    and divides by it, so it lies in [0, 1] and moves linearly as traffic mixes.
    """
    pa, pb = _cdf_points(a), _cdf_points(b)
    cuts = sorted({0.0, 1.0} | {share for share, _ in pa} | {share for share, _ in pb})
    shift = capped = 0.0
    for lo, hi in itertools.pairwise(cuts):
        if hi - lo <= 1e-12:
            continue
        mid = (lo + hi) / 2
        moved = abs(_quantile(pa, mid) - _quantile(pb, mid))
        shift += (hi - lo) * moved
        capped += (hi - lo) * min(moved, SATURATION_DOUBLINGS) / SATURATION_DOUBLINGS
    return shift, min(1.0, capped)


def emd_log2(a: Histogram, b: Histogram) -> float:
    """Wasserstein-1 distance between two length histograms on a log2 axis (in doublings)."""
    return quantile_shift(a, b)[0]


def _median(h: Histogram) -> int:
    total, running = sum(h.counts), 0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        running += count
        if running * 2 >= total:
            return bound
    return h.bounds[-1]


def score(tuned_for: WorkloadProfile, live: WorkloadProfile) -> DriftResult:
    """How far ``live`` traffic is from the profile a build was ``tuned_for``."""
    components: dict[str, float] = {}
    reasons: list[str] = []
    for field, label in (("inputTokens", "input length"), ("outputTokens", "output length")):
        a: Histogram = getattr(tuned_for, field)
        b: Histogram = getattr(live, field)
        distance, part = quantile_shift(a, b)
        components[field] = part
        reasons.append(
            f"{label} moved {distance:.2f} doublings (median {_median(a)} -> {_median(b)} tokens): {part:.2f}"
        )
    doublings = abs(math.log2(live.concurrency / tuned_for.concurrency))
    part = min(1.0, doublings / SATURATION_DOUBLINGS)
    components["concurrency"] = part
    reasons.append(
        f"concurrency {tuned_for.concurrency} -> {live.concurrency} per replica "
        f"({doublings:.2f} doublings): {part:.2f}"
    )
    total = max(components.values())
    # Order the reasons by how much each dimension contributed, largest first.
    order = sorted(range(3), key=lambda i: -list(components.values())[i])
    return DriftResult(round(total, 4), [reasons[i] for i in order], components)
