"""Server-side Tables (``as=Table;g=meta.k8s.io;v=v1``) from a CRD's ``additionalPrinterColumns``.

Pure functions: a tiny jsonPath evaluator (``.a.b``, ``[0]``, ``[?(@.k=="v")]``) and kubectl-style ages.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from .resources import JSON, ResourceType

__all__ = ["humanize_age", "jsonpath_value", "table"]


_JSONPATH_TOKEN = re.compile(
    r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]"
)


def jsonpath_value(obj: Any, expression: str) -> Any:
    """Evaluate a printer-column jsonPath (``.a.b``, ``[0]``, ``[?(@.type=="Ready")]``); None if absent."""
    current: Any = obj
    position = 0
    expression = expression.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    while position < len(expression):
        match = _JSONPATH_TOKEN.match(expression, position)
        if match is None:
            return None
        position = match.end()
        name, index, filter_key, filter_value = match.groups()
        if name is not None:
            current = current.get(name) if isinstance(current, dict) else None
        elif index is not None:
            current = current[int(index)] if isinstance(current, list) and int(index) < len(current) else None
        else:
            matches = [i for i in current or [] if jsonpath_value(i, "." + filter_key) == filter_value]
            current = matches[0] if matches else None
        if current is None:
            return None
    return current


def humanize_age(timestamp: str | None, now: datetime.datetime) -> str | None:
    """The age of an RFC 3339 timestamp as kubectl shows it (``42s``, ``5m``, ``3h``, ``2d``)."""
    if not timestamp:
        return None
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(rtype: ResourceType, objects: list[JSON], list_meta: JSON, include: str) -> JSON:
    now = datetime.datetime.now(datetime.UTC)
    name_column = {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}
    columns = rtype.printer_columns or (
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "Age"},
    )
    definitions = [name_column] + [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in columns
    ]
    rows = []
    for obj in objects:
        cells: list[Any] = [obj["metadata"]["name"]]
        for column in columns:
            value = jsonpath_value(obj, column["jsonPath"])
            cells.append(humanize_age(value, now) if column.get("type") == "date" else value)
        partial = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
        row: JSON = {"cells": cells}
        if include != "None":
            row["object"] = obj if include == "Object" else partial
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions,
        "rows": rows,
    }
