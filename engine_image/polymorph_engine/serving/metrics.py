"""Prometheus metrics of one serving engine, in a registry owned by that server (never the global one).

Contract: ``ServerMetrics`` accumulates per-request observations (prompt and generation token
counts, time to first token, inter-token latencies, outcome) and the number of requests in
flight, and renders them in the Prometheus text format. Every series carries the labels
``build`` (the id of the build serving when the request finished), ``model_deployment`` and
``track`` (``stable`` or ``canary``: the rollout analysis compares the two).

Exposed families (the operator's PromQL depends on these names):
- histograms ``polymorph_prompt_tokens``, ``polymorph_generation_tokens``,
  ``polymorph_time_to_first_token_seconds``, ``polymorph_inter_token_latency_seconds``;
- counters ``polymorph_requests_total{status, reason}``, one per completion request the engine
  answered: ``ok`` (reason ``stop`` or ``length``); ``cancelled`` (the client went away first);
  ``error``, the engine's fault: refused with 503 (``overloaded``: the admission queue was full,
  ``shutting_down``) or failed with 500 (``build_failed``: this request's step raised,
  ``batch_failed``: the whole batch's step raised, ``engine_stopped``); and ``invalid``, the
  client's fault (a 4xx, reason the error code, e.g. ``invalid_request``, ``model_not_found``),
  kept out of ``error`` so a client's bad requests never fail a canary. The ``ok``, ``error``
  and ``cancelled`` series exist from the start (at 0); ``polymorph_prompt_tokens_total``,
  ``polymorph_generation_tokens_total``;
- gauge ``polymorph_requests_in_flight``;
- counter ``polymorph_http_protocol_errors_total{reason}``: requests refused before routing
  because the client broke HTTP itself (``headers_too_large``: 431, ``bad_http``: 400);
- counters ``polymorph_trace_requests_total{outcome}`` (``written`` to the store, or ``dropped``
  because a write failed) and ``polymorph_trace_write_errors_total``, when traces are sampled:
  a trace that is lost is never silent;
- histogram ``polymorph_decode_batch_size`` (requests per decode step; shows batching at work).

The histogram and the counter of prompt tokens share a stem, which the stock metric classes
of prometheus_client refuse to register twice, so this module keeps its own thread-safe
accumulators and exposes them through one custom collector. It knows nothing about HTTP,
models or schedulers.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "HistogramData", "RequestObservation", "ServerMetrics"]

TOKEN_BUCKETS: tuple[float, ...] = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
TTFT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ITL_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5)
INITIAL_OUTCOMES: tuple[tuple[str, str], ...] = (
    ("ok", "stop"),
    ("ok", "length"),
    ("cancelled", "client_gone"),
    ("error", "overloaded"),
    ("error", "build_failed"),
    ("error", "batch_failed"),
)
"""``(status, reason)`` series exposed at 0 before anything happens, so rates start from zero."""


@dataclass
class HistogramData:
    """A Prometheus-style histogram: ``counts[i]`` observations fell in ``(bounds[i-1], bounds[i]]``,
    and the last count (one more than there are bounds) is the ``+Inf`` overflow."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``, as Prometheus exposes them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
        return out


@dataclass(frozen=True)
class RequestObservation:
    """What the server saw of one finished request. ``itls`` are the gaps between successive tokens.

    Only ``ok`` requests feed the histograms (a cut-short request would skew the shape); the
    tokens of ``cancelled`` ones still count in the token counters, since they were computed.
    """

    prompt_tokens: int
    generation_tokens: int
    ttft_s: float | None
    itls_s: Sequence[float]
    status: Literal["ok", "error", "cancelled"]
    reason: str = ""


@dataclass
class _Series:
    prompt: HistogramData = field(default_factory=lambda: HistogramData(TOKEN_BUCKETS))
    generation: HistogramData = field(default_factory=lambda: HistogramData(TOKEN_BUCKETS))
    ttft: HistogramData = field(default_factory=lambda: HistogramData(TTFT_BUCKETS))
    itl: HistogramData = field(default_factory=lambda: HistogramData(ITL_BUCKETS))
    outcomes: dict[tuple[str, str], int] = field(default_factory=lambda: {key: 0 for key in INITIAL_OUTCOMES})
    """Requests by ``(status, reason)``."""
    prompt_total: int = 0
    generation_total: int = 0


class ServerMetrics:
    """Thread-safe accumulators plus a private ``CollectorRegistry`` that renders them."""

    def __init__(self, build: str, model_deployment: str, track: str = "stable") -> None:
        self._lock = threading.Lock()
        self._build = build
        self.model_deployment = model_deployment
        self.track = track
        self._series: dict[str, _Series] = {build: _Series()}
        self._in_flight = 0
        self._batch = HistogramData(BATCH_BUCKETS)
        self._protocol_errors: dict[str, int] = {}
        self._trace: dict[str, int] | None = None
        self.trace_error: str | None = None
        """The last trace write's failure, or None once a write succeeds."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))

    @property
    def build(self) -> str:
        with self._lock:
            return self._build

    def set_build(self, build: str) -> None:
        """Label later observations with ``build``; series of earlier builds keep their values."""
        with self._lock:
            self._build = build
            self._series.setdefault(build, _Series())

    def request_started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def observe_batch(self, size: int) -> None:
        """Record how many requests one decode step ran together (0 when a step only prefilled)."""
        with self._lock:
            self._batch.observe(size)

    def request_finished(self, obs: RequestObservation) -> None:
        """Record a finished request and take it out of the in-flight gauge."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            s = self._series[self._build]
            key = (obs.status, obs.reason)
            s.outcomes[key] = s.outcomes.get(key, 0) + 1
            if obs.status == "error":
                return
            s.prompt_total += obs.prompt_tokens
            s.generation_total += obs.generation_tokens
            if obs.status == "cancelled":
                return
            s.prompt.observe(obs.prompt_tokens)
            s.generation.observe(obs.generation_tokens)
            if obs.ttft_s is not None:
                s.ttft.observe(obs.ttft_s)
            for gap in obs.itls_s:
                s.itl.observe(gap)

    def request_refused(self, http_status: int, reason: str) -> None:
        """Count a completion request answered with an error before it ever reached the engine.

        5xx refusals (the engine's fault: overload, shutdown) count as ``error``, 4xx ones (the
        client's) as ``invalid``; neither was in flight.
        """
        key = ("error" if http_status >= 500 else "invalid", reason)
        with self._lock:
            s = self._series[self._build]
            s.outcomes[key] = s.outcomes.get(key, 0) + 1

    def protocol_error(self, reason: str) -> None:
        """Count a request refused before routing because it broke HTTP (malformed, headers too large)."""
        with self._lock:
            self._protocol_errors[reason] = self._protocol_errors.get(reason, 0) + 1

    def protocol_errors(self, reason: str) -> int:
        with self._lock:
            return self._protocol_errors.get(reason, 0)

    def trace_enabled(self) -> None:
        """Traces are sampled: expose their counters (at 0) from now on."""
        with self._lock:
            self._trace = self._trace or {"written": 0, "dropped": 0, "write_errors": 0}

    def trace_written(self, requests: int, error: str | None = None) -> None:
        """Record one trace write of ``requests`` sampled requests: stored, or lost with ``error``."""
        with self._lock:
            trace = self._trace = self._trace or {"written": 0, "dropped": 0, "write_errors": 0}
            if error is None:
                trace["written"] += requests
            else:
                trace["dropped"] += requests
                trace["write_errors"] += 1
            self.trace_error = error

    def trace_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._trace or {})

    def count(self, status: str, reason: str | None = None) -> int:
        """Requests of the current build by ``status`` (and ``reason`` when given)."""
        with self._lock:
            outcomes = dict(self._series[self._build].outcomes)
        return sum(n for (st, why), n in outcomes.items() if st == status and reason in (None, why))

    def render(self) -> bytes:
        """The Prometheus text exposition of this server's registry."""
        return generate_latest(self.registry)

    def families(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = {b: _copy(s) for b, s in self._series.items()}
            in_flight = self._in_flight
            current = self._build
            batch = HistogramData(self._batch.bounds, list(self._batch.counts), self._batch.total)
            protocol = dict(self._protocol_errors)
            trace = dict(self._trace) if self._trace is not None else None
        md, tr = self.model_deployment, self.track
        labels = ["build", "model_deployment", "track"]
        hists = [
            ("polymorph_prompt_tokens", "Prompt tokens per request.", "prompt"),
            ("polymorph_generation_tokens", "Generated tokens per request.", "generation"),
            ("polymorph_time_to_first_token_seconds", "Time from arrival to the first token.", "ttft"),
            ("polymorph_inter_token_latency_seconds", "Time between successive tokens of a request.", "itl"),
        ]
        for name, doc, attr in hists:
            fam = HistogramMetricFamily(name, doc, labels=labels)
            for build, series in snapshot.items():
                h: HistogramData = getattr(series, attr)
                fam.add_metric([build, md, tr], h.cumulative(), h.total)
            yield fam
        requests = CounterMetricFamily(
            "polymorph_requests",
            "Answered completion requests by status and reason.",
            labels=[*labels, "status", "reason"],
        )
        prompt_total = CounterMetricFamily(
            "polymorph_prompt_tokens", "Prompt tokens processed.", labels=labels
        )
        gen_total = CounterMetricFamily("polymorph_generation_tokens", "Tokens generated.", labels=labels)
        for build, series in snapshot.items():
            for (status, reason), n in sorted(series.outcomes.items()):
                requests.add_metric([build, md, tr, status, reason], n)
            prompt_total.add_metric([build, md, tr], series.prompt_total)
            gen_total.add_metric([build, md, tr], series.generation_total)
        yield requests
        yield prompt_total
        yield gen_total
        batch_fam = HistogramMetricFamily(
            "polymorph_decode_batch_size", "Requests decoded together in one engine step.", labels=labels
        )
        batch_fam.add_metric([current, md, tr], batch.cumulative(), batch.total)
        yield batch_fam
        gauge = GaugeMetricFamily("polymorph_requests_in_flight", "Requests being served now.", labels=labels)
        gauge.add_metric([current, md, tr], in_flight)
        yield gauge
        bad = CounterMetricFamily(
            "polymorph_http_protocol_errors",
            "Requests refused before routing because the client broke HTTP, by reason.",
            labels=["model_deployment", "track", "reason"],
        )
        for reason, n in sorted(protocol.items()):
            bad.add_metric([md, tr, reason], n)
        yield bad
        if trace is not None:
            traced = CounterMetricFamily(
                "polymorph_trace_requests",
                "Sampled request shapes, by whether their trace was written to the store or dropped.",
                labels=["model_deployment", "track", "outcome"],
            )
            traced.add_metric([md, tr, "written"], trace["written"])
            traced.add_metric([md, tr, "dropped"], trace["dropped"])
            yield traced
            errors = CounterMetricFamily(
                "polymorph_trace_write_errors",
                "Trace writes the store refused.",
                labels=["model_deployment", "track"],
            )
            errors.add_metric([md, tr], trace["write_errors"])
            yield errors


def _copy(s: _Series) -> _Series:
    def h(x: HistogramData) -> HistogramData:
        return HistogramData(x.bounds, list(x.counts), x.total)

    return _Series(
        h(s.prompt),
        h(s.generation),
        h(s.ttft),
        h(s.itl),
        dict(s.outcomes),
        s.prompt_total,
        s.generation_total,
    )


class _Collector:
    """Adapter from ``ServerMetrics`` to the prometheus_client collector protocol."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self._metrics.families())
