"""JSON merge patch (RFC 7386) and the strategic-merge directives this emulator drops (pure functions).

Strategic merge is approximated as merge: lists are replaced, never merged by key.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["merge_patch", "strip_directives"]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strip_directives(patch: Any) -> Any:
    """Drop strategic-merge directives (``$patch``, ``$setElementOrder/…``, ``$retainKeys``)."""
    if isinstance(patch, dict):
        return {k: strip_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [strip_directives(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    return patch
