"""The fleet drift timer: one loop for every ModelDeployment, over kopf's index of them.

Each cycle reads all traffic profiles with ``core.promql.profile_queries`` (three queries per
distinct ``recompile.window``, however many deployments there are), scores each deployment
against its active build's tuned-for profile (``core.compilejobs.drift_decision``), writes
``status.trafficProfile`` and ``status.drift`` where they changed, and opens at most one
CompileJob per deployment (owned by it; its name is fixed per cooldown period, so a second
operator replica or a retry gets a conflict, not a second job), with DriftDetected and
CompileJobCreated Events. Prometheus down gives no data and no decision; the per-deployment
tick turns that into the Degraded condition and one Event.

The loop is one asyncio task started with the operator (kopf has no operator-wide timers). It
runs a cycle only while per-object timers are ticking: kopf stops those on a standby replica
(peering), so only the active replica reads, writes and opens CompileJobs.

It knows nothing about rollouts or sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from polymorph.clients.kube import COMPILEJOBS, MODELDEPLOYMENTS, KubeError
from polymorph.clients.prometheus import PrometheusUnavailable
from polymorph.contract.api import DEFAULT_NAMESPACE, TERMINAL_PHASES, ModelDeployment
from polymorph.core import promql
from polymorph.core.compilejobs import drift_decision, plan_compilejob
from polymorph.core.patch import JSON
from polymorph.core.promql import DeploymentKey, LiveProfile
from polymorph.handlers.bodies import (
    CompileJobIndex,
    ModelDeploymentIndex,
    ObjectRef,
    ParseCache,
    RawBody,
    object_ref,
    parse_modeldeployment,
)
from polymorph.handlers.context import Context
from polymorph.handlers.observability import object_log

__all__ = ["CycleReport", "drift_cycle", "fleet_loop"]

_WRITERS = 8  # concurrent status writes in one cycle
_REFRESH_CYCLES = (
    10  # rewrite an unchanged drift status after 10..19 cycles anyway (so checkedAt stays fresh)
)


def _refresh_cycles(name: str) -> int:
    """10..19 cycles, fixed per deployment, so the refreshes of a large fleet spread over cycles."""
    return _REFRESH_CYCLES + zlib.crc32(name.encode()) % _REFRESH_CYCLES


@dataclass(frozen=True)
class CycleReport:
    deployments: int
    queries: int
    seconds: float
    opened: int
    written: int
    error: str | None = None


def _bodies(index: ModelDeploymentIndex | None) -> list[RawBody]:
    if index is None:
        return []
    return [body for key in list(index) for body in index.get(key, ())]


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _drift_patch(
    md: ModelDeployment,
    live: LiveProfile | None,
    score: float | None,
    reasons: list[str],
    now: datetime,
    interval_s: float,
) -> JSON:
    status = md.status
    patch: JSON = {}
    old_drift = status.drift if status is not None else None
    stale = (
        old_drift is None
        or old_drift.checkedAt is None
        or now - old_drift.checkedAt >= timedelta(seconds=interval_s * _refresh_cycles(md.metadata.name))
    )
    changed = (
        old_drift is None
        or old_drift.score != (None if score is None else round(score, 2))
        or old_drift.reasons != reasons
    )
    if score is not None and (changed or stale):
        patch["drift"] = {"score": round(score, 2), "checkedAt": _iso(now), "reasons": reasons}
    if live is not None:
        # Request counts move every cycle; the profile is rewritten when the drift says its shape
        # moved, or when it is stale, so a steady fleet costs no writes per cycle.
        old = status.trafficProfile if status is not None else None
        if old is None or old.profile is None or (score is not None and changed) or stale:
            patch["trafficProfile"] = {
                "profile": live.profile.model_dump(mode="json"),
                "requests": live.requests,
                "window": md.spec.recompile.window,
                "observedAt": _iso(now),
            }
    return patch


async def _open(
    ctx: Context,
    md: ModelDeployment,
    ref: ObjectRef,
    live: LiveProfile,
    score: float,
    reasons: list[str],
    why: str,
    now: datetime,
) -> JSON | None:
    ns = md.metadata.key[0]
    manifest = plan_compilejob(md, live.profile, now)
    name = manifest["metadata"]["name"]
    log = object_log(ns, md.metadata.name, "ModelDeployment")
    try:
        await asyncio.to_thread(ctx.kube.create, COMPILEJOBS, ns, manifest)
    except KubeError as exc:
        if exc.status != 409:
            log.warning("could not open a CompileJob", error=str(exc))
            return None
        log.info("CompileJob already exists", compilejob=name)
    ctx.metrics.compilejobs_opened.inc()
    ctx.event(
        ref,
        "DriftDetected",
        f"drift {score:.2f} >= {md.spec.recompile.driftThreshold:g} over {live.requests} requests in {md.spec.recompile.window}: "
        + "; ".join(reasons),
    )
    budget = md.spec.recompile.compile.budget
    ctx.event(
        ref,
        "CompileJobCreated",
        f"CompileJob {name}: base {manifest['spec']['baseBuild']}, {budget.maxExperiments} experiments, {budget.sandboxes} sandbox(es), deadline {budget.deadline} ({why})",
    )
    log.info("compilejob opened", compilejob=name, score=score, requests=live.requests)
    return {"lastCompileJob": {"name": name, "phase": "Pending", "reason": why, "createdAt": _iso(now)}}


async def drift_cycle(
    ctx: Context,
    deployments: ModelDeploymentIndex | None,
    compilejobs: CompileJobIndex | None,
    cache: ParseCache | None = None,
) -> CycleReport:
    """One fleet-wide drift check (``cache`` keeps parsed deployments between cycles)."""
    start, queries_before = time.perf_counter(), ctx.query.queries
    now = ctx.clock()
    bodies = _bodies(deployments)
    if cache is not None:
        cache.keep({object_ref(b).key for b in bodies})
    parsed: list[tuple[ModelDeployment, ObjectRef]] = []
    for body in bodies:
        md = cache.parse(body) if cache is not None else parse_modeldeployment(body)[0]
        if md is not None:
            parsed.append((md, object_ref(body)))
    by_window: dict[str, list[tuple[ModelDeployment, ObjectRef]]] = defaultdict(list)
    for md, ref in parsed:
        by_window[md.spec.recompile.window].append((md, ref))
    live: dict[str, dict[DeploymentKey, LiveProfile]] = {}
    try:
        for window in by_window:
            results = {
                name: await asyncio.to_thread(ctx.query, q)
                for name, q in promql.profile_queries(window).items()
            }
            live[window] = promql.parse_profiles(results)
        ctx.health.ok()
    except PrometheusUnavailable as exc:
        ctx.health.failed(str(exc), now)
        seconds = time.perf_counter() - start
        return CycleReport(len(parsed), ctx.query.queries - queries_before, seconds, 0, 0, str(exc))
    running: dict[DeploymentKey, dict[str, str]] = {}
    for job_ns, deployment in list(compilejobs or []):
        for name, phase in compilejobs.get((job_ns, deployment), ()) if compilejobs is not None else ():
            running.setdefault((job_ns or DEFAULT_NAMESPACE, deployment), {})[name] = phase
    gate = asyncio.Semaphore(_WRITERS)
    opened = written = 0

    async def one(md: ModelDeployment, ref: ObjectRef, profiles: dict[DeploymentKey, LiveProfile]) -> None:
        nonlocal opened, written
        ns, name = md.metadata.key
        patch: JSON = {}
        status = md.status
        last = status.lastCompileJob if status is not None else None
        if last is not None and last.name and last.phase not in TERMINAL_PHASES:
            seen = running.get((ns, name), {}).get(last.name)
            actual = seen or "Cancelled"  # no such CompileJob any more: it was deleted
            if actual != last.phase:
                patch["lastCompileJob"] = {"phase": actual}
                if status is not None:
                    fixed = status.model_copy(
                        update={"lastCompileJob": last.model_copy(update={"phase": actual})}
                    )
                    md = md.model_copy(update={"status": fixed})
        lp = profiles.get((ns, name))
        decision = drift_decision(md, lp.profile if lp else None, lp.requests if lp else 0, now)
        if decision.score is not None:
            ctx.metrics.drift.labels(ns, name).set(decision.score)
        patch |= _drift_patch(md, lp, decision.score, decision.reasons, now, ctx.config.drift_interval_s)
        async with gate:
            if decision.open and lp is not None and decision.score is not None:
                more = await _open(ctx, md, ref, lp, decision.score, decision.reasons, decision.why, now)
                if more:
                    opened += 1
                    patch |= more
            if patch:
                try:
                    await asyncio.to_thread(
                        ctx.kube.patch, MODELDEPLOYMENTS, ns, name, {"status": patch}, "status"
                    )
                    written += 1
                except KubeError as exc:
                    object_log(ns, name, "ModelDeployment").warning(
                        "could not write drift status", error=str(exc)
                    )

    await asyncio.gather(*(one(md, ref, live[md.spec.recompile.window]) for md, ref in parsed))
    seconds = time.perf_counter() - start
    report = CycleReport(len(parsed), ctx.query.queries - queries_before, seconds, opened, written)
    ctx.metrics.drift_cycle.observe(seconds)
    ctx.metrics.drift_cycle_queries.set(report.queries)
    return report


async def fleet_loop(
    ctx: Context,
    deployments: ModelDeploymentIndex | None,
    compilejobs: CompileJobIndex | None,
    stop: asyncio.Event,
) -> None:
    """Run ``drift_cycle`` every ``--drift-interval`` until ``stop`` is set."""
    log = object_log(None, None, "Fleet")
    was_down = False
    cache = ParseCache()
    # Object timers tick every --rollout-interval on the active replica only (kopf pauses them on a
    # standby); without a recent tick there is nothing this replica may decide.
    active_within = max(10.0, 3 * ctx.config.rollout_interval_s)
    while not stop.is_set():
        if not ctx.active(active_within):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(1.0, ctx.config.drift_interval_s))
            continue
        try:
            report = await drift_cycle(ctx, deployments, compilejobs, cache)
        except Exception as exc:  # keep the fleet loop alive; the next cycle tries again
            log.exception("drift cycle failed", error=str(exc))
        else:
            down = report.error is not None
            if down != was_down:
                log.warning("prometheus unavailable", error=report.error) if down else log.info(
                    "prometheus answers again"
                )
            was_down = down
            log.info("drift cycle", deployments=report.deployments, queries=report.queries,
                     seconds=round(report.seconds, 3), opened=report.opened, written=report.written)  # fmt: skip
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=ctx.config.drift_interval_s)
