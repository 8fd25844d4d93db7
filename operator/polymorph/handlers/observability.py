"""The operator's own telemetry: structlog JSON logs and its /metrics.

Owns:
- ``configure_logging``: every log line, the operator's and kopf's, is one JSON object with
  ``namespace`` and ``name`` when it is about an object (kopf's object loggers carry the
  object in ``record.k8s_ref``; our handlers bind it with ``object_log``).
- ``OperatorMetrics``: a private registry served on ``--metrics-port``: reconciles by kind
  and result, drift scores, rollouts by phase, Prometheus queries and errors, drift cycle
  time and CompileJobs opened.

It knows nothing about what the handlers decide.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["OperatorMetrics", "configure_logging", "object_log"]


def _kopf_object(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Lift namespace and name out of a kopf object logger's record."""
    record = event.get("_record")
    ref = getattr(record, "k8s_ref", None) if record is not None else None
    if isinstance(ref, dict):
        event.setdefault("namespace", ref.get("namespace"))
        event.setdefault("name", ref.get("name"))
        event.setdefault("kind", ref.get("kind"))
    return event


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr for structlog and stdlib (kopf) loggers alike."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _kopf_object],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if level != "debug":
        # kopf logs every successful timer run; our handlers log their decisions themselves.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def object_log(namespace: str | None, name: str | None, kind: str) -> Any:
    """A logger whose every line names the object."""
    return structlog.get_logger("polymorph.operator").bind(namespace=namespace, name=name, kind=kind)


class OperatorMetrics:
    """The operator's metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter(
            "polymorph_operator_reconciles",
            "Handler runs by kind and result.",
            ["kind", "handler", "result"],
            registry=r,
        )
        self.drift = Gauge(
            "polymorph_operator_drift_score",
            "Latest drift score per deployment.",
            ["namespace", "model_deployment"],
            registry=r,
        )
        self.rollouts = Gauge(
            "polymorph_operator_rollouts", "Deployments by rollout phase.", ["phase"], registry=r
        )
        self.prometheus_queries = Counter(
            "polymorph_operator_prometheus_queries",
            "PromQL queries sent, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.prometheus_errors = Counter(
            "polymorph_operator_prometheus_errors", "PromQL queries that got no answer.", registry=r
        )
        self.drift_cycle = Histogram(
            "polymorph_operator_drift_cycle_seconds",
            "Wall time of one fleet drift cycle.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.drift_cycle_queries = Gauge(
            "polymorph_operator_drift_cycle_queries", "PromQL queries of the last drift cycle.", registry=r
        )
        self.compilejobs_opened = Counter(
            "polymorph_operator_compilejobs_opened", "CompileJobs opened on drift.", registry=r
        )

    def on_query(self, ok: bool) -> None:
        self.prometheus_queries.labels("ok" if ok else "error").inc()
        if not ok:
            self.prometheus_errors.inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
