"""Structural-schema handling of custom objects, as the API server does: defaults, pruning, validation.

Pure functions over a CRD's ``openAPIV3Schema``; validation is jsonschema's, after translating the
OpenAPI 3.0 dialect (``nullable``, boolean ``exclusiveMinimum``, ``x-kubernetes-int-or-string``).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema

from .resources import JSON

__all__ = ["prune_and_default", "validate_object"]


def _to_jsonschema(schema: Any) -> Any:
    """Turn an OpenAPI v3 structural schema into JSON Schema (``nullable``, int-or-string)."""
    if isinstance(schema, list):
        return [_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    result = {k: _to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    result.pop("nullable", None)
    result.pop("default", None)
    if schema.get("x-kubernetes-int-or-string"):
        result.pop("type", None)
        result["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(schema.get(exclusive), bool):  # OpenAPI 3.0 booleans, JSON Schema numbers
            result.pop(exclusive)
            if schema[exclusive] and bound in result:
                result[exclusive] = result.pop(bound)
    if schema.get("nullable") and "type" in result:
        result["type"] = [result["type"], "null"]
    if result.get("format") not in (None, "date-time", "email", "uri", "ipv4", "ipv6"):
        result.pop("format")  # int32, int64, double, byte…: informational for this emulator
    return result


def _preserves(schema: JSON) -> bool:
    return (
        bool(schema.get("x-kubernetes-preserve-unknown-fields")) or schema.get("additionalProperties") is True
    )


def prune_and_default(value: Any, schema: JSON, path: str, unknown: list[str], top: bool = False) -> Any:
    """Apply schema defaults and drop fields the schema does not know, recording their paths."""
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        properties: JSON = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        result = {}
        for key, item in value.items():
            child_path = f"{path}.{key}" if path else key
            if top and key in ("apiVersion", "kind", "metadata"):
                result[key] = item
            elif key in properties:
                result[key] = prune_and_default(item, properties[key], child_path, unknown)
            elif isinstance(additional, dict):
                result[key] = prune_and_default(item, additional, child_path, unknown)
            elif _preserves(schema):
                result[key] = item
            else:
                unknown.append(child_path)
        for key, sub in properties.items():
            if key not in result and "default" in sub:
                result[key] = prune_and_default(copy.deepcopy(sub["default"]), sub, f"{path}.{key}", unknown)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"], f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    return value


def _field_path(error: jsonschema.ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    if error.validator == "required" and isinstance(error.message, str):
        missing = error.message.split("'")[1] if "'" in error.message else ""
        path = f"{path}.{missing}" if path else missing
    return path or "<root>"


def validate_object(obj: JSON, schema: JSON) -> list[JSON]:
    """Validation causes (``field``, ``message``, ``reason``) of an object against a structural schema."""
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    top = _to_jsonschema(schema)
    for key in ("apiVersion", "kind", "metadata"):
        top.get("properties", {}).pop(key, None)
    validator = jsonschema.Draft202012Validator(
        top, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    causes = []
    for error in sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path))):
        field_path = _field_path(error)
        reason = "FieldValueRequired" if error.validator == "required" else "FieldValueInvalid"
        causes.append({"reason": reason, "message": f"{field_path}: {error.message}", "field": field_path})
    return causes
