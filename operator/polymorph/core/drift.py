"""Traffic drift: how far live traffic is from the profile a build was tuned for, in [0, 1], with reasons.

The metric. Each length histogram is compared by the earth mover's (Wasserstein-1) distance
between the two distributions on a log2 token axis: the area between their cumulative
distributions, in doublings. Mass sits at each bucket's upper bound, so two profiles with
the same bounds and counts score exactly 0, and histograms with different bucket bounds (a
CompileJob's hand-written profile against the engine's Prometheus buckets) still compare.
The distance is divided by ``SATURATION_DOUBLINGS`` (3, an 8x change of the typical length)
and clipped to 1. Concurrency (requests in flight per replica) is compared the same way:
the absolute log2 ratio over the same saturation. The score is the largest of the three.

Why: what a build is tuned for depends on the *scale* of lengths and batch sizes (static
cache size, CUDA-graph batch sizes, attention block sizes), so moving from 256 to 512 tokens
is the same step as from 2048 to 4096. A log axis says exactly that; EMD says how much
traffic moved and how far, unlike bucket-wise distances that saturate as soon as two
histograms stop overlapping. The score is linear in mixing: traffic half-way from A to a
profile B scores half of A vs B. The maximum, not a mean, because one dimension moving a
long way is reason enough to recompile.

It knows nothing about Prometheus or Kubernetes; it gets two ``WorkloadProfile``s.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from polymorph.api import Histogram, WorkloadProfile

__all__ = ["SATURATION_DOUBLINGS", "DriftResult", "emd_log2", "score"]

SATURATION_DOUBLINGS = 3.0
"""A shift of this many doublings (8x) in a histogram or in concurrency scores 1."""


@dataclass(frozen=True)
class DriftResult:
    """A drift score in [0, 1] and one sentence per dimension saying what moved and how far."""

    score: float
    reasons: list[str]
    components: dict[str, float]


def _cdf_points(h: Histogram) -> list[tuple[float, float]]:
    total = float(sum(h.counts))
    out, running = [], 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        running += count
        out.append((math.log2(bound), running / total))
    return out


def emd_log2(a: Histogram, b: Histogram) -> float:
    """Wasserstein-1 distance between two length histograms on a log2 axis (in doublings)."""
    pa, pb = _cdf_points(a), _cdf_points(b)
    xs = sorted({x for x, _ in pa} | {x for x, _ in pb})

    def cdf(points: list[tuple[float, float]], x: float) -> float:
        value = 0.0
        for px, p in points:
            if px <= x:
                value = p
            else:
                break
        return value

    return sum(abs(cdf(pa, lo) - cdf(pb, lo)) * (hi - lo) for lo, hi in itertools.pairwise(xs))


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
        distance = emd_log2(a, b)
        part = min(1.0, distance / SATURATION_DOUBLINGS)
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
