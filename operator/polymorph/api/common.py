"""Building blocks shared by every Polymorph resource and by the engine, agents and operator.

Owns: the strict base model (unknown fields are errors), durations, build ids, workload
profiles and the CompileJob pieces (objective, gates, budget, agent) that a campaign needs.
It knows nothing about Kubernetes objects as a whole; those live in the resource modules.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

_DURATION = re.compile(r"^([1-9][0-9]*)(s|m|h|d)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
BUILD_ID_PATTERN = r"^(reference|sha256:[0-9a-f]{64})$"
DURATION_PATTERN = r"^[1-9][0-9]*(s|m|h|d)$"


class StrictModel(BaseModel):
    """Base for every API model: unknown fields are errors, camelCase names as written."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)


def parse_duration(value: str) -> float:
    """Seconds in a duration such as ``30s``, ``10m``, ``6h`` or ``1d``."""
    match = _DURATION.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a duration; use a positive integer with unit s, m, h or d, e.g. 30s, 10m, 6h, 1d")
    return float(int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def _check_duration(value: str) -> str:
    parse_duration(value)
    return value


Duration = Annotated[
    str,
    AfterValidator(_check_duration),
    Field(pattern=DURATION_PATTERN, json_schema_extra={"example": "10m"}),
]
"""A duration string: a positive integer with unit s, m, h or d."""

BuildId = Annotated[str, Field(pattern=BUILD_ID_PATTERN)]
"""``reference`` or ``sha256:<64 lowercase hex>``."""


class Histogram(StrictModel):
    """A histogram of token counts: ``counts[i]`` requests have length up to ``bounds[i]``."""

    bounds: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    counts: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Histogram:
        if len(self.bounds) != len(self.counts):
            raise ValueError(
                f"bounds and counts must have the same length (bounds has {len(self.bounds)}, counts has {len(self.counts)})"
            )
        if any(b <= a for a, b in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError("bounds must be strictly increasing")
        if sum(self.counts) <= 0:
            raise ValueError("counts must not all be zero")
        return self

    def mean(self) -> float:
        """Mean length, taking each bucket at its upper bound."""
        total = sum(self.counts)
        return sum(b * c for b, c in zip(self.bounds, self.counts, strict=True)) / total


class WorkloadProfile(StrictModel):
    """The shape of traffic: input and output length histograms plus concurrency."""

    inputTokens: Histogram
    outputTokens: Histogram
    concurrency: int = Field(default=1, ge=1, le=4096)

    def digest(self) -> str:
        """A stable short hash of the profile, used to key ledgers and manifests."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


ObjectiveMetric = Literal["outputTokensPerSecond", "totalTokensPerSecond", "ttftP95", "itlP95"]
ConstraintMetric = Literal[
    "itlP95Ms", "itlP50Ms", "ttftP95Ms", "ttftP50Ms", "outputTokensPerSecond", "totalTokensPerSecond"
]


class Constraint(StrictModel):
    """A bound a build must respect to win, e.g. ``{metric: itlP95Ms, max: 30}``."""

    metric: ConstraintMetric
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check(self) -> Constraint:
        if self.min is None and self.max is None:
            raise ValueError("a constraint needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class Objective(StrictModel):
    """What a campaign optimises. Throughput metrics are maximised, latency metrics minimised."""

    metric: ObjectiveMetric = "outputTokensPerSecond"
    constraints: list[Constraint] = Field(default_factory=list)

    @property
    def maximize(self) -> bool:
        return self.metric in ("outputTokensPerSecond", "totalTokensPerSecond")


class Gates(StrictModel):
    """Correctness and improvement gates a candidate build must pass."""

    tokenAgreement: float = Field(default=0.98, gt=0, le=1)
    logitTolerance: float = Field(default=0.05, gt=0)
    minSpeedup: float = Field(default=1.05, ge=1)


class Budget(StrictModel):
    """How much a campaign may spend. Every value is positive."""

    maxExperiments: int = Field(default=200, gt=0)
    deadline: Duration = "24h"
    sandboxes: int = Field(default=2, gt=0, le=64)
    experimentTimeout: Duration = "10m"


class SecretKeyRef(StrictModel):
    """A key in a Secret in the resource's namespace."""

    name: str = Field(min_length=1)
    key: str = Field(min_length=1)


class AgentSpec(StrictModel):
    """Which agent drives the experiments. ``Claude`` needs ``apiKeySecretRef``."""

    kind: Literal["Search", "Claude"] = "Search"
    model: str = "claude-sonnet-4-5"
    apiKeySecretRef: SecretKeyRef | None = None
    instructions: str = ""
    maxTokens: int = Field(default=2_000_000, gt=0, description="Token budget for the whole campaign (input + output).")

    @model_validator(mode="after")
    def _check(self) -> AgentSpec:
        if self.kind == "Claude" and self.apiKeySecretRef is None:
            raise ValueError("kind Claude requires apiKeySecretRef ({name, key} of the Secret holding the Anthropic API key)")
        return self
