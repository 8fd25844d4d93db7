"""ModelDeployment handlers: reconcile the children, run the rollout, keep status and conditions.

A tick (on create, update, resume, and every ``--rollout-interval``) gathers inputs, calls
the core and applies what it returns:
- the spec through pydantic (a spec the CRD admits but the model refuses sets Degraded with
  the one-sentence message; the change handler fails with ``PermanentError`` and the timer
  waits for a fix: no crash loop, no retry storm);
- the rollout state from ``status.rollout`` (the one typed record of it, ``core.rollout.from_status``);
  the stable and canary Deployments from
  the kopf index of the Deployments the operator owns; the analysis (only when due) from the
  fleet-wide analysis samples plus the deployment's custom queries;
- ``core.rollout.step`` -> the next state, Events and effects (promotion, history);
- ``core.resources`` -> the Deployments, written only when they differ from what is there;
- status: observedGeneration, activeBuild, ``status.rollout`` (``core.rollout.to_status``),
  history, the Ready/Compiling/RollingOut/Degraded conditions and the phase, and
  ``status.polymorph.seq`` (stale-body detection), patched only where it changed. It never
  writes spec.

It knows nothing about drift (``fleet``) or sandboxes (``compilejobs``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime

import kopf

from polymorph.clients.kube import DEPLOYMENTS, SERVICES, KubeError, apply, contains
from polymorph.clients.prometheus import PrometheusUnavailable
from polymorph.contract.api import (
    BuildStatus,
    ModelDeployment,
    ModelDeploymentStatus,
    RolloutRecord,
    RolloutStatus,
    parse_duration,
)
from polymorph.core import promql, rollout
from polymorph.core.analysis import AnalysisRun, run_analysis
from polymorph.core.conditions import (
    Progress,
    deployment_phase,
    deployment_progress,
    find,
    set_condition,
    set_progress,
)
from polymorph.core.patch import JSON, sequenced_patch
from polymorph.core.resources import (
    ANNOTATION_ABORT,
    ANNOTATION_APPROVE,
    canary_name,
    serving_deployment,
    serving_service,
)
from polymorph.handlers.bodies import (
    DeploymentIndex,
    ObjectRef,
    RawBody,
    ServingDeployment,
    indexed,
    lenient,
    object_ref,
    parse_modeldeployment,
    sequence,
    written_status,
)
from polymorph.handlers.context import Context
from polymorph.handlers.observability import object_log

__all__ = ["tick"]

HISTORY = 10


def _observation(
    md: ModelDeployment, now: datetime, active: str, deployments: DeploymentIndex | None
) -> rollout.Observation:
    spec, status = md.spec, md.status or ModelDeploymentStatus()
    ns, name = md.metadata.key
    annotations = md.metadata.annotations
    candidate = status.candidateBuild.id if status.candidateBuild is not None else None
    return rollout.Observation(
        now=now,
        replicas=spec.replicas,
        steps=tuple(rollout.Step(s.weight, parse_duration(s.pause)) for s in spec.rollout.steps),
        interval_s=parse_duration(spec.rollout.analysis.interval),
        failure_limit=spec.rollout.analysis.failureLimit,
        on_failure=spec.rollout.onFailure,
        active=active,
        candidate=None if spec.build.pinned else candidate,
        policy=spec.build.policy,
        stable=_track(indexed(deployments, (ns, name))),
        canary=_track(indexed(deployments, (ns, canary_name(name)))),
        abort=annotations.get(ANNOTATION_ABORT, "").lower() == "true",
        approved=annotations.get(ANNOTATION_APPROVE),
    )


async def _analysis(md: ModelDeployment, ctx: Context, now: datetime) -> AnalysisRun | None:
    """One analysis run, or None when Prometheus did not answer (no decision on missing numbers)."""
    spec = md.spec.rollout.analysis
    ns, name = md.metadata.key
    try:
        tracks = None
        if any(m.builtin for m in spec.metrics):
            fleet = await ctx.analysis.samples(spec.interval, ctx.query, ctx.health, now)
            tracks = fleet.get((ns, name))
        custom: dict[str, float | None] = {}
        for metric in spec.metrics:
            if metric.query is not None:
                text = promql.substitute(metric.query, name=name, namespace=ns, interval=spec.interval)
                custom[metric.name] = promql.scalar(await asyncio.to_thread(ctx.query, text))
        ctx.health.ok()
    except PrometheusUnavailable as exc:
        ctx.health.failed(str(exc), now)
        return None
    return run_analysis(spec, tracks, custom, now)


def _track(deployment: ServingDeployment | None) -> rollout.TrackObservation | None:
    return deployment.track if deployment is not None else None


async def _ensure_deployment(ctx: Context, current: ServingDeployment | None, desired: JSON) -> None:
    wanted = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    if current is not None and contains(current.body, wanted):
        return
    await asyncio.to_thread(apply, ctx.kube, DEPLOYMENTS, desired)


async def _children(
    md: ModelDeployment, ctx: Context, tracks: rollout.Tracks, deployments: DeploymentIndex | None
) -> None:
    ns, name = md.metadata.key
    settings = ctx.config.cluster
    stable = serving_deployment(md, "stable", tracks.stable[0], tracks.stable[1], settings)
    await _ensure_deployment(ctx, indexed(deployments, (ns, name)), stable)
    current_canary = indexed(deployments, (ns, canary_name(name)))
    if tracks.canary is not None:
        canary = serving_deployment(md, "canary", tracks.canary[0], tracks.canary[1], settings)
        await _ensure_deployment(ctx, current_canary, canary)
    elif current_canary is not None:
        await asyncio.to_thread(ctx.kube.delete, DEPLOYMENTS, ns, canary_name(name))


def _conditions(
    md: ModelDeployment,
    status: ModelDeploymentStatus,
    state: RolloutStatus,
    obs: rollout.Observation,
    ctx: Context,
    now: datetime,
) -> None:
    gen = md.metadata.generation
    ready = (obs.stable.ready if obs.stable else 0) + (obs.canary.ready if obs.canary else 0)
    want = md.spec.replicas
    c = status.conditions
    if ready >= want:
        c = set_condition(c, "Ready", "True", "ReplicasReady", f"{ready}/{want} replicas ready", now, gen)
    else:
        c = set_condition(c, "Ready", "False", "ReplicasNotReady", f"{ready}/{want} replicas ready", now, gen)
    job = status.lastCompileJob
    compiling = job is not None and job.name is not None and job.phase in (None, "Pending", "Running")
    if compiling and job is not None:
        c = set_condition(
            c,
            "Compiling",
            "True",
            job.phase or "Pending",
            f"CompileJob {job.name} is {job.phase or 'Pending'}",
            now,
            gen,
        )
    else:
        last = (
            f"last CompileJob {job.name} {job.phase}"
            if job is not None and job.name
            else "no CompileJob running"
        )
        c = set_condition(c, "Compiling", "False", "Idle", last, now, gen)
    if state.phase in rollout.TERMINAL:
        c = set_condition(
            c, "RollingOut", "False", state.phase, state.message or "no rollout in progress", now, gen
        )
    else:
        c = set_condition(c, "RollingOut", "True", state.phase, state.message or state.phase, now, gen)
    error = ctx.health.prometheus_error
    if error is not None:
        c = set_condition(
            c,
            "Degraded",
            "True",
            "PrometheusUnavailable",
            f"no decisions while Prometheus is unavailable: {error}",
            now,
            gen,
        )
    else:
        c = set_condition(
            c, "Degraded", "False", "AsExpected", "Prometheus answers and the spec is valid", now, gen
        )
    tracks = [t for t in (obs.stable, obs.canary) if t is not None]
    progress = deployment_progress(
        rollout_phase=state.phase,
        rollout_build=state.build,
        rollout_message=state.message,
        rollout_reason=state.reason,
        step=_step_text(state, obs),
        candidate=obs.candidate,
        active=obs.active,
        policy=obs.policy,
        approved=obs.approved,
        compiling=f"CompileJob {job.name} is {job.phase or 'Pending'}" if compiling and job else None,
        ready=ready,
        want=want,
        stuck=next((t.stuck for t in tracks if t.stuck), None),
    )
    c = set_progress(c, progress, now, gen)
    status.conditions = c
    status.phase = deployment_phase(c)


def _step_text(state: RolloutStatus, obs: rollout.Observation) -> str | None:
    if state.phase != "Progressing" or not obs.steps:
        return None
    i = min(state.step, len(obs.steps) - 1)
    return f"{state.build} at step {i + 1}/{len(obs.steps)}, weight {obs.steps[i].weight}%"


def _announce_degraded(
    ctx: Context, ref: ObjectRef, old: ModelDeploymentStatus, new: ModelDeploymentStatus
) -> None:
    """An Event when Degraded flips, once, not every tick."""
    before, after = find(old.conditions, "Degraded"), find(new.conditions, "Degraded")
    was = before is not None and before.status == "True"
    if after is None or (after.status == "True") == was:
        return
    if after.status == "True":
        ctx.event(ref, "Degraded", after.message, "Warning")
    elif was:
        ctx.event(ref, "Recovered", f"no longer degraded (was: {before.message if before else ''})")


async def _set_invalid(
    ctx: Context, ref: ObjectRef, old: ModelDeploymentStatus, patch: kopf.Patch, message: str, now: datetime
) -> None:
    gen = ref.generation
    conditions = set_condition(old.conditions, "Degraded", "True", "InvalidSpec", message, now, gen)
    conditions = set_progress(conditions, Progress(stalled=("InvalidSpec", message)), now, gen)
    if any(find(old.conditions, t) != find(conditions, t) for t in ("Degraded", "Stalled", "Reconciling")):
        patch.status["conditions"] = [c.model_dump(mode="json", exclude_none=True) for c in conditions]
        patch.status["phase"] = "Degraded"
        patch.status["observedGeneration"] = gen
        ctx.event(ref, "InvalidSpec", message, "Warning")


def _effects(
    ctx: Context,
    actions: list[rollout.Action],
    ref: ObjectRef,
    status: ModelDeploymentStatus,
    now: datetime,
) -> None:
    for action in actions:
        if isinstance(action, rollout.Emit):
            ctx.event(ref, action.reason, action.message, action.type)
        elif isinstance(action, rollout.Promote):
            cand = status.candidateBuild
            base = (
                cand.model_copy()
                if cand is not None and cand.id == action.build
                else BuildStatus(id=action.build)
            )
            status.activeBuild = base.model_copy(update={"since": now})
        elif isinstance(action, rollout.Record):
            record = RolloutRecord(
                build=action.build, fromBuild=action.fromBuild, outcome=action.outcome,
                startedAt=action.startedAt, finishedAt=action.finishedAt, reason=action.reason,
            )  # fmt: skip
            status.history = [*status.history, record][-HISTORY:]


async def tick(
    body: RawBody, patch: kopf.Patch, ctx: Context, deployments: DeploymentIndex | None, *, first: bool
) -> ModelDeployment | None:
    """One reconcile of a ModelDeployment; returns it as parsed (None when its spec is invalid), so
    what else the tick feeds (the gauges) reads the same model."""
    ref = object_ref(body)
    log = object_log(ref.namespace, ref.name, "ModelDeployment")
    now = ctx.clock()
    md, problem = parse_modeldeployment(body)
    if md is None:
        await _set_invalid(ctx, ref, lenient(ModelDeploymentStatus, body.get("status")), patch, problem, now)
        if first:  # a change handler fails permanently (no retries); the timer just waits for a fix
            raise kopf.PermanentError(problem)
        return None
    old = md.status or ModelDeploymentStatus()
    status = old.model_copy(deep=True)
    status.observedGeneration = md.metadata.generation
    pinned = md.spec.build.pinned
    if pinned is not None:
        status.activeBuild = (
            status.activeBuild
            if status.activeBuild and status.activeBuild.id == pinned
            else BuildStatus(id=pinned, since=now)
        )
    elif status.activeBuild is None or status.activeBuild.id is None:
        status.activeBuild = BuildStatus(id="reference", name="reference", since=now)
    active = status.activeBuild.id or "reference"
    key, seq = ("ModelDeployment", *md.metadata.key), sequence(body)
    if ctx.fresh.is_stale(key, seq):
        if first:
            await asyncio.to_thread(apply, ctx.kube, SERVICES, serving_service(md))
        return md
    state = rollout.from_status(old.rollout)
    obs = _observation(md.model_copy(update={"status": status}), now, active, deployments)
    if pinned is None and rollout.analysis_due(state, obs):
        obs = rollout_obs_with(obs, await _analysis(md, ctx, now))
    obs = replace(obs, metrics_ok=ctx.health.prometheus_error is None)
    if pinned is not None and state.phase not in rollout.TERMINAL:
        state = state.model_copy(
            update={"phase": "Aborted", "message": f"pinned to {pinned}", "finishedAt": now}
        )
    new_state, actions = rollout.step(state, obs) if pinned is None else (state, [])
    _effects(ctx, actions, ref, status, now)
    if any(isinstance(a, rollout.Promote) for a in actions):
        obs = rollout_obs_with(obs, obs.analysis, active=status.activeBuild.id or active)
    tracks = rollout.desired(new_state, obs)
    try:
        if first:
            await asyncio.to_thread(apply, ctx.kube, SERVICES, serving_service(md))
        await _children(md, ctx, tracks, deployments)
    except KubeError as exc:
        raise kopf.TemporaryError(f"could not write the children: {exc}", delay=10) from None
    status.rollout = rollout.to_status(new_state, obs)
    _conditions(md, status, new_state, obs, ctx, now)
    _announce_degraded(ctx, ref, old, status)
    new_doc = status.model_dump(mode="json", exclude_none=True)
    diff = sequenced_patch(written_status(body), new_doc, seq)
    for field_name, value in diff.items():
        patch.status[field_name] = value
    if diff:
        ctx.fresh.wrote(key, seq + 1)
    for action in actions:
        if isinstance(action, rollout.Emit):
            log.info("rollout decision", reason=action.reason, message=action.message)
    return md


def rollout_obs_with(
    obs: rollout.Observation, run: AnalysisRun | None, active: str | None = None
) -> rollout.Observation:
    """The observation with this tick's analysis run (and, after a promotion, the new active build)."""
    return replace(obs, analysis=run, active=active or obs.active)
