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
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from polymorph.api import TERMINAL_PHASES, CompileJob, CompileJobStatus
from polymorph.clients.kube import CONFIGMAPS, JOBS, MODELDEPLOYMENTS, KubeError, apply
from polymorph.compile.documents import CampaignResult, Progress
from polymorph.core import compilejobs
from polymorph.core.conditions import compilejob_progress, set_progress
from polymorph.core.resources import sandbox_configmap, sandbox_job
from polymorph.errors import StoreError
from polymorph.handlers.context import Context, sequence, sequenced_patch
from polymorph.handlers.modeldeployments import parse as parse_md
from polymorph.handlers.observability import object_log
from polymorph.store import KeyNotFound, progress_key, result_key
from polymorph.validate import validate_document

__all__ = ["create", "job_observation", "parse", "progress"]


def parse(body: Mapping[str, Any]) -> tuple[CompileJob | None, str]:
    doc = {k: v for k, v in body.items() if k != "status"}
    doc["metadata"] = {k: v for k, v in dict(body.get("metadata", {})).items() if k != "managedFields"}
    obj, _, problems = validate_document(doc)
    if obj is None or not isinstance(obj, CompileJob):
        return None, "; ".join(problems) or "the CompileJob is invalid"
    try:
        status = CompileJobStatus.model_validate(dict(body.get("status") or {}))
    except ValidationError:
        status = CompileJobStatus()
    return obj.model_copy(update={"status": status}), ""


def _owner_md(cj: CompileJob, ctx: Context) -> Mapping[str, Any] | None:
    if cj.spec.deploymentRef is None:
        return None
    return ctx.kube.get(MODELDEPLOYMENTS, cj.metadata.namespace or "default", cj.spec.deploymentRef.name)


def _progress_conditions(
    body: Mapping[str, Any], ctx: Context, phase: str, reason: str, message: str
) -> list[Any]:
    """The status conditions with Reconciling and Stalled for ``phase`` (kstatus), as JSON."""
    try:
        old = CompileJobStatus.model_validate(dict(body.get("status") or {})).conditions
    except ValidationError:
        old = []
    gen = body.get("metadata", {}).get("generation")
    new = set_progress(old, compilejob_progress(phase, reason, message), ctx.clock(), gen)
    return [c.model_dump(mode="json", exclude_none=True) for c in new]


def _fail(ctx: Context, patch: kopf.Patch, body: Mapping[str, Any], message: str) -> kopf.PermanentError:
    patch.status["phase"] = "Failed"
    patch.status["message"] = message
    patch.status["observedGeneration"] = body.get("metadata", {}).get("generation")
    patch.status["conditions"] = _progress_conditions(body, ctx, "Failed", "CannotStart", message)
    ctx.event(body, "CompileJobFailed", message, "Warning")
    return kopf.PermanentError(message)


async def create(body: Mapping[str, Any], patch: kopf.Patch, ctx: Context) -> None:
    """Write the ConfigMap and the Job of a CompileJob (idempotent: unchanged objects are not rewritten)."""
    cj, problem = parse(body)
    if cj is None:
        raise _fail(ctx, patch, body, problem)
    if cj.status is not None and cj.status.phase in TERMINAL_PHASES:
        return
    md_body = await asyncio.to_thread(_owner_md, cj, ctx)
    md = parse_md(md_body)[0] if md_body is not None else None
    try:
        resolved = compilejobs.resolve(cj, md)
    except ValueError as exc:
        raise _fail(ctx, patch, body, str(exc)) from None
    try:
        _, _ = await asyncio.to_thread(apply, ctx.kube, CONFIGMAPS, sandbox_configmap(resolved))
        verb, _ = await asyncio.to_thread(apply, ctx.kube, JOBS, sandbox_job(resolved, ctx.config.cluster))
    except KubeError as exc:
        raise kopf.TemporaryError(f"could not write the sandbox Job: {exc}", delay=10) from None
    if verb == "created":
        sandboxes = cj.spec.budget.sandboxes
        message = (
            f"Job {cj.metadata.name}: {sandboxes} sandbox(es), {cj.spec.budget.maxExperiments} experiments, "
            f"deadline {cj.spec.budget.deadline}, agent {cj.spec.agent.kind}, base {cj.spec.baseBuild}"
        )
        ctx.event(body, "SandboxJobCreated", message)
        object_log(cj.metadata.namespace, cj.metadata.name, "CompileJob").info(
            "sandbox job created", detail=message
        )
    if not (cj.status and cj.status.phase):
        patch.status["phase"] = "Pending"
        patch.status["jobName"] = cj.metadata.name
        patch.status["observedGeneration"] = cj.metadata.generation
        patch.status["startedAt"] = ctx.clock().isoformat().replace("+00:00", "Z")
        patch.status["conditions"] = _progress_conditions(
            body, ctx, "Pending", "Pending", "waiting for the sandbox pods"
        )


def job_observation(job: Mapping[str, Any] | None) -> compilejobs.JobObservation:
    if job is None:
        return compilejobs.JobObservation(exists=False)
    status = job.get("status") or {}
    finished, reason = None, None
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            finished, reason = cond["type"], cond.get("reason")
    return compilejobs.JobObservation(
        exists=True,
        active=int(status.get("active") or 0),
        succeeded=int(status.get("succeeded") or 0),
        failed=int(status.get("failed") or 0),
        finished=finished,
        reason=reason,
    )


def _read_documents(cj: CompileJob, ctx: Context) -> tuple[list[Progress], CampaignResult | None, str]:
    ns, name, uid = cj.metadata.namespace or "default", cj.metadata.name, cj.metadata.uid or ""
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


async def progress(body: Mapping[str, Any], patch: kopf.Patch, ctx: Context) -> str | None:
    """Reflect the store's progress and the Job into status; on completion hand the build on."""
    cj, _problem = parse(body)
    if cj is None or cj.status is None or cj.status.phase in TERMINAL_PHASES:
        return cj.status.phase if cj is not None and cj.status is not None else None
    ns, name = cj.metadata.namespace or "default", cj.metadata.name
    key, seq = ("CompileJob", ns, name), sequence(body)
    if ctx.fresh.is_stale(key, seq):
        return cj.status.phase
    try:
        docs, result, ledger = await asyncio.to_thread(_read_documents, cj, ctx)
        job = await asyncio.to_thread(ctx.kube.get, JOBS, ns, name)
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
    new = compilejobs.compilejob_status(cj, docs, result, job_observation(job), ledger, now)
    if new.phase != cj.status.phase:
        # First the deployment, then our own status: a failure here retries the whole transition.
        await _transition(body, cj, new, result, ctx)
    old_doc = {k: v for k, v in dict(body.get("status") or {}).items() if k != "kopf"}
    diff = sequenced_patch(old_doc, new.model_dump(mode="json", exclude_none=True), seq)
    for field_name, value in diff.items():
        patch.status[field_name] = value
    if diff:
        ctx.fresh.wrote(key, seq + 1)
    return new.phase


async def _transition(
    body: Mapping[str, Any],
    cj: CompileJob,
    new: CompileJobStatus,
    result: CampaignResult | None,
    ctx: Context,
) -> None:
    ns = cj.metadata.namespace or "default"
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
        ctx.event(body, "CompileJobSucceeded", message)
    elif new.phase == "Failed":
        message = f"{new.message}; {numbers}"
        ctx.event(body, "CompileJobFailed", message, "Warning")
    else:
        message = new.message or ""
    log.info("compilejob phase", phase=new.phase, message=message)
    if cj.spec.deploymentRef is None:
        return
    md_name = cj.spec.deploymentRef.name
    md_body = await asyncio.to_thread(ctx.kube.get, MODELDEPLOYMENTS, ns, md_name)
    if md_body is None:
        return
    last = dict((md_body.get("status") or {}).get("lastCompileJob") or {})
    md_patch: dict[str, Any] = {}
    if last.get("name") == cj.metadata.name:
        md_patch["lastCompileJob"] = {"phase": new.phase, "reason": new.message}
    candidate = (
        compilejobs.candidate_from_result(result) if new.phase == "Succeeded" and result is not None else None
    )
    if candidate is not None:
        md_patch["candidateBuild"] = candidate.model_dump(mode="json", exclude_none=True)
        policy = (md_body.get("spec", {}).get("build") or {}).get("policy", "Auto")
        then = (
            "rolling out as a canary"
            if policy == "Auto"
            else f"waiting for polymorph.dev/approve={candidate.id}"
        )
        ctx.event(md_body, "CandidateBuild", f"CompileJob {cj.metadata.name} found {candidate.id}: {then}")
    if new.phase in TERMINAL_PHASES:
        reason = "CompileJobSucceeded" if new.phase == "Succeeded" else "CompileJobFailed"
        ctx.event(
            md_body,
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
