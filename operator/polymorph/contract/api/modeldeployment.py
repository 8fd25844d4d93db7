"""The ModelDeployment resource (``md``): what a model owner commits to git.

Owns: the spec models (model, hardware, engine, build policy, recompile, rollout) and the whole
object (apiVersion, kind, metadata, spec, status); the status models are in
``polymorph.contract.api.deployment_status``. Field names, enums and defaults are the user-facing
contract. Every cross-field rule is a ``Rule`` beside its model: one declaration gives the
pydantic check and the CRD's CEL rule, with one sentence for both. It knows nothing about how
the operator acts on a deployment.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from polymorph.contract.api.common import (
    API_VERSION,
    DNS_LABEL_PATTERN,
    AgentSpec,
    ApiVersion,
    Budget,
    BuildId,
    Duration,
    Gates,
    Objective,
    ObjectMeta,
    Quantity,
    ResourceModel,
    StrictModel,
)
from polymorph.contract.api.deployment_status import ModelDeploymentStatus
from polymorph.contract.api.rules import Rule, min_max_rules, name_rule, strictly_increasing

Accelerator = Literal[
    "cpu", "nvidia-h100", "nvidia-h200", "nvidia-b200", "amd-mi300x", "amd-mi355x", "aws-trainium2"
]
Dtype = Literal["bfloat16", "float16", "float32"]
BuiltinMetric = Literal[
    "outputTokensPerSecondRatio",
    "interTokenLatencyP95Ratio",
    "timeToFirstTokenP95Ratio",
    "errorRate",
]
"""Analysis metrics the operator knows how to query. Ratios are canary / stable."""

MODEL_URI_PATTERN = r"^(s3://[^/\s]+(/\S*)?|pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/\S+|[^:\s][^:]*)$"
"""``s3://bucket/prefix``, ``pvc://claim/path`` or a local path (no other URI scheme)."""
_MODEL_URI = re.compile(MODEL_URI_PATTERN)
MD_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A ModelDeployment's name: a DNS-1035 label (it names a Service)."""

# The accelerator's extended resource name, used when hardware.resourceName is not given.
DEFAULT_RESOURCE_NAMES: dict[str, str | None] = {
    "cpu": None,
    "nvidia-h100": "nvidia.com/gpu",
    "nvidia-h200": "nvidia.com/gpu",
    "nvidia-b200": "nvidia.com/gpu",
    "amd-mi300x": "amd.com/gpu",
    "amd-mi355x": "amd.com/gpu",
    "aws-trainium2": "aws.amazon.com/neuron",
}


class ModelSource(StrictModel):
    """Where the weights are, and how to load them."""

    uri: str = Field(
        min_length=1,
        json_schema_extra={"pattern": MODEL_URI_PATTERN},
        description="s3://bucket/prefix/, pvc://claim/path, or a local path.",
    )
    architecture: str | None = Field(default=None, description="Read from config.json when omitted.")
    dtype: Dtype = Field(default="bfloat16", description="Weight and activation dtype.")
    maxSeqLen: int = Field(
        default=8192, ge=1, le=1_048_576, description="Longest sequence (prompt + output) served."
    )

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        if not _MODEL_URI.match(value):
            raise ValueError(
                f"{value!r} is not a model location; use s3://bucket/prefix/, pvc://claim/path or a local path"
            )
        return value


class Toleration(StrictModel):
    """A Kubernetes toleration, as in a pod spec."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class HardwareSpec(StrictModel):
    """The accelerator profile a model is served and compiled on."""

    accelerator: Accelerator = Field(description="The accelerator profile builds are compiled for.")
    count: int = Field(default=1, ge=1, le=64, description="Accelerators per replica.")
    resourceName: str | None = Field(
        default=None,
        min_length=1,
        description="Extended resource to request; defaults to the accelerator's (nvidia.com/gpu, amd.com/gpu, aws.amazon.com/neuron).",
    )
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods must match.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints the pods tolerate.")

    def resource_name(self) -> str | None:
        """The extended resource name to request ``count`` of, or None for CPU-only."""
        return self.resourceName or DEFAULT_RESOURCE_NAMES[self.accelerator]


class ResourceRequirements(StrictModel):
    """Container resources, as in a pod spec."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


class KeyRef(StrictModel):
    """A key of a Secret or ConfigMap."""

    name: str = Field(min_length=1)
    key: str = Field(min_length=1)
    optional: bool | None = None


class FieldRef(StrictModel):
    """A field of the pod, e.g. ``metadata.name``."""

    fieldPath: str = Field(min_length=1)
    apiVersion: str | None = None


class EnvVarSource(StrictModel):
    """Where an environment variable's value comes from: exactly one source."""

    RULES = (
        Rule(
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)].filter(x, x).size() == 1",
            "valueFrom needs exactly one of secretKeyRef, configMapKeyRef or fieldRef",
            lambda v: [v.secretKeyRef, v.configMapKeyRef, v.fieldRef].count(None) == 2,
        ),
    )

    secretKeyRef: KeyRef | None = None
    configMapKeyRef: KeyRef | None = None
    fieldRef: FieldRef | None = None


class EnvVar(StrictModel):
    """An environment variable of the engine container: a value, or a value from a source."""

    RULES = (
        Rule(
            "!(has(self.value) && has(self.valueFrom))",
            "give value or valueFrom, not both",
            lambda e: e.value is None or e.valueFrom is None,
        ),
    )

    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    valueFrom: EnvVarSource | None = None


class EngineSpec(StrictModel):
    """The serving container."""

    image: str = Field(default="ghcr.io/polymorph/engine:0.1.0", min_length=1)
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    args: list[str] = Field(default_factory=list, description="Extra arguments to `polymorph engine serve`.")
    env: list[EnvVar] = Field(default_factory=list, max_length=256)
    port: int = Field(default=8000, ge=1, le=65535)


class BuildSpec(StrictModel):
    """Which build serves. ``Manual`` waits for the annotation polymorph.dev/approve=<build id>."""

    policy: Literal["Auto", "Manual"] = "Auto"
    pinned: BuildId | None = Field(
        default=None, description="A build id that pins serving and stops recompilation."
    )


class CompileTemplate(StrictModel):
    """The template for the CompileJobs a deployment opens."""

    agent: AgentSpec = Field(default_factory=AgentSpec)
    budget: Budget = Field(default_factory=Budget)
    objective: Objective = Field(default_factory=Objective)
    gates: Gates = Field(default_factory=Gates)


class RecompileSpec(StrictModel):
    """When traffic drifts from what the active build was tuned for, open a CompileJob."""

    enabled: bool = Field(default=True, description="Open CompileJobs when traffic drifts.")
    driftThreshold: float = Field(
        default=0.25, gt=0, le=1, description="Drift score (0..1] that opens a CompileJob."
    )
    window: Duration = Field(default="30m", description="How much live traffic the profile is read over.")
    minRequests: int = Field(
        default=200, ge=0, description="Requests needed in the window before drift counts."
    )
    cooldown: Duration = Field(
        default="6h", description="Least time between two CompileJobs of this deployment."
    )
    compile: CompileTemplate = Field(default_factory=CompileTemplate, description="The CompileJob template.")


class RolloutStep(StrictModel):
    """Send ``weight`` percent of replicas to the canary, then hold for ``pause`` while analysing."""

    weight: int = Field(ge=1, le=100, description="Percent of replicas on the canary, 1..100.")
    pause: Duration = Field(default="10m", description="How long the step holds while analysis runs.")


class ThresholdRange(StrictModel):
    """The range an analysis value must stay in; one bound or both."""

    RULES = min_max_rules("thresholdRange needs min, max or both", "thresholdRange min must be <= max")

    min: float | None = None
    max: float | None = None

    def contains(self, value: float) -> bool:
        """Whether ``value`` is inside the range (bounds included)."""
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


class AnalysisMetric(StrictModel):
    """One analysis check: a built-in metric or a PromQL query, and its threshold range.

    In a query, ``{{name}}`` and ``{{namespace}}`` stand for the deployment's name and namespace.
    """

    RULES = (
        Rule(
            "has(self.builtin) != has(self.query)",
            "a metric needs exactly one of builtin or query",
            lambda m: (m.builtin is None) != (m.query is None),
        ),
    )

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    builtin: BuiltinMetric | None = Field(
        default=None, description="A metric the operator knows (canary/stable ratios)."
    )
    query: str | None = Field(default=None, min_length=1, description="A PromQL query returning one number.")
    thresholdRange: ThresholdRange


def _default_metrics() -> list[AnalysisMetric]:
    return [
        AnalysisMetric(
            name="throughput", builtin="outputTokensPerSecondRatio", thresholdRange=ThresholdRange(min=0.98)
        ),
        AnalysisMetric(
            name="itl-p95", builtin="interTokenLatencyP95Ratio", thresholdRange=ThresholdRange(max=1.10)
        ),
    ]


class AnalysisSpec(StrictModel):
    """How a canary step is judged: every ``interval``, each metric is checked against its range."""

    RULES = (
        Rule(
            "!has(self.metrics) || self.metrics.all(a, self.metrics.exists_one(b, b.name == a.name))",
            "metric names must be unique",
            lambda a: len({m.name for m in a.metrics}) == len(a.metrics),
            field="metrics",
        ),
    )

    interval: Duration = Field(default="1m", description="How often each metric is checked.")
    failureLimit: int = Field(
        default=2, ge=0, description="Failed checks tolerated before the rollout fails."
    )
    noDataPolicy: Literal["Inconclusive", "Pass", "Fail"] = Field(
        default="Inconclusive", description="What a check with no data counts as."
    )
    # maxItems bounds the CEL cost of the uniqueness rule (quadratic in the list's length).
    metrics: list[AnalysisMetric] = Field(default_factory=_default_metrics, max_length=20)


def _default_steps() -> list[RolloutStep]:
    return [RolloutStep(weight=25, pause="10m"), RolloutStep(weight=50, pause="10m")]


class RolloutSpec(StrictModel):
    """A canary rollout: steps of increasing weight, judged by analysis, then promote or fail."""

    RULES = (
        Rule(
            "!has(self.steps) || (self.steps.map(s, s.weight).isSorted()"
            " && self.steps.all(a, self.steps.exists_one(b, b.weight == a.weight)))",
            "step weights must be strictly increasing, each step above the one before",
            lambda r: strictly_increasing([s.weight for s in r.steps]),
            field="steps",
        ),
    )

    # maxItems bounds the CEL cost of the increasing-weights rule (quadratic in the list's length).
    steps: list[RolloutStep] = Field(default_factory=_default_steps, min_length=1, max_length=20)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    onFailure: Literal["Rollback", "Pause"] = Field(
        default="Rollback", description="What a failed rollout does."
    )


class ModelDeploymentSpec(StrictModel):
    """What a model owner declares: the model, where it runs, and how builds reach it."""

    model: ModelSource
    hardware: HardwareSpec
    replicas: int = Field(default=1, ge=0, le=10_000, description="Serving replicas (stable + canary).")
    engine: EngineSpec = Field(default_factory=EngineSpec)
    build: BuildSpec = Field(default_factory=BuildSpec)
    recompile: RecompileSpec = Field(default_factory=RecompileSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)


class ModelDeployment(ResourceModel):
    """A whole ModelDeployment object, as in a manifest or a Kubernetes API response."""

    # The name becomes a Service and the Deployment "<name>-canary": a DNS-1035 label of <= 63.
    NAME_MAX_LENGTH: ClassVar[int] = 56
    RULES = (
        name_rule(
            NAME_MAX_LENGTH,
            MD_NAME_PATTERN,
            f"must be at most {NAME_MAX_LENGTH} lowercase letters, digits or '-', starting with a "
            "letter, as it names a Service and the Deployment <name>-canary",
        ),
    )

    apiVersion: ApiVersion = API_VERSION
    kind: Literal["ModelDeployment"] = "ModelDeployment"
    metadata: ObjectMeta
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None


__all__ = [
    "DEFAULT_RESOURCE_NAMES",
    "Accelerator",
    "AnalysisMetric",
    "AnalysisSpec",
    "BuildSpec",
    "BuiltinMetric",
    "CompileTemplate",
    "Dtype",
    "EngineSpec",
    "EnvVar",
    "EnvVarSource",
    "HardwareSpec",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelSource",
    "ResourceRequirements",
    "RolloutSpec",
    "RolloutStep",
    "ThresholdRange",
    "Toleration",
]
