"""Label and field selectors with the real API server's semantics (pure functions)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from .resources import JSON, ApiError

__all__ = ["LabelRequirement", "labels_match", "parse_field_selector", "parse_label_selector"]


class LabelRequirement(NamedTuple):
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]


_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """Parse a label selector (``a=b,c!=d,e in (x,y),f notin (z),g,!h``); ValueError if malformed."""
    parts, depth, current = [], 0, ""
    for char in text:  # split on commas outside parentheses
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    result = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        equality = re.match(r"^([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)$", part)
        if equality:
            key, op, value = equality.groups()
            result.append(LabelRequirement(key, "!=" if op == "!=" else "=", frozenset({value})))
            continue
        setbased = _SET_RE.match(part)
        if not setbased or (setbased.group(1) and setbased.group(3)):
            raise ValueError(f"unable to parse requirement: {part!r}")
        negated, key, op, values = setbased.groups()
        if op:
            result.append(
                LabelRequirement(key, op, frozenset(v.strip() for v in values.split(",") if v.strip()))
            )
        else:
            result.append(LabelRequirement(key, "!exists" if negated else "exists", frozenset()))
    return result


def labels_match(requirements: Iterable[LabelRequirement], labels: Mapping[str, str]) -> bool:
    """Whether a label set satisfies every requirement, with the real server's semantics."""
    for req in requirements:
        present, value = req.key in labels, labels.get(req.key)
        ok = {
            "=": present and value in req.values,
            "!=": not present or value not in req.values,
            "in": present and value in req.values,
            "notin": not present or value not in req.values,
            "exists": present,
            "!exists": not present,
        }[req.op]
        if not ok:
            return False
    return True


_FIELDS: dict[str, Callable[[JSON], Any]] = {
    "metadata.name": lambda o: o.get("metadata", {}).get("name"),
    "metadata.namespace": lambda o: o.get("metadata", {}).get("namespace") or "",
}
_EVENT_FIELDS: dict[str, Callable[[JSON], Any]] = {
    "involvedObject.kind": lambda o: o.get("involvedObject", {}).get("kind"),
    "involvedObject.name": lambda o: o.get("involvedObject", {}).get("name"),
    "involvedObject.namespace": lambda o: o.get("involvedObject", {}).get("namespace"),
    "involvedObject.uid": lambda o: o.get("involvedObject", {}).get("uid"),
    "regarding.name": lambda o: o.get("regarding", {}).get("name"),
    "regarding.kind": lambda o: o.get("regarding", {}).get("kind"),
    "reason": lambda o: o.get("reason"),
    "type": lambda o: o.get("type"),
}


def parse_field_selector(text: str, kind: str) -> list[tuple[Callable[[JSON], Any], bool, str]]:
    """Parse a field selector into (getter, equal?, value); ApiError 400 for an unsupported field."""
    fields = _FIELDS | (_EVENT_FIELDS if kind == "Event" else {})
    result = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = re.match(r"^([A-Za-z.]+)\s*(==|=|!=)\s*(.*)$", part)
        if not match:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part!r}")
        name, op, value = match.groups()
        if name not in fields:
            raise ApiError(400, "BadRequest", f'field label not supported: "{name}"')
        result.append((fields[name], op != "!=", value))
    return result
