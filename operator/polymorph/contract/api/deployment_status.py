"""The ModelDeployment's status: what the operator observed and did (it never writes spec).

Owns the status models (active and candidate build, traffic, drift, the last CompileJob, the
rollout and its history) and the rollout's vocabulary: its phases and the analysis verdicts.
``RolloutStatus`` is also the rollout state machine's state (``polymorph.core.rollout`` steps
it): each field is declared once, with the default the machine starts from, and the CRD still
shows every field as optional and nullable, as every status field is. It knows nothing about
how the operator acts on a deployment.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field, field_validator, model_validator

from polymorph.contract.api.build import Figures
from polymorph.contract.api.common import Condition, StatusModel, WorkloadProfile

__all__ = [
    "RETIRED_ROLLOUT_PHASES",
    "AnalysisSamples",
    "AnalysisValue",
    "BuildStatus",
    "CompileJobRef",
    "DeploymentPhase",
    "DriftStatus",
    "ModelDeploymentStatus",
    "OperatorRecord",
    "RolloutPhase",
    "RolloutRecord",
    "RolloutStatus",
    "TrafficStatus",
    "Verdict",
]

DeploymentPhase = Literal["Pending", "Serving", "Compiling", "RollingOut", "Degraded"]
RolloutPhase = Literal[
    "Idle", "Progressing", "Paused", "Promoting", "Succeeded", "RollingBack", "RolledBack", "Aborted"
]
"""The rollout state machine's phases (``polymorph.core.rollout``): Idle -> Progressing -> Promoting ->
Succeeded, or Paused, or RollingBack -> RolledBack | Aborted."""
RETIRED_ROLLOUT_PHASES: dict[str, RolloutPhase] = {"Promoted": "Succeeded", "Failed": "Aborted"}
"""Phases an earlier operator wrote to ``status.rollout``, each read as the phase that replaced it
(the CRD still accepts them, so such a status stays valid)."""
Verdict = Literal["Pass", "Fail", "Inconclusive"]
"""An analysis run's verdict, and each of its metrics'."""


def _short_id(build: str) -> str:
    """A content address cut to ``sha256:`` and 12 hex digits; any other id (``reference``) as it is."""
    return build[:19] if build.startswith("sha256:") else build


class BuildStatus(StatusModel):
    """A build as served: id, where it is stored, what it was tuned for, and what it measured.

    ``shortId`` and ``tokensPerSecond`` are for ``kubectl get`` only: they are derived from
    ``id`` and ``figures`` whenever a BuildStatus is built or read, so they never disagree
    with them (a printer column of type number prints a float in full, and a promoted build
    has no ``name``, so the columns read these instead).
    """

    id: str | None = None
    name: str | None = Field(default=None, description="The build's human name (from build.toml).")
    shortId: str | None = Field(
        default=None, description="The id shortened for display (sha256: and 12 hex digits); derived from id."
    )
    uri: str | None = None
    profile: WorkloadProfile | None = Field(default=None, description="The traffic profile it was tuned for.")
    figures: Figures | None = None
    tokensPerSecond: int | None = Field(
        default=None,
        description="figures.outputTokensPerSecond rounded to a whole number for display; derived from figures.",
    )
    since: datetime | None = None

    def model_post_init(self, context: object, /) -> None:
        self.shortId = _short_id(self.id) if self.id is not None else None
        self.tokensPerSecond = (
            math.floor(self.figures.outputTokensPerSecond + 0.5) if self.figures is not None else None
        )


class TrafficStatus(StatusModel):
    """The live traffic profile read from Prometheus."""

    profile: WorkloadProfile | None = None
    requests: int | None = Field(default=None, description="Requests seen in the window.")
    window: str | None = None
    observedAt: datetime | None = None


class DriftStatus(StatusModel):
    """How far live traffic is from the profile the active build was tuned for."""

    score: float | None = Field(default=None, ge=0, le=1)
    checkedAt: datetime | None = None
    reasons: list[str] = Field(default_factory=list)


class CompileJobRef(StatusModel):
    """The last CompileJob this deployment opened."""

    name: str | None = None
    phase: str | None = None
    reason: str | None = None
    createdAt: datetime | None = None


class AnalysisSamples(StatusModel):
    """How many serving pods of each track a builtin ratio was computed from."""

    canary: int = Field(ge=0)
    stable: int = Field(ge=0)


class AnalysisValue(StatusModel):
    """One analysis measurement next to its threshold: the value, its confidence interval and the verdict."""

    name: str
    value: float | None = None
    lo: float | None = Field(default=None, description="Lower end of the value's confidence interval.")
    hi: float | None = Field(default=None, description="Upper end of the value's confidence interval.")
    samples: AnalysisSamples | None = Field(
        default=None, description="Pods per track behind a builtin ratio; absent for custom queries."
    )
    min: float | None = None
    max: float | None = None
    verdict: Verdict | None = None
    measuredAt: datetime | None = None


def _nullable_in_schema(schema: dict[str, Any], model: type) -> None:
    """Show each field with a scalar default as optional and nullable, like every other status field.

    The defaults are the state machine's starting point; status itself holds no defaults (a null or
    absent field reads as the default), so the schema documents none.
    """
    fields = model.model_fields  # type: ignore[attr-defined]
    for name, prop in schema.get("properties", {}).items():
        field = fields[name]
        if field.default is None or field.default_factory is not None:
            continue
        shown = {key: prop.pop(key) for key in ("title", "description") if key in prop}
        prop.pop("default", None)
        schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], "default": None, **shown}


class RolloutStatus(StatusModel):
    """Where the current (or last) rollout is: its whole state, the one record a rollout resumes from.

    After a restart the operator continues the rollout from status alone, with step and pause
    timing taken from the recorded timestamps; ``weight`` and ``actualWeight`` are views for
    people.
    """

    model_config = ConfigDict(frozen=True, json_schema_extra=_nullable_in_schema)

    phase: RolloutPhase = Field(
        default="Idle", json_schema_extra={"enum": [*get_args(RolloutPhase), *RETIRED_ROLLOUT_PHASES]}
    )
    build: str | None = Field(default=None, description="The candidate build being rolled out.")
    fromBuild: str | None = Field(
        default=None, description="The stable build when the rollout started (what a rollback returns to)."
    )
    step: int = Field(default=0, ge=0, description="Index into spec.rollout.steps.")
    weight: int | None = Field(default=None, ge=0, le=100, description="Desired canary weight (percent).")
    actualWeight: float | None = Field(
        default=None, ge=0, le=100, description="Canary share of ready replicas."
    )
    canaryReplicas: int = 0
    stableReplicas: int = 0
    startedAt: datetime | None = Field(default=None, description="When the rollout started.")
    stepStartedAt: datetime | None = Field(
        default=None, description="When the current step settled (its canary replicas ready)."
    )
    """None until the step's canary replicas are ready; the step's pause and analysis count from it."""
    lastAnalysisAt: datetime | None = Field(default=None, description="The current step's latest analysis.")
    lastVerdict: Verdict | None = Field(default=None, description="The current step's latest verdict.")
    failures: int = Field(default=0, ge=0, description="Consecutive failed analysis runs.")
    finishedAt: datetime | None = None
    target: Literal["RolledBack", "Aborted"] | None = Field(
        default=None, description="Where a rollback (phase RollingBack) ends."
    )
    reason: str | None = Field(default=None, description="Why the rollout is rolling back, paused or ended.")
    approvalAtPause: bool = Field(
        default=False,
        description="The approve annotation already named this build when it paused: resuming needs it re-applied.",
    )
    analysis: list[AnalysisValue] = Field(default_factory=list)
    message: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: object) -> object:
        """A null field (status written by hand, or by an older operator) reads as its default."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @field_validator("phase", mode="before")
    @classmethod
    def _current_phase(cls, value: object) -> object:
        return RETIRED_ROLLOUT_PHASES.get(value, value) if isinstance(value, str) else value


class RolloutRecord(StatusModel):
    """One finished rollout in the history."""

    build: str
    fromBuild: str | None = None
    outcome: Literal["Promoted", "RolledBack", "Aborted"]
    startedAt: datetime | None = None
    finishedAt: datetime | None = None
    reason: str | None = None


class OperatorRecord(StatusModel):
    """``status.polymorph``: what the operator keeps for itself."""

    seq: int | None = Field(
        default=None,
        ge=0,
        description="Number of the operator's last status write; a body with a lower one is stale.",
    )


class ModelDeploymentStatus(StatusModel):
    """What the operator observed and did. It never writes spec."""

    observedGeneration: int | None = None
    phase: DeploymentPhase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    activeBuild: BuildStatus | None = None
    candidateBuild: BuildStatus | None = None
    trafficProfile: TrafficStatus | None = None
    drift: DriftStatus | None = None
    lastCompileJob: CompileJobRef | None = None
    rollout: RolloutStatus | None = None
    history: list[RolloutRecord] = Field(default_factory=list)
    polymorph: OperatorRecord | None = Field(
        default=None, description="The operator's own bookkeeping (not for people)."
    )
