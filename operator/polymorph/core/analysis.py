"""Canary analysis: each metric's value beside its threshold range, and one verdict for the run.

Builtin metrics compare the canary track with the stable track, one sample per serving pod,
through ``polymorph.contract.stats.ratio`` (median ratio with a seeded bootstrap interval):
- ``outputTokensPerSecondRatio``: per-request decode speed, canary / stable. A pod's decode
  speed is 1 / (its mean inter-token latency) = tokens per second of one request stream.
  It does not depend on how many requests a track receives, so it stays meaningful when
  traffic is split by replicas: a track with 1 pod of 4 serves a quarter of the requests
  but decodes each of them at the speed its build allows. (Aggregate tok/s would just
  measure the replica split.) Higher is better.
- ``interTokenLatencyP95Ratio`` and ``timeToFirstTokenP95Ratio``: per-pod p95, canary / stable.
- ``errorRate``: the canary's errors / finished requests over the interval (no ratio).

A pod gives latency samples only once it has served a whole interval before the window
(``promql``: every sample covers the same window, and a pod's warm-up, its first interval,
is not judged); its requests and errors count from its first scrape.

Judging a value against ``thresholdRange`` (bounds included): Pass when the value is inside.
Outside, it is Fail when the violation is beyond noise, i.e. the whole confidence interval
is outside the range, or when no interval exists (fewer than two pods on a track, or a
custom query's single number); it is Inconclusive when the interval still reaches into the
range. A metric with no data (no series for a track, a query returning nothing) counts as
``noDataPolicy`` says. The run's verdict is Fail if any metric fails, else Inconclusive if
any is inconclusive, else Pass. Prometheus being unreachable is not "no data": the caller
makes no run at all, so no decision is ever made on missing numbers.

It knows nothing about Prometheus or Kubernetes: it gets parsed samples and numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from polymorph.contract.api import AnalysisSpec, AnalysisValue
from polymorph.contract.api.deployment_status import AnalysisSamples, Verdict
from polymorph.contract.api.modeldeployment import AnalysisMetric, ThresholdRange
from polymorph.contract.stats import Estimate, ratio
from polymorph.core.promql import TrackSamples

__all__ = ["AnalysisRun", "MetricResult", "builtin_estimate", "judge", "run_analysis"]


@dataclass(frozen=True)
class MetricResult:
    """One metric of one run: the value, its interval (when there is one), the range and the verdict."""

    name: str
    value: float | None
    lo: float | None
    hi: float | None
    samples: tuple[int, int]
    """(canary pods, stable pods) behind a builtin ratio; (0, 0) for custom queries."""
    threshold: ThresholdRange
    verdict: Verdict
    no_data: bool

    def describe(self) -> str:
        """``throughput 0.91 [0.88, 0.93] (min 0.98): Fail``, for Events and status messages."""
        bounds = ", ".join(
            f"{k} {v:g}"
            for k, v in (("min", self.threshold.min), ("max", self.threshold.max))
            if v is not None
        )
        if self.value is None:
            return f"{self.name} no data ({bounds}): {self.verdict}"
        interval = f" [{self.lo:.4g}, {self.hi:.4g}]" if self.lo is not None and self.hi is not None else ""
        return f"{self.name} {self.value:.4g}{interval} ({bounds}): {self.verdict}"

    def status(self, at: datetime) -> AnalysisValue:
        canary, stable = self.samples
        return AnalysisValue(
            name=self.name,
            value=None if self.value is None else round(self.value, 6),
            lo=None if self.lo is None else round(self.lo, 6),
            hi=None if self.hi is None else round(self.hi, 6),
            samples=AnalysisSamples(canary=canary, stable=stable) if canary or stable else None,
            min=self.threshold.min,
            max=self.threshold.max,
            verdict=self.verdict,
            measuredAt=at,
        )


@dataclass(frozen=True)
class AnalysisRun:
    """Every metric of one analysis run, its verdict and when it was measured."""

    verdict: Verdict
    metrics: tuple[MetricResult, ...]
    at: datetime

    def describe(self) -> str:
        return "; ".join(m.describe() for m in self.metrics) or "no metrics configured"


def builtin_estimate(
    metric: str, canary: TrackSamples | None, stable: TrackSamples | None
) -> tuple[Estimate | None, float | None, tuple[int, int]]:
    """``(ratio estimate, plain value, (canary n, stable n))`` of a builtin metric; both None without data."""
    if metric == "errorRate":
        if canary is None or canary.requests <= 0:
            return None, None, (0, 0)
        return None, canary.errors / canary.requests, (1, 0)
    pick = {
        "outputTokensPerSecondRatio": lambda t: [1.0 / x for x in t.itl_mean_s],
        "interTokenLatencyP95Ratio": lambda t: list(t.itl_p95_s),
        "timeToFirstTokenP95Ratio": lambda t: list(t.ttft_p95_s),
    }[metric]
    c = pick(canary) if canary is not None else []
    s = pick(stable) if stable is not None else []
    if not c or not s:
        return None, None, (len(c), len(s))
    est = ratio(c, s)
    return est, est.value, (len(c), len(s))


def judge(value: float, lo: float | None, hi: float | None, threshold: ThresholdRange) -> Verdict:
    """Pass inside the range; outside, Fail beyond noise (or with no interval), else Inconclusive."""
    if threshold.contains(value):
        return "Pass"
    if lo is None or hi is None or not math.isfinite(hi):
        return "Fail"
    below = threshold.min is not None and hi < threshold.min
    above = threshold.max is not None and lo > threshold.max
    return "Fail" if below or above else "Inconclusive"


def _no_data(metric: AnalysisMetric, policy: str, samples: tuple[int, int]) -> MetricResult:
    verdict: Verdict = (
        "Inconclusive" if policy == "Inconclusive" else ("Pass" if policy == "Pass" else "Fail")
    )
    return MetricResult(metric.name, None, None, None, samples, metric.thresholdRange, verdict, True)


def run_analysis(
    spec: AnalysisSpec,
    tracks: Mapping[str, TrackSamples] | None,
    custom: Mapping[str, float | None],
    at: datetime,
) -> AnalysisRun:
    """One analysis run from a deployment's per-track samples and its custom queries' numbers.

    ``tracks`` is this deployment's entry of ``promql.parse_analysis`` (None: no series at all);
    ``custom`` maps each custom metric's name to its number (None: no data).
    """
    tracks = tracks or {}
    results: list[MetricResult] = []
    for metric in spec.metrics:
        if metric.builtin is not None:
            est, value, n = builtin_estimate(metric.builtin, tracks.get("canary"), tracks.get("stable"))
            if value is None:
                results.append(_no_data(metric, spec.noDataPolicy, n))
                continue
            lo, hi = (est.lo, est.hi) if est is not None and est.n >= 2 else (None, None)
        else:
            value, n = custom.get(metric.name), (0, 0)
            if value is None:
                results.append(_no_data(metric, spec.noDataPolicy, n))
                continue
            lo = hi = None
        verdict = judge(value, lo, hi, metric.thresholdRange)
        results.append(MetricResult(metric.name, value, lo, hi, n, metric.thresholdRange, verdict, False))
    verdicts = {r.verdict for r in results}
    overall: Verdict = (
        "Fail" if "Fail" in verdicts else ("Inconclusive" if "Inconclusive" in verdicts else "Pass")
    )
    return AnalysisRun(overall, tuple(results), at)
