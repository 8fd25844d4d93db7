"""JSON merge patches (RFC 7386) between status documents: the one way the operator writes status.

``status_patch(old, new)`` is the patch that turns ``old`` into ``new`` (changed keys, and None
for keys ``new`` dropped), ``sequenced_patch`` the same with the operator's write counter
(``status.polymorph.seq``) bumped when anything changes, and ``merged`` applies a patch. Pure:
documents in, documents out; it knows nothing about what the documents mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["JSON", "merged", "sequenced_patch", "status_patch"]

JSON = dict[str, Any]
"""A JSON object, as the Kubernetes API reads and writes it."""


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> JSON:
    """A JSON merge patch from ``old`` to ``new``: changed keys, and None for keys ``new`` dropped."""
    old = old or {}
    patch: JSON = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            inner = status_patch(before, value)
            if inner:
                patch[key] = inner
        elif value != before:
            patch[key] = value
    return patch


def sequenced_patch(old: Mapping[str, Any], new: JSON, seq: int) -> JSON:
    """``status_patch(old, new)``, plus ``polymorph.seq = seq + 1`` when anything changes."""
    new.setdefault("polymorph", {})["seq"] = seq
    diff = status_patch(old, new)
    if not diff:
        return {}
    new["polymorph"]["seq"] = seq + 1
    return status_patch(old, new)


def merged(status: Mapping[str, Any] | None, patch: Mapping[str, Any] | None) -> JSON:
    """``status`` with the JSON merge patch ``patch`` applied (None removes a key)."""
    out: JSON = dict(status or {})
    for key, value in (patch or {}).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
