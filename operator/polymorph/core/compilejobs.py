"""CompileJobs, decided and reflected: when drift opens one, what it holds, and its status from the store.

Owns:
- ``drift_decision``: whether a deployment's live traffic opens a CompileJob (score at or
  above ``driftThreshold``, ``minRequests`` met, ``cooldown`` passed, none running, not
  ``pinned``, ``enabled``). An active build tuned for no profile (``reference``) scores 1.
- ``plan_compilejob``: the CompileJob a deployment opens, from ``recompile.compile``, for
  the live profile, owned by the deployment. Its name is derived from the deployment's
  uid, active build and cooldown period, so a retried or doubled create is a conflict,
  never a second job.
- ``resolve``: a CompileJob made standalone for its sandboxes (model, hardware and workload
  filled in from the deployment), or one sentence saying why it cannot be.
- ``compilejob_status``: CompileJob status from the sandboxes' ``Progress`` documents, the
  ``CampaignResult`` and the batch Job's state (phase, per-sandbox progress, counts,
  baseline, best, ledger uri, timestamps).

Pure: documents, objects and the time come in as arguments.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from polymorph.contract.api import (
    API_VERSION,
    TERMINAL_PHASES,
    BuildResult,
    BuildStatus,
    CompileJob,
    CompileJobSpec,
    CompileJobStatus,
    DeploymentRef,
    ExperimentCounts,
    ModelDeployment,
    SandboxProgress,
    WorkloadProfile,
    WorkloadSpec,
    parse_duration,
)
from polymorph.contract.documents import CampaignResult, Progress
from polymorph.core import drift
from polymorph.core.conditions import compilejob_progress, set_condition, set_progress
from polymorph.core.resources import LABEL_MANAGED_BY, LABEL_MODEL_DEPLOYMENT, MANAGED_BY, owner_reference

__all__ = [
    "DriftDecision",
    "JobObservation",
    "candidate_from_result",
    "compilejob_name",
    "compilejob_status",
    "drift_decision",
    "plan_compilejob",
    "resolve",
]


@dataclass(frozen=True)
class DriftDecision:
    """A drift check's outcome: the score and reasons (None without data) and whether to open a job."""

    score: float | None
    reasons: list[str]
    open: bool
    why: str


def drift_decision(
    md: ModelDeployment, live: WorkloadProfile | None, requests: int, now: datetime
) -> DriftDecision:
    """Score live traffic against what the active build was tuned for, and decide on a CompileJob."""
    spec, status = md.spec.recompile, md.status
    if live is None:
        return DriftDecision(None, [], False, "no traffic in the window")
    active = status.activeBuild if status is not None else None
    tuned = active.profile if active is not None else None
    if tuned is None:
        score, reasons = 1.0, ["the active build was not tuned for any traffic profile"]
    else:
        result = drift.score(tuned, live)
        score, reasons = result.score, result.reasons
    if md.spec.build.pinned is not None:
        return DriftDecision(score, reasons, False, f"pinned to {md.spec.build.pinned}")
    if not spec.enabled:
        return DriftDecision(score, reasons, False, "recompile.enabled is false")
    if score < spec.driftThreshold:
        return DriftDecision(score, reasons, False, f"drift {score:.2f} is below {spec.driftThreshold:g}")
    if requests < spec.minRequests:
        return DriftDecision(
            score, reasons, False, f"{requests} requests in the window, {spec.minRequests} needed"
        )
    last = status.lastCompileJob if status is not None else None
    if last is not None and last.name and last.phase not in TERMINAL_PHASES:
        return DriftDecision(
            score, reasons, False, f"CompileJob {last.name} is still {last.phase or 'Pending'}"
        )
    if last is not None and last.createdAt is not None:
        ready_at = last.createdAt + timedelta(seconds=parse_duration(spec.cooldown))
        if now < ready_at:
            return DriftDecision(
                score,
                reasons,
                False,
                f"cooldown {spec.cooldown} since {last.name} runs until {ready_at.isoformat()}",
            )
    return DriftDecision(
        score, reasons, True, f"drift {score:.2f} >= {spec.driftThreshold:g} over {requests} requests"
    )


def _active_id(md: ModelDeployment) -> str:
    if md.spec.build.pinned:
        return md.spec.build.pinned
    active = md.status.activeBuild if md.status is not None else None
    return (active.id if active is not None else None) or "reference"


def compilejob_name(md: ModelDeployment, now: datetime) -> str:
    """``<md>-<8 hex>`` from the deployment's uid, its active build and the cooldown period ``now`` is in."""
    period = int(now.timestamp() // parse_duration(md.spec.recompile.cooldown))
    seed = f"{md.metadata.uid}/{_active_id(md)}/{period}"
    return f"{md.metadata.name}-{hashlib.sha256(seed.encode()).hexdigest()[:8]}"


def plan_compilejob(md: ModelDeployment, live: WorkloadProfile, now: datetime) -> dict[str, Any]:
    """The CompileJob manifest a drifted deployment opens (owned by it, from ``recompile.compile``)."""
    template = md.spec.recompile.compile
    spec = CompileJobSpec(
        deploymentRef=DeploymentRef(name=md.metadata.name),
        baseBuild=_active_id(md),
        workload=WorkloadSpec(profile=live),
        agent=template.agent,
        objective=template.objective,
        gates=template.gates,
        budget=template.budget,
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "CompileJob",
        "metadata": {
            "name": compilejob_name(md, now),
            "namespace": md.metadata.namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_MODEL_DEPLOYMENT: md.metadata.name},
            "ownerReferences": [owner_reference(md)],
        },
        "spec": spec.model_dump(mode="json", exclude_none=True),
    }


def resolve(cj: CompileJob, md: ModelDeployment | None) -> CompileJob:
    """``cj`` as its sandboxes read it: no deploymentRef; model, hardware and workload filled in.

    Raises ValueError with one sentence when the deployment is missing or has no live profile.
    """
    spec = cj.spec
    if spec.deploymentRef is None:
        return cj
    ref = spec.deploymentRef.name
    if md is None:
        raise ValueError(
            f"spec.deploymentRef.name: ModelDeployment {ref!r} does not exist in {cj.metadata.namespace}"
        )
    workload = spec.workload
    if workload is None:
        traffic = md.status.trafficProfile if md.status is not None else None
        if traffic is None or traffic.profile is None:
            raise ValueError(
                f"spec.workload is omitted and ModelDeployment {ref!r} has no live traffic profile yet; "
                "give spec.workload.profile or traceUri"
            )
        workload = WorkloadSpec(profile=traffic.profile)
    data = spec.model_dump(exclude={"deploymentRef", "model", "hardware", "workload"})
    resolved = CompileJobSpec(**data, model=md.spec.model, hardware=md.spec.hardware, workload=workload)
    return cj.model_copy(update={"spec": resolved})


@dataclass(frozen=True)
class JobObservation:
    """The batch Job as observed (None fields: the Job does not exist yet)."""

    exists: bool
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    finished: Literal["Complete", "Failed"] | None = None
    reason: str | None = None
    """The Failed condition's reason, e.g. DeadlineExceeded or BackoffLimitExceeded."""
    running: int | None = None
    """Of the ``active`` pods, those running (None: the pods were not read; all active count)."""
    waiting: str | None = None
    """Why a pod that is not running waits, as Kubernetes says it: ``Unschedulable: 0/3 nodes ...``."""


_SANDBOX_PHASES: dict[str, Literal["Running", "Done", "Failed"]] = {
    "running": "Running",
    # SIGTERM (a pod evicted or deleted) records `interrupted`; the Job restarts the pod and it resumes.
    "interrupted": "Running",
    "finished": "Done",
    "failed": "Failed",
}


def _sandbox(doc: Progress) -> SandboxProgress:
    phase = _SANDBOX_PHASES[doc.state]
    return SandboxProgress(
        index=doc.sandbox,
        phase=phase,
        experiments=doc.counts.total,
        bestValue=doc.best.value if doc.best is not None else None,
        bestBuild=doc.best.build if doc.best is not None else None,
        updatedAt=doc.updatedAt,
        message=doc.message or None,
    )


def _counts(docs: list[Progress], result: CampaignResult | None) -> ExperimentCounts:
    if result is not None:
        return ExperimentCounts(**result.experiments.model_dump())
    total = ExperimentCounts()
    for doc in docs:
        for key, value in doc.counts.model_dump().items():
            setattr(total, key, getattr(total, key) + value)
    return total


def compilejob_status(
    cj: CompileJob,
    progress: list[Progress],
    result: CampaignResult | None,
    job: JobObservation,
    ledger_uri: str,
    now: datetime,
) -> CompileJobStatus:
    """The CompileJob's status from the store's documents and the Job (idempotent for the same inputs)."""
    old = cj.status or CompileJobStatus()
    docs = sorted(progress, key=lambda d: d.sandbox)
    status = old.model_copy(deep=True)
    status.observedGeneration = cj.metadata.generation
    status.jobName = cj.metadata.name if job.exists else old.jobName
    status.sandboxes = [_sandbox(d) for d in docs]
    status.experiments = _counts(docs, result)
    status.ledgerUri = ledger_uri
    status.startedAt = old.startedAt or (min(d.startedAt for d in docs) if docs else None)
    best_doc = max(
        (d for d in docs if d.best is not None), key=lambda d: d.best.speedup if d.best else 0, default=None
    )
    base_doc = next((d for d in docs if d.baseline is not None), None)
    if base_doc is not None and base_doc.baseline is not None:
        status.baseline = BuildResult(
            build=base_doc.baseline.build, value=base_doc.baseline.value, speedup=1.0
        )
    if best_doc is not None and best_doc.best is not None:
        status.best = BuildResult(
            build=best_doc.best.build, value=best_doc.best.value, speedup=best_doc.best.speedup
        )
    if old.phase in TERMINAL_PHASES:
        return status
    phase, reason, message = _phase(docs, result, job)
    if phase in TERMINAL_PHASES and result is not None:
        if result.baseline is not None:
            status.baseline = BuildResult(
                build=result.baseline.build, value=result.baseline.value, speedup=1.0
            )
        status.best = (
            BuildResult(
                build=result.best.build,
                uri=result.best.uri,
                value=result.best.value,
                speedup=result.best.speedup,
            )
            if result.best is not None
            else None
        )
    status.phase = phase
    status.message = message
    if phase in TERMINAL_PHASES:
        status.finishedAt = now
    cond: Literal["True", "False", "Unknown"] = (
        "True" if phase == "Succeeded" else ("False" if phase in TERMINAL_PHASES else "Unknown")
    )
    status.conditions = set_condition(
        old.conditions, "Succeeded", cond, reason, message, now, cj.metadata.generation
    )
    status.conditions = set_condition(
        status.conditions,
        "Running",
        "True" if phase == "Running" else "False",
        reason,
        message,
        now,
        cj.metadata.generation,
    )
    status.conditions = set_progress(
        status.conditions, compilejob_progress(phase, reason, message), now, cj.metadata.generation
    )
    return status


def _phase(
    docs: list[Progress], result: CampaignResult | None, job: JobObservation
) -> tuple[Literal["Pending", "Running", "Succeeded", "Failed"], str, str]:
    if job.finished is None:
        if docs or job.active:
            done = sum(d.counts.total for d in docs)
            running = job.active if job.running is None else min(job.running, job.active)
            pending = job.active - running
            why = f" ({job.waiting})" if job.waiting else ""
            if pending and not running:  # nothing runs: pending, and why, not "Running"
                reason = (job.waiting or "").split(":", 1)[0] or "PodsPending"
                return "Pending", reason, f"{pending} sandbox pod(s) pending{why}, {done} experiments so far"
            waits = f", {pending} pending{why}" if pending else ""
            return "Running", "Running", f"{running} sandbox(es) running{waits}, {done} experiments so far"
        return (
            "Pending",
            "Pending",
            "waiting for the sandbox pods" if job.exists else "creating the sandbox Job",
        )
    if result is None:
        why = job.reason or job.finished
        return "Failed", why, f"the sandbox Job ended ({why}) without a campaign result"
    if result.state == "noBaseline":
        return "Failed", "NoBaseline", result.message
    if job.finished == "Failed":
        why = job.reason or "Failed"
        return (
            ("Succeeded" if result.best is not None else "Failed"),
            why,
            f"{result.message} (the Job ended: {why})",
        )
    return "Succeeded", "Improved" if result.best is not None else "NoImprovement", result.message


def candidate_from_result(result: CampaignResult) -> BuildStatus | None:
    """The deployment's candidateBuild from a successful result: id, uri, tuned-for profile, figures."""
    if result.best is None:
        return None
    return BuildStatus(
        id=result.best.build, uri=result.best.uri, profile=result.workload, figures=result.best.figures
    )
