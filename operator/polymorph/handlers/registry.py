"""kopf wiring: which handler runs on what, with typed keyword arguments plus ``**_``.

Owns the registry (built per operator, so intervals come from the flags), the indexes
(ModelDeployments for the fleet loop, the operator's Deployments for rollout observations,
CompileJobs by deployment for "is one running"), and kopf's settings: progress and diff-base
storage in ``status.kopf`` (never annotations, so GitOps tools see no drift), no Events from
log lines (only the decisions handlers post), and peering unless ``--standalone``, with this
process's own priority (``--peering-priority``, random by default: kopf pauses equal peers).
It knows nothing about what the handlers decide; it only connects them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, get_args

import kopf

from polymorph.contract import timeouts
from polymorph.contract.api import (
    API_VERSION,
    TERMINAL_PHASES,
    CompileJobStatus,
    ModelDeploymentStatus,
    RolloutPhase,
)
from polymorph.core.resources import LABEL_MANAGED_BY, MANAGED_BY
from polymorph.handlers import compilejobs, fleet, gauges, modeldeployments, peering
from polymorph.handlers.bodies import (
    CompileJobIndex,
    DeploymentIndex,
    ModelDeploymentIndex,
    RawBody,
    ServingDeployment,
    compilejob_deployment,
    lenient,
    object_ref,
    rollout_phase,
    serving_deployment,
    status_after,
)
from polymorph.handlers.context import Context

__all__ = ["GROUP", "build_registry", "kopf_settings"]

GROUP, VERSION = API_VERSION.split("/")


def kopf_settings(ctx: Context) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(
        field="status.kopf.last-handled-configuration"
    )
    settings.persistence.finalizer = "polymorph.dev/operator"
    settings.posting.level = logging.CRITICAL + 1  # Events only for decisions, never for log lines
    # Every call kopf makes is bounded by polymorph.contract.timeouts, as the operator's own clients are.
    limits = timeouts.KUBE_WATCH
    settings.watching.server_timeout = timeouts.WATCH_SERVER_S
    settings.watching.client_timeout = timeouts.WATCH_SERVER_S + limits.read_s / 2
    settings.watching.connect_timeout = limits.connect_s
    settings.networking.connect_timeout = limits.connect_s
    settings.networking.request_timeout = limits.read_s
    settings.networking.error_backoffs = tuple(min(2**i, 10) for i in range(limits.retries))
    settings.execution.max_workers = 8
    settings.peering.standalone = ctx.config.standalone
    settings.peering.name = ctx.config.peering
    # kopf pauses a replica that sees a live peer of higher or *equal* priority; with one shared
    # default priority every replica would pause and nothing would run.
    settings.peering.priority = ctx.config.peering_priority
    settings.peering.clusterwide = ctx.config.all_namespaces
    # With explicit namespaces there is nothing to scan: no cluster-wide watch of namespaces or
    # CRDs, so a namespaced install needs no cluster-scoped read access for them.
    settings.scanning.disabled = not ctx.config.all_namespaces
    return settings


def build_registry(ctx: Context) -> kopf.OperatorRegistry:
    """Every handler of the operator, registered on a fresh registry."""
    registry = kopf.OperatorRegistry()
    rollout_every = ctx.config.rollout_interval_s
    md = (GROUP, VERSION, "modeldeployments")
    cj = (GROUP, VERSION, "compilejobs")

    # Explicit ids: kopf names index kwargs by handler id (a nested function's would be its qualname).
    @kopf.index(*md, id="modeldeployment_index", registry=registry)
    def modeldeployment_index(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[tuple[str | None, str], RawBody]:
        return {(namespace, name): dict(body)}

    @kopf.index(
        "apps",
        "v1",
        "deployments",
        id="deployment_index",
        labels={LABEL_MANAGED_BY: MANAGED_BY},
        registry=registry,
    )
    def deployment_index(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[tuple[str | None, str], ServingDeployment]:
        return {(namespace, name): serving_deployment(body)}

    @kopf.index(*cj, id="compilejob_index", registry=registry)
    def compilejob_index(
        namespace: str | None, name: str, body: kopf.Body, status: kopf.Status, **_: Any
    ) -> dict[tuple[str | None, str], tuple[str, str]]:
        deployment = compilejob_deployment(body)
        return {(namespace, deployment): (name, status.get("phase") or "Pending")} if deployment else {}

    async def _md_tick(
        body: kopf.Body,
        patch: kopf.Patch,
        memo: Context,
        deployment_index: DeploymentIndex | None,
        first: bool,
        handler: str,
    ) -> None:
        ref = object_ref(body)
        memo.beat()
        try:
            async with memo.fresh.lock(("ModelDeployment", *ref.key)):
                md = await modeldeployments.tick(body, patch, memo, deployment_index, first=first)
        except kopf.PermanentError:
            memo.metrics.reconciles.labels("ModelDeployment", handler, "invalid").inc()
            raise
        except kopf.TemporaryError:
            memo.metrics.reconciles.labels("ModelDeployment", handler, "retry").inc()
            raise
        memo.metrics.reconciles.labels("ModelDeployment", handler, "ok").inc()
        status = status_after(ModelDeploymentStatus, body, patch.status)
        spec = md.spec if md is not None else None
        gauges.observe_modeldeployment(memo.metrics, ref.key, spec, status, deployment_index)

    @kopf.on.resume(*md, id="reconcile", registry=registry)
    @kopf.on.create(*md, id="reconcile", registry=registry)
    @kopf.on.update(*md, id="reconcile", registry=registry)
    async def modeldeployment_reconcile(
        body: kopf.Body,
        patch: kopf.Patch,
        memo: Context,
        deployment_index: DeploymentIndex | None = None,
        **_: Any,
    ) -> None:
        await _md_tick(body, patch, memo, deployment_index, True, "reconcile")

    @kopf.timer(
        *md, id="rollout", interval=rollout_every, initial_delay=min(rollout_every, 1.0), registry=registry
    )
    async def modeldeployment_rollout(
        body: kopf.Body,
        patch: kopf.Patch,
        memo: Context,
        deployment_index: DeploymentIndex | None = None,
        **_: Any,
    ) -> None:
        await _md_tick(body, patch, memo, deployment_index, False, "rollout")
        _count_phases(memo, modeldeployment_index_ref)

    modeldeployment_index_ref: list[ModelDeploymentIndex | None] = []

    def _observe_compilejob(body: kopf.Body, patch: kopf.Patch, memo: Context) -> None:
        before = lenient(CompileJobStatus, body.get("status"))
        after = status_after(CompileJobStatus, body, patch.status)
        gauges.observe_compilejob(
            memo.metrics, object_ref(body).key, compilejob_deployment(body), before, after
        )

    @kopf.on.resume(*cj, id="sandbox", registry=registry)
    @kopf.on.create(*cj, id="sandbox", registry=registry)
    async def compilejob_create(body: kopf.Body, patch: kopf.Patch, memo: Context, **_: Any) -> None:
        async with memo.fresh.lock(("CompileJob", *object_ref(body).key)):
            await compilejobs.create(body, patch, memo)
        memo.metrics.reconciles.labels("CompileJob", "create", "ok").inc()
        _observe_compilejob(body, patch, memo)

    def _active(status: kopf.Status, **_: Any) -> bool:
        return status.get("phase") not in TERMINAL_PHASES

    @kopf.timer(
        *cj,
        id="progress",
        interval=rollout_every,
        initial_delay=min(rollout_every, 1.0),
        when=_active,
        registry=registry,
    )
    async def compilejob_progress(body: kopf.Body, patch: kopf.Patch, memo: Context, **_: Any) -> None:
        async with memo.fresh.lock(("CompileJob", *object_ref(body).key)):
            await compilejobs.progress(body, patch, memo)
        memo.metrics.reconciles.labels("CompileJob", "progress", "ok").inc()
        _observe_compilejob(body, patch, memo)

    # optional: no finalizer; a deleted object's series only go away with it.
    @kopf.on.delete(*cj, id="forget", optional=True, registry=registry)
    def compilejob_forget(body: kopf.Body, memo: Context, **_: Any) -> None:
        gauges.forget_compilejob(memo.metrics, object_ref(body).key)

    @kopf.on.delete(*md, id="forget", optional=True, registry=registry)
    def modeldeployment_forget(body: kopf.Body, memo: Context, **_: Any) -> None:
        gauges.forget_modeldeployment(memo.metrics, *object_ref(body).key)

    @kopf.on.startup(id="fleet", registry=registry)
    async def start_fleet(
        memo: Context,
        modeldeployment_index: ModelDeploymentIndex | None = None,
        compilejob_index: CompileJobIndex | None = None,
        **_: Any,
    ) -> None:
        modeldeployment_index_ref.append(modeldeployment_index)
        stop = asyncio.Event()
        task = asyncio.create_task(
            fleet.fleet_loop(memo, modeldeployment_index, compilejob_index, stop),
            name="polymorph-fleet-drift",
        )
        memo.background.append((stop, task))

    @kopf.on.cleanup(id="fleet", registry=registry)
    async def stop_fleet(memo: Context, **_: Any) -> None:
        for stop, task in memo.background:
            stop.set()
            task.cancel()
        memo.background.clear()

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # $KUBECONFIG or the in-cluster service account, as the kubernetes package reads them.
        return kopf.login_via_client(**kwargs)

    @kopf.on.probe(id="prometheus", registry=registry)
    def prometheus_probe(memo: Context, **_: Any) -> str:
        return memo.health.prometheus_error or "ok"

    @kopf.on.probe(id="peering", registry=registry)
    async def peering_probe(memo: Context, **_: Any) -> str:
        # Every watch paused for want of the peering CRD is not healthy: /healthz answers 500 then.
        peering.note(memo, await asyncio.to_thread(peering.problem, memo))
        if memo.health.peering_error:
            raise kopf.PermanentError(memo.health.peering_error)
        return "ok"

    return registry


def _count_phases(ctx: Context, index_ref: list[ModelDeploymentIndex | None]) -> None:
    index = index_ref[0] if index_ref else None
    if index is None:
        return
    counts: dict[str, int] = {}
    for key in list(index):
        for body in index.get(key, ()):
            phase = rollout_phase(body)
            counts[phase] = counts.get(phase, 0) + 1
    for phase in get_args(RolloutPhase):
        ctx.metrics.rollouts.labels(phase).set(counts.get(phase, 0))
