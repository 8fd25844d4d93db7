"""Parsing at the edge: each body kopf or the Kubernetes API hands the operator becomes a typed value here.

Owns: a ModelDeployment or CompileJob body into its API model (``parse_modeldeployment``,
``parse_compilejob``: the spec checked as ``polymorph validate`` checks it, the status read
leniently; ``ParseCache`` keeps them per resourceVersion), a serving Deployment into what a
rollout observes of it (``serving_deployment``, what the kopf index keeps), a sandbox Job into
what a CompileJob's status needs (``job_observation``), a status with this tick's patch
applied into its model (``status_after``), and which object a body is (``object_ref``, for
Events, logs and keys). The handlers work on these values. A raw body (``RawBody``, what
kopf's own signatures carry) goes no further than this module, except as the base of a status
patch (``written_status``) and a serving Deployment as it was last read (the desired manifest
is applied only where it differs).

It knows nothing about what the handlers decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

import kopf
from pydantic import BaseModel, ValidationError

from polymorph.contract.api import (
    DEFAULT_NAMESPACE,
    RETIRED_ROLLOUT_PHASES,
    CompileJob,
    CompileJobStatus,
    ModelDeployment,
    ModelDeploymentStatus,
    RolloutPhase,
)
from polymorph.contract.validate import validate_document
from polymorph.core.compilejobs import JobObservation
from polymorph.core.patch import JSON, merged
from polymorph.core.resources import ANNOTATION_BUILD_ID, LABEL_MODEL_DEPLOYMENT
from polymorph.core.rollout import TrackObservation

__all__ = [
    "CompileJobIndex",
    "DeploymentIndex",
    "ModelDeploymentIndex",
    "ObjectRef",
    "ParseCache",
    "RawBody",
    "ServingDeployment",
    "compilejob_deployment",
    "indexed",
    "job_observation",
    "lenient",
    "object_ref",
    "parse_compilejob",
    "parse_modeldeployment",
    "rollout_phase",
    "sequence",
    "serving_deployment",
    "status_after",
    "written_status",
]

RawBody = Mapping[str, Any]
"""A Kubernetes object as kopf or the API hands it over (JSON)."""
S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class ObjectRef:
    """Which object an Event or a log line is about, as its body names it."""

    api_version: str | None
    kind: str | None
    namespace: str | None
    """As the body says (None when it names none; ``key`` reads that as ``default``)."""
    name: str
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace or DEFAULT_NAMESPACE, self.name


def object_ref(body: RawBody) -> ObjectRef:
    """The reference of a raw body (any Kubernetes object with apiVersion, kind and metadata)."""
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    return ObjectRef(
        api_version=body.get("apiVersion"),
        kind=body.get("kind"),
        namespace=meta.get("namespace"),
        name=str(meta.get("name") or ""),
        uid=meta.get("uid"),
        resource_version=meta.get("resourceVersion"),
        generation=int(generation) if isinstance(generation, int) else None,
    )


def lenient(model: type[S], doc: object) -> S:
    """``doc`` as ``model``, or the empty model when it does not validate (status written by
    someone else must never stop the operator; the spec is what is checked strictly)."""
    try:
        return model.model_validate(dict(doc) if isinstance(doc, Mapping) else {})
    except ValidationError:
        return model.model_validate({})


def _spec_document(body: RawBody) -> dict[str, Any]:
    doc = {k: v for k, v in body.items() if k != "status"}
    doc["metadata"] = {k: v for k, v in dict(body.get("metadata", {})).items() if k != "managedFields"}
    return doc


def parse_modeldeployment(body: RawBody) -> tuple[ModelDeployment | None, str]:
    """The ModelDeployment (status read leniently), or None and the one-sentence reason it is invalid."""
    obj, _, problems = validate_document(_spec_document(body))
    if obj is None or not isinstance(obj, ModelDeployment):
        return None, "; ".join(problems) or "the ModelDeployment is invalid"
    return obj.model_copy(update={"status": lenient(ModelDeploymentStatus, body.get("status"))}), ""


def parse_compilejob(body: RawBody) -> tuple[CompileJob | None, str]:
    """The CompileJob (status read leniently), or None and the one-sentence reason it is invalid."""
    obj, _, problems = validate_document(_spec_document(body))
    if obj is None or not isinstance(obj, CompileJob):
        return None, "; ".join(problems) or "the CompileJob is invalid"
    return obj.model_copy(update={"status": lenient(CompileJobStatus, body.get("status"))}), ""


def sequence(body: RawBody) -> int:
    """The ``status.polymorph.seq`` of a body: the operator's write counter (0 when never written)."""
    internal = (body.get("status") or {}).get("polymorph") or {}
    try:
        return int(internal.get("seq") or 0)
    except (TypeError, ValueError):
        return 0


def written_status(body: RawBody) -> JSON:
    """The status as the body holds it, less kopf's own bookkeeping: the base of the next patch."""
    return {k: v for k, v in dict(body.get("status") or {}).items() if k != "kopf"}


class ParseCache:
    """Parsed ModelDeployments by ``(namespace, name)`` and resourceVersion: the fleet's drift cycle
    validates each deployment once per change, not once per cycle."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, str], tuple[str, ModelDeployment | None]] = {}

    def parse(self, body: RawBody) -> ModelDeployment | None:
        """``parse_modeldeployment(body)``'s model, from the cache when the body is unchanged."""
        ref = object_ref(body)
        version = ref.resource_version or ""
        found = self._parsed.get(ref.key)
        if version and found is not None and found[0] == version:
            return found[1]
        md, _ = parse_modeldeployment(body)
        if version:
            self._parsed[ref.key] = (version, md)
        return md

    def keep(self, keys: set[tuple[str, str]]) -> None:
        """Forget every deployment not in ``keys`` (deleted since)."""
        for gone in set(self._parsed) - keys:
            del self._parsed[gone]


def status_after(model: type[S], body: RawBody, patch: Mapping[str, Any]) -> S:
    """The object's status once this tick's status patch is applied, as ``model`` (leniently)."""
    return lenient(model, merged(body.get("status"), patch))


@dataclass(frozen=True)
class ServingDeployment:
    """A serving Deployment as the kopf index keeps it: what the rollout observes, and the object
    itself (the desired manifest is applied only where the object does not already hold it)."""

    track: TrackObservation
    body: RawBody


def serving_deployment(body: RawBody) -> ServingDeployment:
    """What a rollout observes of one serving Deployment: its build, replicas, readiness, whether
    it is rolled out, and the Deployment controller's message when it gave up."""
    spec, status, meta = body.get("spec") or {}, body.get("status") or {}, body.get("metadata") or {}
    annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    replicas = int(spec.get("replicas") or 0)
    updated = (
        int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
        and int(status.get("updatedReplicas") or 0) >= replicas
    )
    stuck = next(
        (
            f"Deployment {meta.get('name')}: {c.get('message') or 'ProgressDeadlineExceeded'}"
            for c in status.get("conditions") or []
            if c.get("type") == "Progressing"
            and c.get("status") == "False"
            and c.get("reason") == "ProgressDeadlineExceeded"
        ),
        None,
    )
    track = TrackObservation(
        build=annotations.get(ANNOTATION_BUILD_ID, ""),
        replicas=replicas,
        ready=int(status.get("readyReplicas") or 0),
        updated=updated,
        stuck=stuck,
    )
    return ServingDeployment(track=track, body=dict(body))


DeploymentIndex = kopf.Index[tuple[str | None, str], ServingDeployment]
"""kopf's index of the serving Deployments the operator owns, by (namespace, name)."""
ModelDeploymentIndex = kopf.Index[tuple[str | None, str], RawBody]
"""kopf's index of the ModelDeployments as they are (the drift cycle parses them, ``ParseCache``)."""
CompileJobIndex = kopf.Index[tuple[str | None, str], tuple[str, str]]
"""kopf's index of CompileJobs by (namespace, deployment): each job's (name, phase)."""


def indexed(index: DeploymentIndex | None, key: tuple[str, str]) -> ServingDeployment | None:
    """The Deployment ``key`` names in the index, or None."""
    found = index.get(key) if index is not None else None
    return next(iter(found), None) if found else None


def rollout_phase(body: RawBody) -> RolloutPhase:
    """The rollout phase a ModelDeployment body's status records: Idle when there is none, a retired
    phase read as its successor. Cheap (no validation of the rest), for counting a whole fleet."""
    phase = ((body.get("status") or {}).get("rollout") or {}).get("phase")
    phase = RETIRED_ROLLOUT_PHASES.get(phase, phase) if isinstance(phase, str) else None
    return next((p for p in get_args(RolloutPhase) if p == phase), "Idle")


def compilejob_deployment(body: RawBody) -> str:
    """The ModelDeployment a CompileJob body compiles for: its ``deploymentRef``, else the label the
    operator puts on the jobs it opens; "" for a standalone job."""
    spec, meta = body.get("spec") or {}, body.get("metadata") or {}
    ref = (spec.get("deploymentRef") or {}).get("name")
    return str(ref or (meta.get("labels") or {}).get(LABEL_MODEL_DEPLOYMENT) or "")


def _waiting(pod: RawBody) -> str | None:
    """Why a pod that is not running waits: its PodScheduled condition when False (``Unschedulable:
    0/3 nodes are available: ...``), else a container's waiting reason (``ImagePullBackOff: ...``)."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or 'not scheduled'}"[:300]
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            text = waiting["reason"] + (f": {waiting['message']}" if waiting.get("message") else "")
            return text[:300]
    return None


def job_observation(job: RawBody | None, pods: Sequence[RawBody] | None = None) -> JobObservation:
    """What a CompileJob's status needs of its sandbox Job: pods by state, and how it finished.
    With ``pods`` (the Job's pods), how many run and why one that does not waits."""
    if job is None:
        return JobObservation(exists=False)
    running: int | None = None
    waiting: str | None = None
    if pods is not None:
        live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        running = sum((p.get("status") or {}).get("phase") == "Running" for p in live)
        pending = [p for p in live if (p.get("status") or {}).get("phase") == "Pending"]
        waiting = next((w for w in map(_waiting, pending) if w), None)
    status = job.get("status") or {}
    finished, reason = None, None
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            finished, reason = cond["type"], cond.get("reason")
    return JobObservation(
        exists=True,
        active=int(status.get("active") or 0),
        succeeded=int(status.get("succeeded") or 0),
        failed=int(status.get("failed") or 0),
        finished=finished,
        reason=reason,
        running=running,
        waiting=waiting,
    )
