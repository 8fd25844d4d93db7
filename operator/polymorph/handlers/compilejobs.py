"""CompileJob handlers: the sandbox ConfigMap and Indexed Job, progress from the store, the outcome.

- On create/resume: resolve the job (model, hardware, workload from its deployment), write
  the ConfigMap and Job it owns (``core.resources``), set phase Pending. A job that cannot
  be resolved is Failed with the one-sentence reason (``PermanentError``).
- Every ``--rollout-interval`` until it is terminal: read ``progress-<i>.json`` and
  ``result.json`` through the compile loop's own document classes, and the Job's state;
  ``core.compilejobs.compilejob_status`` gives the status, patched where it changed.
- On the transition to a terminal phase: Events with the numbers, and for a deployment's
  job its ``lastCompileJob``; a Succeeded job with a best build becomes the deployment's
  ``candidateBuild`` (the deployment's rollout tick then starts the rollout under ``Auto``
  or waits for the approve annotation under ``Manual``).
- A Job that disappears while the campaign runs is made again (the sandboxes resume from
  their ledgers). Deleting the CompileJob deletes its ConfigMap and Job through their owner
  references.

It knows nothing about rollouts or drift.
"""

from __future__ import annotations

import asyncio

import kopf
from pydantic import ValidationError

from polymorph.clients.kube import CONFIGMAPS, JOBS, MODELDEPLOYMENTS, PODS, KubeError, apply
from polymorph.contract.api import (
    TERMINAL_PHASES,
    BuildSpec,
    CompileJob,
    CompileJobStatus,
    ModelDeployment,
    ModelDeploymentStatus,
)
from polymorph.contract.documents import CampaignResult, Progress
from polymorph.contract.errors import StoreError
from polymorph.contract.store import KeyNotFound, progress_key, result_key
from polymorph.contract.workload import serving_max_batch
from polymorph.core import compilejobs
from polymorph.core.conditions import compilejob_progress, set_progress
from polymorph.core.patch import JSON, sequenced_patch
from polymorph.core.resources import sandbox_configmap, sandbox_job
from polymorph.handlers.bodies import (
    ObjectRef,
    RawBody,
    job_observation,
    lenient,
    object_ref,
    parse_compilejob,
    parse_modeldeployment,
    sequence,
    written_status,
)
from polymorph.handlers.context import Context
from polymorph.handlers.observability import object_log

__all__ = ["create", "progress"]


def _owner_md(cj: CompileJob, ctx: Context) -> tuple[ObjectRef, ModelDeployment | None] | None:
    """The CompileJob's ModelDeployment (None when it has none or it is gone): which object it is,
    and its model (None when its spec is invalid)."""
    if cj.spec.deploymentRef is None:
        return None
    body = ctx.kube.get(MODELDEPLOYMENTS, cj.metadata.key[0], cj.spec.deploymentRef.name)
    return (object_ref(body), parse_modeldeployment(body)[0]) if body is not None else None


def _progress_conditions(
    old: CompileJobStatus, generation: int | None, ctx: Context, phase: str, reason: str, message: str
) -> list[JSON]:
    """The status conditions with Reconciling and Stalled for ``phase`` (kstatus), as JSON."""
    new = set_progress(old.conditions, compilejob_progress(phase, reason, message), ctx.clock(), generation)
    return [c.model_dump(mode="json", exclude_none=True) for c in new]


def _fail(ctx: Context, patch: kopf.Patch, body: RawBody, message: str) -> kopf.PermanentError:
    ref = object_ref(body)
    old = lenient(CompileJobStatus, body.get("status"))
    patch.status["phase"] = "Failed"
    patch.status["message"] = message
    patch.status["observedGeneration"] = ref.generation
    patch.status["conditions"] = _progress_conditions(
        old, ref.generation, ctx, "Failed", "CannotStart", message
    )
    ctx.event(ref, "CompileJobFailed", message, "Warning")
    return kopf.PermanentError(message)


async def create(body: RawBody, patch: kopf.Patch, ctx: Context) -> None:
    """Write the ConfigMap and the Job of a CompileJob (idempotent: unchanged objects are not rewritten)."""
    cj, problem = parse_compilejob(body)
    if cj is None:
        raise _fail(ctx, patch, body, problem)
    if cj.status is not None and cj.status.phase in TERMINAL_PHASES:
        return
    owner = await asyncio.to_thread(_owner_md, cj, ctx)
    md = owner[1] if owner is not None else None
    try:
        resolved = compilejobs.resolve(cj, md)
    except ValueError as exc:
        raise _fail(ctx, patch, body, str(exc)) from None
    try:
        _, _ = await asyncio.to_thread(apply, ctx.kube, CONFIGMAPS, sandbox_configmap(resolved))
        max_batch = serving_max_batch(md.spec.engine.args) if md is not None else None
        job = sandbox_job(resolved, ctx.config.cluster, max_batch)
        verb, _ = await asyncio.to_thread(apply, ctx.kube, JOBS, job)
    except KubeError as exc:
        raise kopf.TemporaryError(f"could not write the sandbox Job: {exc}", delay=10) from None
    if verb == "created":
        sandboxes = cj.spec.budget.sandboxes
        message = (
            f"Job {cj.metadata.name}: {sandboxes} sandbox(es), {cj.spec.budget.maxExperiments} experiments, "
            f"deadline {cj.spec.budget.deadline}, agent {cj.spec.agent.kind}, base {cj.spec.baseBuild}"
        )
        ctx.event(object_ref(body), "SandboxJobCreated", message)
        object_log(cj.metadata.namespace, cj.metadata.name, "CompileJob").info(
            "sandbox job created", detail=message
        )
    if not (cj.status and cj.status.phase):
        patch.status["phase"] = "Pending"
        patch.status["jobName"] = cj.metadata.name
        patch.status["observedGeneration"] = cj.metadata.generation
        patch.status["startedAt"] = ctx.clock().isoformat().replace("+00:00", "Z")
        patch.status["conditions"] = _progress_conditions(
            cj.status or CompileJobStatus(),
            cj.metadata.generation,
            ctx,
            "Pending",
            "Pending",
            "waiting for the sandbox pods",
        )


def _read_documents(cj: CompileJob, ctx: Context) -> tuple[list[Progress], CampaignResult | None, str]:
    (ns, name), uid = cj.metadata.key, cj.metadata.uid or ""
    docs: list[Progress] = []
    for i in range(cj.spec.budget.sandboxes):
        try:
            docs.append(Progress.model_validate(ctx.store.get_json(progress_key(ns, name, uid, i))))
        except KeyNotFound:
            continue
    try:
        result: CampaignResult | None = CampaignResult.model_validate(
            ctx.store.get_json(result_key(ns, name, uid))
        )
    except KeyNotFound:
        result = None
    # The folder's uri: the store names objects, so take the first progress document's and drop its name.
    ledger = ctx.store.uri_for(progress_key(ns, name, uid, 0)).rsplit("/", 1)[0] + "/"
    return docs, result, ledger


async def progress(body: RawBody, patch: kopf.Patch, ctx: Context) -> str | None:
    """Reflect the store's progress and the Job into status; on completion hand the build on."""
    cj, _problem = parse_compilejob(body)
    if cj is None or cj.status is None or cj.status.phase in TERMINAL_PHASES:
        return cj.status.phase if cj is not None and cj.status is not None else None
    ns, name = cj.metadata.key
    key, seq = ("CompileJob", ns, name), sequence(body)
    if ctx.fresh.is_stale(key, seq):
        return cj.status.phase
    try:
        docs, result, ledger = await asyncio.to_thread(_read_documents, cj, ctx)
        job = await asyncio.to_thread(ctx.kube.get, JOBS, ns, name)
        # The Job counts a Pending pod as active: its pods say whether they run, and why not.
        pods = await asyncio.to_thread(_job_pods, ctx, ns, name) if _active_job(job) else None
    except (StoreError, ValidationError) as exc:
        raise kopf.TemporaryError(f"could not read the campaign documents: {exc}", delay=10) from None
    except KubeError as exc:
        raise kopf.TemporaryError(f"could not read the sandbox Job: {exc}", delay=10) from None
    if job is None and cj.status.jobName:
        # The Job went away while the campaign runs (deleted by hand, or lost): make it again. The
        # sandboxes resume from their ledgers in the store, so finished experiments are not rerun.
        await create(body, patch, ctx)
        return cj.status.phase
    now = ctx.clock()
    new = compilejobs.compilejob_status(cj, docs, result, job_observation(job, pods), ledger, now)
    if new.phase != cj.status.phase:
        # First the deployment, then our own status: a failure here retries the whole transition.
        await _transition(object_ref(body), cj, new, result, ctx)
    diff = sequenced_patch(written_status(body), new.model_dump(mode="json", exclude_none=True), seq)
    for field_name, value in diff.items():
        patch.status[field_name] = value
    if diff:
        ctx.fresh.wrote(key, seq + 1)
    return new.phase


def _active_job(job: JSON | None) -> bool:
    return job is not None and bool((job.get("status") or {}).get("active"))


def _job_pods(ctx: Context, ns: str, name: str) -> list[JSON]:
    """The sandbox Job's pods (the Job controller labels them ``job-name``)."""
    return ctx.kube.list(PODS, ns, {"job-name": name})


async def _transition(
    ref: ObjectRef,
    cj: CompileJob,
    new: CompileJobStatus,
    result: CampaignResult | None,
    ctx: Context,
) -> None:
    ns = cj.metadata.key[0]
    log = object_log(ns, cj.metadata.name, "CompileJob")
    counts = new.experiments
    numbers = (
        f"{counts.total} experiments ({counts.passed} passed, {counts.rejected} rejected, {counts.failed} failed, {counts.crashed} crashed, {counts.timeout} timed out)"
        if counts
        else ""
    )
    if new.phase == "Succeeded":
        best = new.best
        what = (
            f"best {best.build} at {best.speedup:.2f}x ({best.value:.4g})"
            if best and best.speedup and best.value
            else "no improvement"
        )
        message = f"{what}; {numbers}; ledger {new.ledgerUri}"
        ctx.event(ref, "CompileJobSucceeded", message)
    elif new.phase == "Failed":
        message = f"{new.message}; {numbers}"
        ctx.event(ref, "CompileJobFailed", message, "Warning")
    else:
        message = new.message or ""
    log.info("compilejob phase", phase=new.phase, message=message)
    if cj.spec.deploymentRef is None:
        return
    md_name = cj.spec.deploymentRef.name
    md_body = await asyncio.to_thread(ctx.kube.get, MODELDEPLOYMENTS, ns, md_name)
    if md_body is None:
        return
    md_ref, md_status = object_ref(md_body), lenient(ModelDeploymentStatus, md_body.get("status"))
    last = md_status.lastCompileJob
    md_patch: JSON = {}
    if last is not None and last.name == cj.metadata.name:
        md_patch["lastCompileJob"] = {"phase": new.phase, "reason": new.message}
    candidate = (
        compilejobs.candidate_from_result(result) if new.phase == "Succeeded" and result is not None else None
    )
    if candidate is not None:
        md_patch["candidateBuild"] = candidate.model_dump(mode="json", exclude_none=True)
        md = parse_modeldeployment(md_body)[0]
        # An invalid spec starts no rollout; the Event reads as the default policy would.
        policy = (md.spec.build if md is not None else BuildSpec()).policy
        then = (
            "rolling out as a canary"
            if policy == "Auto"
            else f"waiting for polymorph.dev/approve={candidate.id}"
        )
        ctx.event(md_ref, "CandidateBuild", f"CompileJob {cj.metadata.name} found {candidate.id}: {then}")
    if new.phase in TERMINAL_PHASES:
        reason = "CompileJobSucceeded" if new.phase == "Succeeded" else "CompileJobFailed"
        ctx.event(
            md_ref,
            reason,
            f"CompileJob {cj.metadata.name}: {message}",
            "Normal" if new.phase == "Succeeded" else "Warning",
        )
    if md_patch:
        try:
            await asyncio.to_thread(
                ctx.kube.patch, MODELDEPLOYMENTS, ns, md_name, {"status": md_patch}, "status"
            )
        except KubeError as exc:
            raise kopf.TemporaryError(f"could not update ModelDeployment {md_name}: {exc}", delay=5) from None
