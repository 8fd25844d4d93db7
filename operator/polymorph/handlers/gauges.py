"""Per-object gauges for dashboards and alerts, read from the status the handlers just wrote.

Owns ``observe_modeldeployment`` (after each ModelDeployment tick: the rollout's phase, step,
weights, start and expected duration, the analysis metrics that had no data, the drift
threshold, and each track's desired and ready replicas), ``observe_compilejob`` (after each
CompileJob tick: experiment counts, the best speedup, and a count of jobs that finished, by
phase), and ``forget_*`` (a deleted object's series go away with it). The status read is the
object's status with this tick's merge patch applied, so the gauges never lag a tick behind.

It decides nothing; it only mirrors status into ``OperatorMetrics``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, get_args

from pydantic import ValidationError

from polymorph.api import TERMINAL_PHASES, JobPhase, ModelDeploymentSpec, RolloutPhase, parse_duration
from polymorph.core.resources import LABEL_MODEL_DEPLOYMENT, canary_name
from polymorph.core.rollout import TERMINAL
from polymorph.handlers.observability import OperatorMetrics, drop

__all__ = [
    "expected_rollout_seconds",
    "forget_compilejob",
    "forget_modeldeployment",
    "merged",
    "observe_compilejob",
    "observe_modeldeployment",
]

PHASES: tuple[str, ...] = get_args(RolloutPhase)
JOB_TERMINAL: tuple[str, ...] = tuple(p for p in get_args(JobPhase) if p in TERMINAL_PHASES)
OUTCOMES: tuple[str, ...] = ("total", "passed", "rejected", "failed", "crashed", "timeout")


def merged(status: Mapping[str, Any] | None, patch: Mapping[str, Any] | None) -> dict[str, Any]:
    """``status`` with the JSON merge patch ``patch`` applied (None removes a key)."""
    out: dict[str, Any] = dict(status or {})
    for key, value in (patch or {}).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def expected_rollout_seconds(spec: ModelDeploymentSpec) -> float:
    """The least time a rollout that passes every analysis takes: each step holds for its pause,
    and at least one analysis interval (the first analysis comes one interval after it settles)."""
    interval = parse_duration(spec.rollout.analysis.interval)
    return sum(max(parse_duration(s.pause), interval) for s in spec.rollout.steps)


def _timestamp(value: Any) -> float | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _replicas(deployments: Any, key: tuple[str, str]) -> tuple[int, int]:
    """(desired, ready) replicas of one Deployment in the kopf index (0, 0 when absent)."""
    if deployments is None:
        return 0, 0
    for body in deployments.get(key, ()):
        spec, status = body.get("spec") or {}, body.get("status") or {}
        return int(spec.get("replicas") or 0), int(status.get("readyReplicas") or 0)
    return 0, 0


def observe_modeldeployment(
    metrics: OperatorMetrics, body: Mapping[str, Any], status_patch: Mapping[str, Any], deployments: Any
) -> None:
    """Mirror one ModelDeployment's rollout, analysis, drift threshold and replicas into gauges."""
    meta = body.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    status = merged(body.get("status"), status_patch)
    try:
        spec = ModelDeploymentSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        spec = None  # an invalid spec: its Degraded condition says why; no rollout runs
    state = status.get("rollout") or {}
    phase = str(state.get("phase") or "Idle")
    active = phase not in TERMINAL
    for p in PHASES:
        metrics.rollout_phase.labels(ns, name, p).set(1 if p == phase else 0)
    step = int(state.get("step") or 0)
    metrics.rollout_step.labels(ns, name).set(step + 1 if active else 0)
    metrics.rollout_weight.labels(ns, name).set(float(state.get("weight") or 0) if active else 0)
    metrics.rollout_actual_weight.labels(ns, name).set(float(state.get("actualWeight") or 0))
    started = _timestamp(state.get("startedAt"))
    if active and started is not None:
        metrics.rollout_started.labels(ns, name).set(started)
    else:
        drop(metrics.rollout_started, ns, name)
    if spec is not None:
        metrics.rollout_steps.labels(ns, name).set(len(spec.rollout.steps))
        metrics.rollout_expected.labels(ns, name).set(expected_rollout_seconds(spec))
        metrics.drift_threshold.labels(ns, name).set(spec.recompile.driftThreshold)
    drop(metrics.analysis_nodata, ns, name)
    if phase in ("Progressing", "Paused"):
        for value in state.get("analysis") or []:
            metrics.analysis_nodata.labels(ns, name, str(value.get("name"))).set(
                1 if value.get("value") is None else 0
            )
    for track, deployment in (("stable", name), ("canary", canary_name(name))):
        want, ready = _replicas(deployments, (ns, deployment))
        metrics.serving_replicas.labels(ns, name, track, "desired").set(want)
        metrics.serving_replicas.labels(ns, name, track, "ready").set(ready)


def forget_modeldeployment(metrics: OperatorMetrics, namespace: str, name: str) -> None:
    """Remove every per-deployment series of a deleted ModelDeployment."""
    drop(metrics.drift, namespace, name)
    for gauge in metrics.per_deployment:
        drop(gauge, namespace, name)


def _deployment_of(body: Mapping[str, Any]) -> str:
    spec, meta = body.get("spec") or {}, body.get("metadata") or {}
    ref = (spec.get("deploymentRef") or {}).get("name")
    return str(ref or (meta.get("labels") or {}).get(LABEL_MODEL_DEPLOYMENT) or "")


def observe_compilejob(
    metrics: OperatorMetrics, body: Mapping[str, Any], status_patch: Mapping[str, Any]
) -> None:
    """Mirror one CompileJob's experiment counts and best speedup; count it once when it finishes."""
    meta = body.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    md = _deployment_of(body)
    for phase in JOB_TERMINAL:  # every phase's series exists from 0, so increase() sees the first one
        metrics.compilejobs_finished.labels(ns, phase)
    before = str((body.get("status") or {}).get("phase") or "Pending")
    status = merged(body.get("status"), status_patch)
    after = str(status.get("phase") or "Pending")
    if after in JOB_TERMINAL and before not in JOB_TERMINAL:
        metrics.compilejobs_finished.labels(ns, after).inc()
    counts = status.get("experiments") or {}
    for outcome in OUTCOMES:
        metrics.compilejob_experiments.labels(ns, name, md, outcome).set(int(counts.get(outcome) or 0))
    speedup = (status.get("best") or {}).get("speedup")
    if speedup is not None:
        metrics.compilejob_best_speedup.labels(ns, name, md).set(float(speedup))
    for phase in get_args(JobPhase):
        metrics.compilejob_phase.labels(ns, name, md, phase).set(1 if phase == after else 0)


def forget_compilejob(metrics: OperatorMetrics, body: Mapping[str, Any]) -> None:
    meta = body.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    for gauge in (metrics.compilejob_experiments, metrics.compilejob_best_speedup, metrics.compilejob_phase):
        drop(gauge, ns, name)
