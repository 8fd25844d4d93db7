"""Per-object gauges for dashboards and alerts, read from the status the handlers just wrote.

Owns ``observe_modeldeployment`` (after each ModelDeployment tick: the rollout's phase, step,
weights, start and expected duration, the analysis metrics that had no data, the drift
threshold, and each track's desired and ready replicas), ``observe_compilejob`` (after each
CompileJob tick: experiment counts, the best speedup, and a count of jobs that finished, by
phase), and ``forget_*`` (a deleted object's series go away with it). The status read is the
object's status with this tick's merge patch applied (``bodies.status_after``), so the gauges
never lag a tick behind.

It decides nothing; it only mirrors status into ``OperatorMetrics``.
"""

from __future__ import annotations

from typing import get_args

from polymorph.contract.api import (
    TERMINAL_PHASES,
    CompileJobStatus,
    ExperimentCounts,
    JobPhase,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    RolloutPhase,
    RolloutStatus,
    parse_duration,
)
from polymorph.core.resources import canary_name
from polymorph.core.rollout import TERMINAL
from polymorph.handlers.bodies import DeploymentIndex, indexed
from polymorph.handlers.observability import OperatorMetrics, drop

__all__ = [
    "expected_rollout_seconds",
    "forget_compilejob",
    "forget_modeldeployment",
    "observe_compilejob",
    "observe_modeldeployment",
]

PHASES: tuple[str, ...] = get_args(RolloutPhase)
JOB_TERMINAL: tuple[str, ...] = tuple(p for p in get_args(JobPhase) if p in TERMINAL_PHASES)
OUTCOMES: tuple[str, ...] = ("total", "passed", "rejected", "failed", "crashed", "timeout")


def expected_rollout_seconds(spec: ModelDeploymentSpec) -> float:
    """The least time a rollout that passes every analysis takes: each step holds for its pause,
    and at least one analysis interval (the first analysis comes one interval after it settles)."""
    interval = parse_duration(spec.rollout.analysis.interval)
    return sum(max(parse_duration(s.pause), interval) for s in spec.rollout.steps)


def _replicas(deployments: DeploymentIndex | None, key: tuple[str, str]) -> tuple[int, int]:
    """(desired, ready) replicas of one Deployment in the kopf index (0, 0 when absent)."""
    found = indexed(deployments, key)
    return (found.track.replicas, found.track.ready) if found is not None else (0, 0)


def observe_modeldeployment(
    metrics: OperatorMetrics,
    key: tuple[str, str],
    spec: ModelDeploymentSpec | None,
    status: ModelDeploymentStatus,
    deployments: DeploymentIndex | None,
) -> None:
    """Mirror one ModelDeployment's rollout, analysis, drift threshold and replicas into gauges.

    ``status`` is the status after this tick's patch; ``spec`` is None when it is invalid (its
    Degraded condition says why; no rollout runs)."""
    ns, name = key
    state = status.rollout or RolloutStatus()
    phase = state.phase
    active = phase not in TERMINAL
    for p in PHASES:
        metrics.rollout_phase.labels(ns, name, p).set(1 if p == phase else 0)
    metrics.rollout_step.labels(ns, name).set(state.step + 1 if active else 0)
    metrics.rollout_weight.labels(ns, name).set(float(state.weight or 0) if active else 0)
    metrics.rollout_actual_weight.labels(ns, name).set(float(state.actualWeight or 0))
    if active and state.startedAt is not None:
        metrics.rollout_started.labels(ns, name).set(state.startedAt.timestamp())
    else:
        drop(metrics.rollout_started, ns, name)
    if spec is not None:
        metrics.rollout_steps.labels(ns, name).set(len(spec.rollout.steps))
        metrics.rollout_expected.labels(ns, name).set(expected_rollout_seconds(spec))
        metrics.drift_threshold.labels(ns, name).set(spec.recompile.driftThreshold)
    drop(metrics.analysis_nodata, ns, name)
    if phase in ("Progressing", "Paused"):
        for value in state.analysis:
            metrics.analysis_nodata.labels(ns, name, value.name).set(1 if value.value is None else 0)
    for track, deployment in (("stable", name), ("canary", canary_name(name))):
        want, ready = _replicas(deployments, (ns, deployment))
        metrics.serving_replicas.labels(ns, name, track, "desired").set(want)
        metrics.serving_replicas.labels(ns, name, track, "ready").set(ready)


def forget_modeldeployment(metrics: OperatorMetrics, namespace: str, name: str) -> None:
    """Remove every per-deployment series of a deleted ModelDeployment."""
    drop(metrics.drift, namespace, name)
    for gauge in metrics.per_deployment:
        drop(gauge, namespace, name)


def observe_compilejob(
    metrics: OperatorMetrics,
    key: tuple[str, str],
    deployment: str,
    before: CompileJobStatus,
    after: CompileJobStatus,
) -> None:
    """Mirror one CompileJob's experiment counts and best speedup; count it once when it finishes.

    ``before`` is the status the body held, ``after`` the status once this tick's patch is applied;
    ``deployment`` is the ModelDeployment it compiles for ("" for a standalone job)."""
    ns, name = key
    for phase in JOB_TERMINAL:  # every phase's series exists from 0, so increase() sees the first one
        metrics.compilejobs_finished.labels(ns, phase)
    was, now = before.phase or "Pending", after.phase or "Pending"
    if now in JOB_TERMINAL and was not in JOB_TERMINAL:
        metrics.compilejobs_finished.labels(ns, now).inc()
    counts = after.experiments or ExperimentCounts()
    for outcome in OUTCOMES:
        metrics.compilejob_experiments.labels(ns, name, deployment, outcome).set(getattr(counts, outcome))
    if after.best is not None and after.best.speedup is not None:
        metrics.compilejob_best_speedup.labels(ns, name, deployment).set(after.best.speedup)
    for phase in get_args(JobPhase):
        metrics.compilejob_phase.labels(ns, name, deployment, phase).set(1 if phase == now else 0)


def forget_compilejob(metrics: OperatorMetrics, key: tuple[str, str]) -> None:
    for gauge in (metrics.compilejob_experiments, metrics.compilejob_best_speedup, metrics.compilejob_phase):
        drop(gauge, *key)
