"""What every handler shares: the seams, the settings, the clock, and the little state the fleet keeps.

Owns: ``Context`` (passed to kopf as its memo; kopf copies it shallowly per object, so
everything mutable lives in shared sub-objects), ``Health`` (whether Prometheus answered
last), ``AnalysisCache`` (the builtin analysis queries run once per interval for the whole
fleet and shared by every deployment's rollout tick) and ``Context.event`` (a core/v1 Event
about an ``ObjectRef``, posted through the Kubernetes seam). It knows nothing about what the handlers decide.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from polymorph.clients.kube import EVENTS, Kube, KubeError
from polymorph.clients.prometheus import CountingQuery, PrometheusUnavailable
from polymorph.contract.store import Store
from polymorph.core import promql
from polymorph.core.patch import JSON
from polymorph.core.promql import DeploymentKey, TrackSamples
from polymorph.handlers.bodies import ObjectRef
from polymorph.handlers.observability import OperatorMetrics, object_log
from polymorph.handlers.settings import OperatorConfig

__all__ = [
    "AnalysisCache",
    "Context",
    "Freshness",
    "Health",
    "event_manifest",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class Health:
    """Whether Prometheus answered the last query (None) or why not, and whether peering can work."""

    prometheus_error: str | None = None
    since: datetime | None = None
    peering_error: str | None = None
    """Why kopf pauses every watch (``handlers.peering``); /healthz fails while it is set."""

    def failed(self, why: str, now: datetime) -> None:
        if self.prometheus_error is None:
            self.since = now
        self.prometheus_error = why

    def ok(self) -> None:
        self.prometheus_error = None
        self.since = None


@dataclass
class AnalysisCache:
    """Fleet-wide analysis samples per interval, fetched at most once per ``max_age_s``."""

    max_age_s: float
    _entries: dict[str, tuple[float, dict[DeploymentKey, dict[str, TrackSamples]]]] = field(
        default_factory=dict
    )
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def samples(
        self, interval: str, query: CountingQuery, health: Health, now: datetime
    ) -> dict[DeploymentKey, dict[str, TrackSamples]]:
        lock = self._locks.setdefault(interval, asyncio.Lock())
        async with lock:
            entry = self._entries.get(interval)
            if entry is not None and time.monotonic() - entry[0] < self.max_age_s:
                return entry[1]
            results = {}
            try:
                for name, text in promql.analysis_queries(interval).items():
                    results[name] = await asyncio.to_thread(query, text)
            except PrometheusUnavailable as exc:
                health.failed(str(exc), now)
                raise
            health.ok()
            parsed = promql.parse_analysis(results)
            self._entries[interval] = (time.monotonic(), parsed)
            return parsed


@dataclass
class Freshness:
    """Never act twice on a stale body.

    kopf hands a handler the latest body it has seen; a timer can fire again before the watch
    delivers the status it just wrote. Every status write of a handler carries a sequence number
    (``status.polymorph.seq``); a body whose number is below the last one written is stale, and
    the tick is skipped (harmless: the next one sees the fresh body). After ``stale_after_s``
    the body is trusted again, so a lost write cannot block an object. One lock per object keeps
    a change handler and a timer of the same object from running at once.
    """

    stale_after_s: float
    _written: dict[tuple[str, str, str], tuple[int, float]] = field(default_factory=dict)
    _locks: dict[tuple[str, str, str], asyncio.Lock] = field(default_factory=dict)

    def lock(self, key: tuple[str, str, str]) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def is_stale(self, key: tuple[str, str, str], seq: int) -> bool:
        written = self._written.get(key)
        return written is not None and seq < written[0] and time.monotonic() - written[1] < self.stale_after_s

    def wrote(self, key: tuple[str, str, str], seq: int) -> None:
        self._written[key] = (seq, time.monotonic())

    def forget(self, key: tuple[str, str, str]) -> None:
        self._written.pop(key, None)
        self._locks.pop(key, None)


@dataclass
class Context:
    """The operator's shared context (kopf's memo)."""

    config: OperatorConfig
    kube: Kube
    query: CountingQuery
    store: Store
    metrics: OperatorMetrics
    health: Health
    analysis: AnalysisCache
    fresh: Freshness = field(default_factory=lambda: Freshness(stale_after_s=30.0))
    clock: Callable[[], datetime] = utcnow
    background: list[tuple[asyncio.Event, asyncio.Task[None]]] = field(default_factory=list)
    """The fleet loop's stop flag and task, started and stopped with the operator."""
    heartbeat: list[float] = field(default_factory=lambda: [0.0])
    """``time.monotonic()`` of the last per-object tick. kopf stops object timers on a standby
    replica (peering); the fleet loop runs only while they tick, so only the active replica acts."""

    def beat(self) -> None:
        self.heartbeat[0] = time.monotonic()

    def active(self, within_s: float) -> bool:
        return time.monotonic() - self.heartbeat[0] <= within_s

    def event(self, ref: ObjectRef, reason: str, message: str, type_: str = "Normal") -> None:
        """Post a Kubernetes Event about ``ref`` (a decision, with its numbers). A failure is logged, not raised."""
        doc = event_manifest(ref, reason, message, type_, self.clock())
        try:
            self.kube.create(EVENTS, ref.key[0], doc)
        except KubeError as exc:
            object_log(ref.namespace, ref.name, str(ref.kind)).warning(
                "could not post an Event", reason=reason, error=str(exc)
            )


def event_manifest(ref: ObjectRef, reason: str, message: str, type_: str, now: datetime) -> JSON:
    """A core/v1 Event about the object ``ref`` names."""
    stamp = now.isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref.name}.", "namespace": ref.key[0]},
        "involvedObject": {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
            "resourceVersion": ref.resource_version,
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "polymorph-operator"},
        "reportingComponent": "polymorph-operator",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
