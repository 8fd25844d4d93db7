"""The CompileJob resource (``cj``): one compile campaign for one model on one hardware profile.

Owns: the spec (what to compile, on what workload, by which agent, under which objective,
gates and budget), the status the operator writes from sandbox progress in the store, and
the whole object. The operator opens one on drift, or a person or pipeline creates one.
It knows nothing about how sandboxes run or how the operator schedules them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from polymorph.contract.api.common import (
    API_VERSION,
    DNS_LABEL_PATTERN,
    AgentSpec,
    ApiVersion,
    Budget,
    BuildId,
    Condition,
    DnsLabel,
    Gates,
    Objective,
    ObjectMeta,
    ResourceModel,
    StatusModel,
    StrictModel,
    WorkloadProfile,
)
from polymorph.contract.api.modeldeployment import HardwareSpec, ModelSource
from polymorph.contract.api.rules import Rule, name_rule

TRACE_URI_PATTERN = r"^(s3://[^/\s]+/\S+|pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/\S+|[^:\s][^:]*)$"
"""A captured trace: ``s3://bucket/key``, ``pvc://claim/path`` or a local path."""
_TRACE_URI = re.compile(TRACE_URI_PATTERN)

JobPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Cancelled"]
TERMINAL_PHASES: frozenset[JobPhase] = frozenset({"Succeeded", "Failed", "Cancelled"})
"""Phases a CompileJob never leaves."""


class DeploymentRef(StrictModel):
    """A ModelDeployment in the CompileJob's namespace."""

    name: DnsLabel


class WorkloadSpec(StrictModel):
    """The traffic to optimise for: a profile, or the uri of a captured trace."""

    RULES = (
        Rule(
            "has(self.profile) != has(self.traceUri)",
            "workload needs exactly one of profile or traceUri",
            lambda w: (w.profile is None) != (w.traceUri is None),
        ),
    )

    profile: WorkloadProfile | None = None
    traceUri: str | None = Field(default=None, min_length=1, json_schema_extra={"pattern": TRACE_URI_PATTERN})

    @field_validator("traceUri")
    @classmethod
    def _check_trace(cls, value: str | None) -> str | None:
        if value is not None and not _TRACE_URI.match(value):
            raise ValueError(
                f"{value!r} is not a trace location; use s3://bucket/key, pvc://claim/path or a local path"
            )
        return value


class CompileJobSpec(StrictModel):
    """What to compile, for which traffic, by which agent, and how much it may spend."""

    RULES = (
        Rule(
            "has(self.deploymentRef) != (has(self.model) || has(self.hardware))",
            "give exactly one of deploymentRef or model + hardware",
            lambda j: (j.deploymentRef is None) != (j.model is None and j.hardware is None),
        ),
        Rule(
            "has(self.model) || !has(self.hardware)",
            "model is required with hardware: a standalone CompileJob needs both model and hardware",
            lambda j: j.model is not None or j.hardware is None,
            field="model",
        ),
        Rule(
            "has(self.hardware) || !has(self.model)",
            "hardware is required with model: a standalone CompileJob needs both model and hardware",
            lambda j: j.hardware is not None or j.model is None,
            field="hardware",
        ),
        Rule(
            "has(self.deploymentRef) || has(self.workload)",
            "workload (a profile or a traceUri) is required for a standalone CompileJob; "
            "only a deploymentRef job can use the live profile",
            lambda j: j.deploymentRef is not None or j.workload is not None,
            field="workload",
        ),
    )

    deploymentRef: DeploymentRef | None = Field(
        default=None, description="The ModelDeployment to compile for."
    )
    model: ModelSource | None = Field(
        default=None, description="The model, for a standalone job (with hardware)."
    )
    hardware: HardwareSpec | None = Field(
        default=None, description="The hardware, for a standalone job (with model)."
    )
    baseBuild: BuildId = Field(default="reference", description="The build experiments start from.")
    workload: WorkloadSpec | None = Field(default=None, description="Omitted: the deployment's live profile.")
    agent: AgentSpec = Field(default_factory=AgentSpec)
    objective: Objective = Field(default_factory=Objective)
    gates: Gates = Field(default_factory=Gates)
    budget: Budget = Field(default_factory=Budget)


# ---------------------------------------------------------------------------------------------
# Status: written only by the operator, from the progress sandboxes write to the store.


class SandboxProgress(StatusModel):
    """One sandbox's progress, read from ``progress-<i>.json`` in the store."""

    index: int = Field(ge=0)
    phase: Literal["Pending", "Running", "Done", "Failed"] | None = None
    experiments: int = Field(default=0, ge=0)
    bestValue: float | None = None
    bestBuild: str | None = None
    restarts: int = Field(default=0, ge=0)
    updatedAt: datetime | None = None
    message: str | None = None


class ExperimentCounts(StatusModel):
    """Experiments so far by outcome (the outcomes of ExperimentRecord.status)."""

    total: int = Field(default=0, ge=0)
    passed: int = Field(default=0, ge=0)
    rejected: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)
    crashed: int = Field(default=0, ge=0)
    timeout: int = Field(default=0, ge=0)


class BuildResult(StatusModel):
    """A build's figure on the objective: the baseline, or the best so far."""

    build: str | None = None
    uri: str | None = None
    value: float | None = Field(default=None, description="The objective metric's value.")
    speedup: float | None = Field(
        default=None,
        description=(
            "Improvement over the baseline (1.0 for the baseline), rounded to 2 decimals for display; "
            "the campaign's result document holds it exactly."
        ),
    )

    @field_validator("speedup")
    @classmethod
    def _rounded(cls, v: float | None) -> float | None:
        # A printer column of type number prints the float in full, so the status holds it rounded.
        return round(v, 2) if v is not None else None


class CompileJobStatus(StatusModel):
    """Where a campaign is. Written only by the operator."""

    observedGeneration: int | None = None
    phase: JobPhase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    jobName: str | None = Field(default=None, description="The batch/v1 Job running the sandboxes.")
    sandboxes: list[SandboxProgress] = Field(default_factory=list)
    experiments: ExperimentCounts | None = None
    baseline: BuildResult | None = None
    best: BuildResult | None = None
    ledgerUri: str | None = None
    startedAt: datetime | None = None
    finishedAt: datetime | None = None
    message: str | None = None


class CompileJob(ResourceModel):
    """A whole CompileJob object, as in a manifest or a Kubernetes API response."""

    # The name labels the Job's pods, so it must be a DNS label (<= 63 characters).
    NAME_MAX_LENGTH: ClassVar[int] = 63
    RULES = (
        name_rule(
            NAME_MAX_LENGTH,
            DNS_LABEL_PATTERN,
            f"must be at most {NAME_MAX_LENGTH} lowercase letters, digits or '-', as it names a Job",
        ),
    )

    apiVersion: ApiVersion = API_VERSION
    kind: Literal["CompileJob"] = "CompileJob"
    metadata: ObjectMeta
    spec: CompileJobSpec
    status: CompileJobStatus | None = None


__all__ = [
    "TERMINAL_PHASES",
    "BuildResult",
    "CompileJob",
    "CompileJobSpec",
    "CompileJobStatus",
    "DeploymentRef",
    "ExperimentCounts",
    "JobPhase",
    "SandboxProgress",
    "WorkloadSpec",
]
