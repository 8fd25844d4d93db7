"""PromQL for the whole fleet: a fixed handful of queries, and turning their results into profiles and samples.

Owns: the query texts (over the engine's metric names, see ``polymorph_engine`` serving
metrics: ``polymorph_prompt_tokens``, ``polymorph_generation_tokens``,
``polymorph_inter_token_latency_seconds``, ``polymorph_time_to_first_token_seconds``
histograms, ``polymorph_requests_total`` and ``polymorph_requests_in_flight``), the
substitution of ``{{name}}``, ``{{namespace}}`` and ``{{interval}}`` in custom queries, and
parsing instant-vector results (``(labels, value)`` pairs) into per-deployment data.

Traffic profiles use three queries per distinct ``recompile.window`` and the builtin
analysis metrics four per distinct ``analysis.interval``, whatever the number of
deployments: every query is grouped by ``namespace, model_deployment`` (and ``track`` and
``instance`` for analysis, so each serving pod is one sample for the statistics).

A pod's latency samples (mean and p95 inter-token latency, p95 time to first token) come
only from pods first scraped at least two intervals ago: each has served the whole window,
so every pod's sample covers the same one, and it served a whole interval before it, its
warm-up, which is not judged. A pod that has just become ready shares its first seconds with
its own start-up: on the e2e's two shared cores, three canaries of builds 1.4-1.6x faster
decoded at the stable pods' speed for their first 5-10 s, then 1.3-1.6x faster. So the first
step of a rollout has no canary latency data for an interval or two (no data: ``noDataPolicy``);
a later step still has the pods of the steps before it. Request and error counts take every
pod from its first scrape: an error is never warm-up.

It knows nothing about HTTP or the Prometheus client; it builds strings and reads numbers.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from polymorph.contract.api import Histogram, WorkloadProfile

__all__ = [
    "ANALYSIS_QUERIES",
    "PROFILE_QUERIES",
    "DeploymentKey",
    "LiveProfile",
    "Series",
    "TrackSamples",
    "analysis_queries",
    "parse_analysis",
    "parse_profiles",
    "profile_queries",
    "scalar",
    "substitute",
]

Series = tuple[dict[str, str], float]
"""One element of an instant vector: its labels and its value."""
DeploymentKey = tuple[str, str]
"""``(namespace, model_deployment)``."""

_DEPLOYMENT = "namespace, model_deployment"
_POD = "namespace, model_deployment, track, instance"
_SELECT = '{model_deployment!=""}'
PROFILE_QUERIES = ("prompt", "generation", "concurrency")
ANALYSIS_QUERIES = ("itlMean", "itlP95", "ttftP95", "requests")
# The +Inf bucket of a token histogram is put at twice the last finite bound.
_INF_FACTOR = 2


def profile_queries(window: str) -> dict[str, str]:
    """The three queries whose results give every deployment's traffic profile over ``window``."""

    def buckets(metric: str) -> str:
        return f"sum by ({_DEPLOYMENT}, le) (increase({metric}_bucket{_SELECT}[{window}]))"

    return {
        "prompt": buckets("polymorph_prompt_tokens"),
        "generation": buckets("polymorph_generation_tokens"),
        # Requests in flight per replica, averaged over the window: the engine's concurrency.
        "concurrency": f"avg by ({_DEPLOYMENT}) (avg_over_time(polymorph_requests_in_flight{_SELECT}[{window}]))",
    }


def analysis_queries(interval: str) -> dict[str, str]:
    """The four per-pod queries behind every builtin analysis metric, over ``interval``."""

    def rate(metric: str) -> str:
        return f"rate({metric}{_SELECT}[{interval}])"

    # Pods scraped at least two intervals ago: warmed up for an interval before the window. Every
    # engine exposes the in-flight gauge from its first scrape on, whatever its traffic.
    serving = f"group by ({_POD}) (polymorph_requests_in_flight{_SELECT} offset {_twice(interval)})"

    def whole(query: str) -> str:
        return f"({query}) and on ({_POD}) {serving}"

    itl = "polymorph_inter_token_latency_seconds"
    ttft = "polymorph_time_to_first_token_seconds"
    return {
        # Mean gap between tokens of one request; its inverse is per-request decode speed.
        "itlMean": whole(
            f"sum by ({_POD}) ({rate(itl + '_sum')}) / sum by ({_POD}) ({rate(itl + '_count')})"
        ),
        "itlP95": whole(f"histogram_quantile(0.95, sum by ({_POD}, le) ({rate(itl + '_bucket')}))"),
        "ttftP95": whole(f"histogram_quantile(0.95, sum by ({_POD}, le) ({rate(ttft + '_bucket')}))"),
        "requests": f"sum by ({_POD}, status) (increase(polymorph_requests_total{_SELECT}[{interval}]))",
    }


def _twice(interval: str) -> str:
    """``interval`` doubled, in its own unit (``8s`` -> ``16s``, ``1m`` -> ``2m``)."""
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d)", interval)
    if match is None:
        raise ValueError(f"{interval!r} is not a duration of one number and one unit, such as 30s or 1m")
    return f"{2 * int(match.group(1))}{match.group(2)}"


def substitute(query: str, *, name: str, namespace: str, interval: str) -> str:
    """A custom analysis query with ``{{name}}``, ``{{namespace}}`` and ``{{interval}}`` filled in."""
    return (
        query.replace("{{name}}", name).replace("{{namespace}}", namespace).replace("{{interval}}", interval)
    )


def scalar(result: Sequence[Series]) -> float | None:
    """The one number of a custom query's result, or None (no series, several, or NaN)."""
    if len(result) != 1:
        return None
    value = result[0][1]
    return None if math.isnan(value) or math.isinf(value) else value


def _key(labels: dict[str, str]) -> DeploymentKey | None:
    ns, md = labels.get("namespace"), labels.get("model_deployment")
    return (ns, md) if ns and md else None


def _histogram(cumulative: dict[float, float]) -> tuple[Histogram | None, int]:
    """Per-bucket counts from Prometheus' cumulative ``le`` buckets; (None, 0) when empty."""
    finite = sorted(le for le in cumulative if not math.isinf(le))
    if not finite:
        return None, 0
    bounds, counts, previous = [], [], 0.0
    for le in finite:
        value = max(cumulative[le], previous)
        bounds.append(max(1, int(le)))
        counts.append(max(0, round(value - previous)))
        previous = value
    total = cumulative.get(math.inf, previous)
    bounds.append(max(bounds[-1] + 1, bounds[-1] * _INF_FACTOR))
    counts.append(max(0, round(max(total, previous) - previous)))
    requests = sum(counts)
    if requests <= 0:
        return None, 0
    first = next(i for i, c in enumerate(counts) if c > 0)
    last = max(i for i, c in enumerate(counts) if c > 0)
    # Merge duplicate bounds that int() may create from fractional les.
    merged: dict[int, int] = {}
    for b, c in zip(bounds[first : last + 1], counts[first : last + 1], strict=True):
        merged[b] = merged.get(b, 0) + c
    return Histogram(bounds=list(merged), counts=list(merged.values())), requests


@dataclass(frozen=True)
class LiveProfile:
    """A deployment's live traffic: its profile and the number of requests it is drawn from."""

    profile: WorkloadProfile
    requests: int


def parse_profiles(results: Mapping[str, Sequence[Series]]) -> dict[DeploymentKey, LiveProfile]:
    """Every deployment's live profile from the results of ``profile_queries`` (those with traffic)."""
    buckets: dict[str, dict[DeploymentKey, dict[float, float]]] = {
        "prompt": defaultdict(dict),
        "generation": defaultdict(dict),
    }
    for name in buckets:
        for labels, value in results.get(name, ()):
            key = _key(labels)
            if key is None or "le" not in labels or math.isnan(value):
                continue
            buckets[name][key][float(labels["le"])] = value
    concurrency: dict[DeploymentKey, float] = {}
    for labels, value in results.get("concurrency", ()):
        key = _key(labels)
        if key is not None and not math.isnan(value):
            concurrency[key] = value
    out: dict[DeploymentKey, LiveProfile] = {}
    for key, prompt_buckets in buckets["prompt"].items():
        prompt, requests = _histogram(prompt_buckets)
        generation, _ = _histogram(buckets["generation"].get(key, {}))
        if prompt is None or generation is None:
            continue
        level = min(4096, max(1, round(concurrency.get(key, 1.0))))
        profile = WorkloadProfile(inputTokens=prompt, outputTokens=generation, concurrency=level)
        out[key] = LiveProfile(profile, requests)
    return out


@dataclass
class TrackSamples:
    """Per-pod values of one deployment's track (``stable`` or ``canary``) over one interval."""

    itl_mean_s: list[float] = field(default_factory=list)
    itl_p95_s: list[float] = field(default_factory=list)
    ttft_p95_s: list[float] = field(default_factory=list)
    requests: float = 0.0
    errors: float = 0.0


def _finite(values: Iterable[tuple[dict[str, str], float]]) -> Iterable[tuple[dict[str, str], float]]:
    return ((labels, v) for labels, v in values if not (math.isnan(v) or math.isinf(v)))


def parse_analysis(results: Mapping[str, Sequence[Series]]) -> dict[DeploymentKey, dict[str, TrackSamples]]:
    """``{(namespace, md): {track: TrackSamples}}`` from the results of ``analysis_queries``."""
    out: dict[DeploymentKey, dict[str, TrackSamples]] = defaultdict(dict)

    def track(labels: dict[str, str]) -> TrackSamples | None:
        key, name = _key(labels), labels.get("track")
        if key is None or name not in ("stable", "canary"):
            return None
        return out[key].setdefault(name, TrackSamples())

    for attr, query in (("itl_mean_s", "itlMean"), ("itl_p95_s", "itlP95"), ("ttft_p95_s", "ttftP95")):
        for labels, value in _finite(results.get(query, ())):
            samples = track(labels)
            if samples is not None and value > 0:
                getattr(samples, attr).append(value)
    for labels, value in _finite(results.get("requests", ())):
        samples = track(labels)
        if samples is None:
            continue
        if labels.get("status") in ("ok", "error"):
            samples.requests += value
        if labels.get("status") == "error":
            samples.errors += value
    return dict(out)
