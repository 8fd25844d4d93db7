"""Cross-field rules, declared once: each gives the pydantic check and the CRD's CEL rule.

Owns: ``Rule`` (a CEL expression over ``self``, the one sentence that both the API server and
``polymorph validate`` print, the field it points at, and the Python predicate pydantic runs),
``FieldError`` (how a broken rule reaches ``polymorph.contract.validate`` with its location), and the
two hooks a model class uses: ``check_rules`` for its after-validator and ``add_rules`` for its
JSON schema (``x-kubernetes-validations``).

A rule's CEL expression and its Python predicate state the same fact twice, in two languages,
beside each other; ``tests/api/test_api_cel.py`` evaluates every CEL expression with a CEL
interpreter against valid and invalid manifests, and ``tests/control_plane/test_cel_server.py``
sends the same manifests to the real kube-apiserver; both assert that the API server's verdict
and sentence are the ones ``validate`` gives. The message is static (no values interpolated), so
the two can be equal. Two semantic notes the rules follow:

- The CRD schema carries no defaults (the models apply them), so a rule that reads an
  optional field guards it with ``has()``; the predicate reads the model's default instead.
- ``has()`` is "the field is given", and the predicate reads ``None`` as "not given". The two
  agree on an explicit ``null`` too: the API server keeps it (the CRD marks optional fields
  nullable), but CEL sees a null-valued field as absent, so ``{profile: {...}, traceUri: null}``
  passes both ``validate`` and the API server.

This module knows nothing about any one resource.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

__all__ = [
    "FieldError",
    "Rule",
    "add_rules",
    "cel_strictly_increasing",
    "check_rules",
    "min_max_rules",
    "name_rule",
    "strictly_increasing",
]


class FieldError(ValueError):
    """A cross-field rule broken at a known place inside the model, e.g. ``steps``.

    Raised from a model validator; pydantic reports it at the model's location and keeps the
    exception, so ``polymorph.contract.validate`` can point at ``loc`` beneath it. The message alone
    still reads as a sentence where nobody looks at ``loc``.
    """

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


@dataclass(frozen=True)
class Rule:
    """One cross-field rule of a model.

    ``cel`` is checked by the API server with ``self`` bound to the model's object; ``holds``
    is the same check over the validated model instance. When it fails, both report
    ``message`` at ``field`` (a field of the model, or a dotted path below it such as
    ``metadata.name``, as a CRD ``fieldPath``), or at the model itself when ``field`` is None.
    A resource's rules always name a field: the API server reports a rule without one at
    ``<nil>``.
    """

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field: str | None = None

    def __post_init__(self) -> None:
        if "\n" in self.message or not self.message:
            raise ValueError("a rule's message must be one non-empty line (the API server requires it)")

    @property
    def loc(self) -> tuple[str, ...]:
        """Where the rule is reported, relative to the model."""
        return tuple(self.field.split(".")) if self.field else ()

    def validation(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry of this rule."""
        entry = {"rule": self.cel, "message": self.message}
        if self.field:
            entry["fieldPath"] = f".{self.field}"
        return entry


def name_rule(max_length: int, pattern: str, message: str) -> Rule:
    """A resource's ``metadata.name`` rule: at most ``max_length`` characters, matching ``pattern``
    (a regular expression that CEL's ``matches`` and Python's ``re`` read alike), reported at
    ``metadata.name`` with ``message``."""
    regex = re.compile(pattern)
    return Rule(
        f"self.metadata.name.size() <= {max_length} && self.metadata.name.matches('{pattern}')",
        message,
        lambda resource: (
            len(resource.metadata.name) <= max_length and regex.match(resource.metadata.name) is not None
        ),
        field="metadata.name",
    )


def min_max_rules(needs_a_bound: str, ordered: str) -> tuple[Rule, Rule]:
    """The two rules of a range of optional ``min`` and ``max`` fields: at least one is given
    (``needs_a_bound``, reported at the model), and ``min <= max`` when both are (``ordered``,
    reported at ``min``)."""
    return (
        Rule(
            "has(self.min) || has(self.max)",
            needs_a_bound,
            lambda r: r.min is not None or r.max is not None,
        ),
        Rule(
            "!has(self.min) || !has(self.max) || self.min <= self.max",
            ordered,
            lambda r: r.min is None or r.max is None or r.min <= r.max,
            field="min",
        ),
    )


def check_rules(model: Any, rules: Sequence[Rule]) -> None:
    """Raise ``FieldError`` for the first rule ``model`` breaks (pydantic reports one per model)."""
    for rule in rules:
        if not rule.holds(model):
            raise FieldError(rule.loc, rule.message)


def add_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    """``json_schema_extra`` hook: put the class's ``RULES`` into its schema as CEL."""
    rules: Sequence[Rule] = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.validation() for rule in rules]


def strictly_increasing(values: Sequence[float]) -> bool:
    """Whether every value is above the one before it."""
    return all(b > a for a, b in pairwise(values))


def cel_strictly_increasing(values: str, element: str = "x") -> str:
    """CEL that holds when the list ``values`` is strictly increasing: sorted, and no value twice.

    ``isSorted()`` is in the Kubernetes CEL list library (since 1.24); ``exists_one`` is standard.
    """
    return f"{values}.isSorted() && {values}.all({element}, {values}.exists_one(y, y == {element}))"
