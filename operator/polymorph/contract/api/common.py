"""Building blocks shared by every Polymorph resource and by the engine, agents and operator.

Owns: the strict base model (unknown fields are errors), durations, build ids, workload
profiles, the CompileJob pieces (objective, gates, budget, agent) that a campaign needs, and
the Kubernetes pieces every resource has (object metadata, status conditions).
Every cross-field rule is a ``Rule`` in the model's ``RULES`` (see ``polymorph.contract.api.rules``):
StrictModel runs them as its validator and writes them into the schema as CEL.
It knows nothing about any one resource as a whole; those live in the resource modules.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from polymorph.contract.api.rules import (
    FieldError as FieldError,  # re-exported: validators raise it, validate reads it
)
from polymorph.contract.api.rules import (
    Rule,
    add_rules,
    cel_strictly_increasing,
    check_rules,
    min_max_rules,
    strictly_increasing,
)

_DURATION = re.compile(r"^([1-9][0-9]*)(ms|s|m|h|d)$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
BUILD_ID_PATTERN = r"^(reference|sha256:[0-9a-f]{64})$"
DURATION_PATTERN = r"^[1-9][0-9]*(ms|s|m|h|d)$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A Kubernetes DNS-1123 label: lowercase letters, digits and '-', starting and ending alphanumeric."""
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Kubernetes DNS-1123 subdomain: dot-separated DNS labels (the rule for object names)."""
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
_QUANTITY = re.compile(QUANTITY_PATTERN)
MAX_BUCKETS = 64
"""The most buckets a token-length histogram may have."""


class StrictModel(BaseModel):
    """Base for every API model: unknown fields are errors, camelCase names as written.

    ``RULES`` are the model's cross-field rules: checked after its fields validate, and put into
    its JSON schema (hence the CRD) as ``x-kubernetes-validations``.
    """

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, validate_assignment=True, json_schema_extra=add_rules
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        check_rules(self, type(self).RULES)
        return self


MAX_DURATION_S = 366 * 86400
"""The longest duration anything accepts (``366d``): longer is a typo, and overflows timers."""


def parse_duration(value: str) -> float:
    """Seconds in a duration such as ``500ms``, ``30s``, ``10m``, ``6h`` or ``1d``: the one duration syntax.

    Manifests, every command-line flag and the chart's values use it: a positive whole number,
    then a unit ``ms``, ``s``, ``m``, ``h`` or ``d``, at most ``366d``. ``ValueError`` (one
    sentence saying what is allowed, with a hint for the near misses) otherwise.
    """
    text = value if isinstance(value, str) else ""
    match = _DURATION.match(text) if len(text) <= 24 else None
    if match is None:
        raise ValueError(f"{shown_duration(value)} is not a duration{_hint(text)}; {DURATION_RULE}")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{shown_duration(value)} is longer than the longest duration allowed, 366d")
    return float(seconds)


DURATION_RULE = "use a positive whole number with unit ms, s, m, h or d, e.g. 500ms, 30s, 10m, 6h, 1d"
"""What a duration is, in the words every refusal uses."""


def _hint(text: str) -> str:
    """What the near miss ``text`` should have been, in parentheses, or ``""``."""
    if text.startswith("-") or (re.fullmatch(r"0*(\.0*)?(ms|s|m|h|d)?", text) and "0" in text):
        return " (durations must be positive)"
    if re.fullmatch(r"[0-9]{1,12}", text):
        return f" (add a unit: {int(text)}s)"
    number = re.fullmatch(r"([0-9]{0,12}\.[0-9]{1,6})(s?)", text)
    if number and float(number.group(1)) > 0:
        millis = float(number.group(1)) * 1000
        if millis == int(millis):
            return f" (whole numbers only: {int(millis)}ms)"
    return ""


def format_duration(seconds: float) -> str:
    """``seconds`` in the duration syntax, exactly (``600.0`` -> ``10m``, ``0.5`` -> ``500ms``)."""
    millis = round(seconds * 1000)
    for unit in ("d", "h", "m", "s"):
        size = int(_UNIT_SECONDS[unit] * 1000)
        if millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{millis}ms"


def shown_duration(value: str) -> str:
    """``value`` quoted, cut to 40 characters, for messages."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_duration(value: str) -> str:
    parse_duration(value)
    return value


Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, json_schema_extra={"example": "10m"}),
    AfterValidator(_check_duration),
]
"""A duration string: a positive integer with unit ms, s, m, h or d, at most 366d."""

BuildId = Annotated[str, Field(pattern=BUILD_ID_PATTERN)]
"""``reference`` or ``sha256:<64 lowercase hex>``."""

DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
"""A name that Kubernetes accepts as a label value and as most object names."""


def _check_quantity(value: object) -> str:
    # YAML reads `cpu: 2` as an int; Kubernetes accepts int-or-string, so normalise to the string form.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("must be a Kubernetes quantity such as 500m, 2, 16Gi or 1.5")
    text = str(value)
    if not _QUANTITY.match(text):
        raise ValueError(f"{text!r} is not a Kubernetes quantity; use e.g. 500m, 2, 16Gi or 1.5")
    return text


Quantity = Annotated[
    str,
    BeforeValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
        }
    ),
]
"""A Kubernetes resource quantity (``500m``, ``2``, ``16Gi``), stored as its string form."""


class Histogram(StrictModel):
    """A histogram of token counts: ``counts[i]`` requests have length up to ``bounds[i]``."""

    RULES = (
        Rule(
            "size(self.bounds) == size(self.counts)",
            "bounds and counts must have the same length",
            lambda h: len(h.bounds) == len(h.counts),
            field="counts",
        ),
        Rule(
            cel_strictly_increasing("self.bounds"),
            "bounds must be strictly increasing",
            lambda h: strictly_increasing(h.bounds),
            field="bounds",
        ),
        Rule(
            "self.counts.exists(c, c > 0)",
            "counts must not all be zero",
            lambda h: any(c > 0 for c in h.counts),
            field="counts",
        ),
    )

    # maxItems bounds the CEL cost the API server estimates for the rules above.
    bounds: list[Annotated[int, Field(ge=1)]] = Field(min_length=1, max_length=MAX_BUCKETS)
    counts: list[Annotated[int, Field(ge=0)]] = Field(min_length=1, max_length=MAX_BUCKETS)

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

    RULES = min_max_rules("a constraint needs min, max or both", "constraint min must be <= max")

    metric: ConstraintMetric
    min: float | None = None
    max: float | None = None


class Objective(StrictModel):
    """What a campaign optimises. Throughput metrics are maximised, latency metrics minimised."""

    metric: ObjectiveMetric = "outputTokensPerSecond"
    constraints: list[Constraint] = Field(default_factory=list, max_length=16)

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

    RULES = (
        Rule(
            "!has(self.kind) || self.kind != 'Claude' || has(self.apiKeySecretRef)",
            "kind Claude requires apiKeySecretRef ({name, key} of the Secret holding the Anthropic API key)",
            lambda a: a.kind != "Claude" or a.apiKeySecretRef is not None,
            field="apiKeySecretRef",
        ),
    )

    kind: Literal["Search", "Claude"] = "Search"
    model: str = "claude-sonnet-4-5"
    apiKeySecretRef: SecretKeyRef | None = None
    instructions: str = ""
    maxTokens: int = Field(
        default=2_000_000, gt=0, description="Token budget for the whole campaign (input + output)."
    )


API_GROUP = "polymorph.dev"
ApiVersion = Literal["polymorph.dev/v1alpha1"]
"""The ``apiVersion`` of every Polymorph resource."""
API_VERSION: ApiVersion = "polymorph.dev/v1alpha1"
DEFAULT_NAMESPACE = "default"
"""The namespace of an object that names none."""


class StatusModel(BaseModel):
    """Base for status models. Status is written only by the operator; every field is optional.

    Unknown fields are ignored rather than rejected, so an operator reading status that a
    newer (or older) operator wrote never fails on it.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, validate_assignment=True)


class Condition(StatusModel):
    """A Kubernetes-style condition such as Ready, Compiling, RollingOut or Degraded."""

    type: str
    status: Literal["True", "False", "Unknown"] = "Unknown"
    reason: str = ""
    message: str = ""
    lastTransitionTime: datetime | None = None
    observedGeneration: int | None = None


class OwnerReference(BaseModel):
    """An owner of this object (the operator sets it on the CompileJobs a deployment opens)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    blockOwnerDeletion: bool | None = None


class ObjectMeta(StrictModel):
    """Kubernetes object metadata: what a person writes (name, namespace, labels, annotations)
    plus what the API server adds. Unknown fields are errors, so ``lables`` is caught."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    generateName: str | None = None
    namespace: str | None = Field(default=None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    resourceVersion: str | None = None
    generation: int | None = None
    creationTimestamp: datetime | None = None
    deletionTimestamp: datetime | None = None
    deletionGracePeriodSeconds: int | None = None
    finalizers: list[str] = Field(default_factory=list)
    ownerReferences: list[OwnerReference] = Field(default_factory=list)
    managedFields: list[dict[str, Any]] = Field(default_factory=list)
    selfLink: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace, name)``; the namespace is ``default`` when the object names none, as
        the API server and kubectl read it."""
        return self.namespace or DEFAULT_NAMESPACE, self.name


class ResourceModel(StrictModel):
    """Base of a whole Polymorph object (apiVersion, kind, metadata, spec, status).

    ``NAME_MAX_LENGTH`` is the longest ``metadata.name`` the resource accepts; the resource's name
    rule (CEL in the CRD) checks it, so the API server gives that rule's sentence.
    """

    NAME_MAX_LENGTH: ClassVar[int] = 253

    if TYPE_CHECKING:  # declared by each resource, so its field order stays apiVersion, kind, metadata
        metadata: ObjectMeta

    def manifest(self) -> dict[str, Any]:
        """The object as a JSON-ready dict for the Kubernetes API, without unset optional fields."""
        data = self.model_dump(mode="json", exclude_none=True)
        data["metadata"] = self.metadata.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
        return data
