"""The operator's own telemetry: structlog JSON logs and its /metrics.

Owns:
- ``configure_logging``: every log line, the operator's and kopf's, is one JSON object with
  ``namespace`` and ``name`` when it is about an object (kopf's object loggers carry the
  object in ``record.k8s_ref``; our handlers bind it with ``object_log``).
- ``OperatorMetrics``: a private registry served on ``--metrics-port``: reconciles by kind
  and result, drift scores and thresholds, rollouts by phase, Prometheus queries and errors,
  drift cycle time and CompileJobs opened; per deployment the rollout's phase, step, weight,
  start and expected time, analysis metrics without data and replicas per track; per
  CompileJob its experiments, best speedup and phase, and CompileJobs finished by phase
  (``handlers.gauges`` fills these from status). ``drop`` removes a labelled metric's series
  whose first label values match.

It knows nothing about what the handlers decide.
"""

from __future__ import annotations

import logging
import sys

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["OperatorMetrics", "configure_logging", "drop", "object_log", "one_line_exception"]


def _kopf_object(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """Lift namespace and name out of a kopf object logger's record."""
    record = event.get("_record")
    ref = getattr(record, "k8s_ref", None) if record is not None else None
    if isinstance(ref, dict):
        event.setdefault("namespace", ref.get("namespace"))
        event.setdefault("name", ref.get("name"))
        event.setdefault("kind", ref.get("kind"))
    return event


def one_line_exception(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """An exception in a log line becomes ``"error": "Type: message"`` (one line, at most 300
    characters), never a traceback: a JSON line holds no stack, and no input a client sent is
    echoed at length. ``--log-level debug`` keeps full tracebacks."""
    exc_info = event.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    if isinstance(exc_info, BaseException):
        exc = exc_info
    elif isinstance(exc_info, tuple) and len(exc_info) == 3:
        exc = exc_info[1]
    else:
        return event
    if exc is not None:
        text = " ".join(str(exc).split())
        error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        event.setdefault("error", error[:300])
    return event


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr for structlog and stdlib (kopf) loggers alike; exceptions are one
    ``error`` field (``one_line_exception``) unless ``level`` is ``debug``."""
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _kopf_object],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if level == "debug" else one_line_exception,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "urllib3", "kubernetes", "botocore", "boto3"):
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


def object_log(namespace: str | None, name: str | None, kind: str) -> structlog.stdlib.BoundLogger:
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
        md = ["namespace", "model_deployment"]
        self.drift_threshold = Gauge(
            "polymorph_operator_drift_threshold",
            "spec.recompile.driftThreshold per deployment: a drift score at or above it opens a CompileJob.",
            md,
            registry=r,
        )
        self.rollout_phase = Gauge(
            "polymorph_operator_rollout_phase",
            "1 for the deployment's current rollout phase, 0 for every other phase.",
            [*md, "phase"],
            registry=r,
        )
        self.rollout_step = Gauge(
            "polymorph_operator_rollout_step",
            "The rollout's current canary step, from 1 (0 when no rollout is in progress).",
            md,
            registry=r,
        )
        self.rollout_steps = Gauge(
            "polymorph_operator_rollout_steps", "Canary steps in spec.rollout.steps.", md, registry=r
        )
        self.rollout_weight = Gauge(
            "polymorph_operator_rollout_weight_percent",
            "Desired canary weight of the current step (0 when no rollout is in progress).",
            md,
            registry=r,
        )
        self.rollout_actual_weight = Gauge(
            "polymorph_operator_rollout_actual_weight_percent",
            "The canary's share of ready serving replicas.",
            md,
            registry=r,
        )
        self.rollout_started = Gauge(
            "polymorph_operator_rollout_started_timestamp_seconds",
            "When the rollout in progress started (absent when none is).",
            md,
            registry=r,
        )
        self.rollout_expected = Gauge(
            "polymorph_operator_rollout_expected_seconds",
            "The least time a rollout takes when every analysis passes: each step's max(pause, interval).",
            md,
            registry=r,
        )
        self.analysis_nodata = Gauge(
            "polymorph_operator_analysis_nodata",
            "1 when the current step's latest analysis had no data for the metric (during a rollout).",
            [*md, "metric"],
            registry=r,
        )
        self.serving_replicas = Gauge(
            "polymorph_operator_serving_replicas",
            "Serving replicas per track, desired and ready.",
            [*md, "track", "state"],
            registry=r,
        )
        cj = ["namespace", "compilejob", "model_deployment"]
        self.compilejob_experiments = Gauge(
            "polymorph_operator_compilejob_experiments",
            "A CompileJob's experiments so far, by outcome (total, passed, rejected, failed, crashed, timeout).",
            [*cj, "outcome"],
            registry=r,
        )
        self.compilejob_best_speedup = Gauge(
            "polymorph_operator_compilejob_best_speedup",
            "A CompileJob's best build's speedup over its baseline (absent until one passed).",
            cj,
            registry=r,
        )
        self.compilejob_phase = Gauge(
            "polymorph_operator_compilejob_phase",
            "1 for a CompileJob's current phase, 0 for every other phase.",
            [*cj, "phase"],
            registry=r,
        )
        self.compilejobs_finished = Counter(
            "polymorph_operator_compilejobs_finished",
            "CompileJobs that reached a terminal phase, by phase.",
            ["namespace", "phase"],
            registry=r,
        )
        self.per_deployment: tuple[Gauge, ...] = (
            self.drift_threshold,
            self.rollout_phase,
            self.rollout_step,
            self.rollout_steps,
            self.rollout_weight,
            self.rollout_actual_weight,
            self.rollout_started,
            self.rollout_expected,
            self.analysis_nodata,
            self.serving_replicas,
        )
        """The series ``observe_modeldeployment`` keeps per (namespace, model_deployment)."""

    def on_query(self, ok: bool) -> None:
        self.prometheus_queries.labels("ok" if ok else "error").inc()
        if not ok:
            self.prometheus_errors.inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)


def drop(metric: Gauge | Counter, *prefix: str) -> None:
    """Remove every series of ``metric`` whose first label values are ``prefix``."""
    names = metric._labelnames  # prometheus_client has no public accessor for them
    for family in metric.collect():
        for sample in family.samples:
            values = tuple(sample.labels.get(n, "") for n in names)
            if values[: len(prefix)] == tuple(prefix):
                metric.remove(*values)
