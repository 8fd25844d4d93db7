"""Pydantic models: the single source of truth for CRDs, build manifests and experiment records."""

from polymorph.api.build import BuildManifest, ExperimentRecord, ExperimentStatus, Figures, Verification
from polymorph.api.common import (
    AgentSpec,
    Budget,
    BuildId,
    Constraint,
    Duration,
    Gates,
    Histogram,
    Objective,
    SecretKeyRef,
    StrictModel,
    WorkloadProfile,
    parse_duration,
)

__all__ = [
    "AgentSpec",
    "Budget",
    "BuildId",
    "BuildManifest",
    "Constraint",
    "Duration",
    "ExperimentRecord",
    "ExperimentStatus",
    "Figures",
    "Gates",
    "Histogram",
    "Objective",
    "SecretKeyRef",
    "StrictModel",
    "Verification",
    "WorkloadProfile",
    "parse_duration",
]
