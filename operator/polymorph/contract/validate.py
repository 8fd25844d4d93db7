"""Checking ModelDeployment and CompileJob manifests, and ``polymorph validate``.

Owns: dispatching each document (read by ``polymorph.contract.yaml_input``: bounded, duplicate keys
refused) on apiVersion/kind to its model, and translating pydantic errors into one line per
problem for people: ``spec.rollout.steps[1].weight: must be <= 100``; "did you mean"
suggestions are made only for short names, never over a large value. Spec fields are
validated strictly (``replicas: "4"`` is an error, as the API server says). It knows nothing
about what the operator does with a valid object.

    polymorph validate FILE...    exit 0 when every document is valid, 1 otherwise
"""

from __future__ import annotations

import argparse
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from polymorph.contract import api
from polymorph.contract.api import (
    API_VERSION,
    CompileJob,
    CompileJobSpec,
    ModelDeployment,
    ModelDeploymentSpec,
)
from polymorph.contract.api.common import (
    BUILD_ID_PATTERN,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    DURATION_PATTERN,
)
from polymorph.contract.api.rules import FieldError
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import read_text
from polymorph.contract.yaml_input import documents, yaml_problem

Resource = ModelDeployment | CompileJob
KINDS: dict[str, tuple[type[ModelDeployment] | type[CompileJob], type[BaseModel]]] = {
    "ModelDeployment": (ModelDeployment, ModelDeploymentSpec),
    "CompileJob": (CompileJob, CompileJobSpec),
}
_EXPECTED_KINDS = " or ".join(KINDS)

# What a pattern means, in words, for the patterns people meet.
_PATTERN_WORDS = {
    DURATION_PATTERN: "must be a duration: a positive whole number with unit ms, s, m, h or d, "
    "e.g. 30s, 10m, 6h, 1d",
    BUILD_ID_PATTERN: "must be 'reference' or a build id sha256:<64 lowercase hex digits>",
    DNS_LABEL_PATTERN: "must be lowercase letters, digits and '-', starting and ending with a letter or digit",
    DNS_SUBDOMAIN_PATTERN: "must be lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


# ---------------------------------------------------------------------------------------------
# Pydantic errors -> sentences


def format_path(loc: tuple[str | int, ...]) -> str:
    """``('spec', 'rollout', 'steps', 1, 'weight')`` -> ``spec.rollout.steps[1].weight``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (key)"
        elif _IDENTIFIER.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def _unwrap(tp: Any) -> Any:
    """The model, list or dict type under Annotated and ``X | None``."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(options) != 1:
                return tp
            tp = options[0]
        else:
            return tp


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class found at ``loc`` below ``root``, or None when loc leads elsewhere."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            field = tp.model_fields.get(part)
            if field is None:
                return None
            tp = field.annotation
        elif origin is list and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _required(root: type[BaseModel] | None, loc: tuple[str | int, ...]) -> bool:
    """Whether the field at ``loc`` below ``root`` has no default."""
    parent = _model_at(root, loc[:-1]) if root is not None and loc else None
    field = parent.model_fields.get(str(loc[-1])) if parent is not None else None
    return field is not None and field.is_required()


def _show(value: Any) -> str:
    """A short rendering of a bad input value for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _unknown_field(name: Any, model: type[BaseModel] | None) -> str:
    shown = _show(str(name))
    if model is None:
        return f"unknown field {shown}"
    allowed = list(model.model_fields)
    message = f"unknown field {shown} (allowed: {', '.join(allowed)})"
    if len(str(name)) > MAX_SUGGEST_LENGTH:  # no fuzzy matching over a large value
        return message
    close = difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.6)
    if not close:
        lowered = {a.lower(): a for a in allowed}
        close = [lowered[str(name).lower()]] if str(name).lower() in lowered else []
    if close:
        message += f"; did you mean {close[0]!r}?"
    return message


def _message(error: ErrorDetails) -> str:
    """One sentence for one pydantic error (without its path)."""
    kind = error["type"]
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    value = error.get("input")
    got = f" (got {_show(value)})"
    if kind == "missing":
        return "is required"
    if kind in ("literal_error", "enum"):
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"must be one of {', '.join(options)}{got}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"must be {bounds[kind]} {_number(limit)}{got}"
    if value is None and kind.endswith("_type"):
        return "must not be null; remove the field to use its default"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        point = " written without a decimal point" if isinstance(value, float) and value.is_integer() else ""
        return f"must be an integer{point}{got}"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number{got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false{got}"
    if kind == "string_type":
        hint = "; put it in quotes" if isinstance(value, int | float) else ""
        return f"must be a string{got}{hint}"
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"must be at least {n} characters long"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters long (got {len(str(value))})"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return f"must have at least {n} item{'s' if n != 1 else ''}"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items (got {ctx.get('actual_length')})"
    if kind == "list_type":
        return f"must be a list{got}"
    if kind in ("dict_type", "model_type", "model_attributes_type", "dataclass_type"):
        return f"must be a mapping of fields{got}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return _PATTERN_WORDS.get(pattern, f"must match the pattern {pattern}") + got
    if kind.startswith(("datetime", "date_")):
        return f"must be a date-time such as 2025-01-31T12:00:00Z{got}"
    if kind in ("value_error", "assertion_error"):
        cause = ctx.get("error")
        text = str(cause) if cause is not None else error["msg"]
        return text.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "multiple_of":
        return f"must be a multiple of {_number(ctx.get('multiple_of'))}{got}"
    text = error["msg"].removeprefix("Input should be ")
    return f"must be {text}{got}" if text != error["msg"] else text[:1].lower() + text[1:]


def format_validation_error(
    exc: ValidationError, prefix: str = "", root: type[BaseModel] | None = None
) -> list[str]:
    """One line per problem in ``exc``: ``<prefix><path>: <what is allowed>``.

    ``prefix`` is put in front of every line as given (e.g. ``"crd.yaml: ModelDeployment/x: "``).
    ``root`` is the model that was validated; with it, an unknown field's line lists the
    allowed fields and suggests the closest one. It defaults to the ``polymorph.contract.api`` model
    named in the error's title; for other models the line only names the field.
    """
    if root is None:
        named = getattr(api, exc.title, None)
        root = named if isinstance(named, type) and issubclass(named, BaseModel) else None
    return [prefix + line for line in _lines(exc.errors(), root)]


def _lines(errors: list[ErrorDetails], root: type[BaseModel] | None) -> list[str]:
    lines: list[str] = []
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] == "invalid_key":
            where = format_path(loc[:-1])
            text = f"field name {_show(loc[-1])} must be a string"
        elif error["type"] == "extra_forbidden":
            parent, name = loc[:-1], loc[-1]
            where = format_path(parent)
            text = _unknown_field(name, _model_at(root, parent) if root else None)
        else:
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, FieldError):
                loc = loc + cause.loc
            where = format_path(loc)
            text = _message(error)
            if error.get("input", ...) is None and error["type"] != "missing" and _required(root, loc):
                text = "is required and must not be null"
        line = f"{where}: {text}" if where else text
        if line not in lines:
            lines.append(line)
    return lines


# ---------------------------------------------------------------------------------------------
# Documents -> objects


MAX_SUGGEST_LENGTH = 64
"""Names longer than this get no "did you mean" (fuzzy matching is quadratic in length)."""


def _label(kind: str, doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{kind}/{name}" if isinstance(name, str) and name else f"{kind}/<no name>"


def validate_document(doc: Any) -> tuple[Resource | None, str, list[str]]:
    """Validate one parsed document: (the object or None, its ``Kind/name`` label, problems)."""
    if not isinstance(doc, dict):
        got = "a list" if isinstance(doc, list) else f"{type(doc).__name__} {_show(doc)}"
        return None, "", [f"expected a mapping with apiVersion, kind, metadata and spec, got {got}"]
    kind = doc.get("kind")
    if kind is None:
        return None, "", [f"missing kind (expected {_EXPECTED_KINDS})"]
    if not isinstance(kind, str) or kind not in KINDS:
        message = f"unknown kind {_show(kind)} (expected {_EXPECTED_KINDS})"
        short = isinstance(kind, str) and len(kind) <= MAX_SUGGEST_LENGTH  # never fuzzy over a large value
        close = [k for k in KINDS if short and k.lower() == str(kind).lower()]
        close = close or (
            difflib.get_close_matches(str(kind), list(KINDS), n=1, cutoff=0.85) if short else []
        )
        if close:
            message += f"; did you mean {close[0]!r}?"
        return None, "", [message]
    label = _label(kind, doc)
    api_version = doc.get("apiVersion")
    if api_version is None:
        return None, label, [f"missing apiVersion (expected {API_VERSION})"]
    if api_version != API_VERSION:
        return None, label, [f"apiVersion {_show(api_version)} is not supported (expected {API_VERSION})"]
    model, spec_model = KINDS[kind]
    errors: list[ErrorDetails] = []
    obj: Resource | None = None
    strict_spec = isinstance(doc.get("spec"), dict)
    try:
        obj = model.model_validate(doc)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if not (strict_spec and e["loc"] and e["loc"][0] == "spec")]
    # The spec is checked strictly too: the API server does not turn "4" into 4.
    if strict_spec:
        try:
            spec_model.model_validate(doc["spec"], strict=True)
        except ValidationError as exc:
            obj = None
            errors += [typing.cast(ErrorDetails, {**e, "loc": ("spec", *e["loc"])}) for e in exc.errors()]
    return obj, label, _lines(errors, model)


def check_text(text: str, source: str) -> tuple[list[Resource], list[str], list[str]]:
    """Validate every document in ``text``.

    Returns (valid objects, every report line in document order, the problem lines among
    them); each line starts with ``source``. Pure: reads nothing but ``text``.
    """
    objects: list[Resource] = []
    lines: list[str] = []
    problems: list[str] = []
    docs: list[Any] = []
    broken = ""
    try:
        for doc in documents(text):
            docs.append(doc)
    except yaml.YAMLError as exc:
        broken = f"{source}: {yaml_problem(exc)}"
    except RecursionError:
        broken = f"{source}: invalid YAML: it nests too deeply"
    present = [(i, d) for i, d in enumerate(docs, start=1) if d is not None]
    if not present and not broken:
        problems.append(
            f"{source}: empty file (no YAML documents); expected a ModelDeployment or a CompileJob"
        )
    numbered = len(docs) > 1
    for index, doc in present:
        items = _list_items(doc)
        for sub, item in enumerate(items if items is not None else [doc]):
            where = f"document {index}" if numbered else ""
            if items is not None:
                where = f"{where} items[{sub}]".strip()
            obj, label, found = validate_document(item)
            head = ": ".join(part for part in (source, label or where) if part)
            if obj is not None and not found:
                objects.append(obj)
                lines.append(f"{source}: ok ({label})")
            problems += [f"{head}: {line}" for line in found]
            lines += [f"{head}: {line}" for line in found]
    if broken:
        problems.append(broken)
    shown = set(lines)  # a set: this must stay linear in the number of documents
    lines += [p for p in problems if p not in shown]
    return objects, lines, problems


def _list_items(doc: Any) -> list[Any] | None:
    """The items of a ``kind: List`` document (as ``kubectl get -o yaml`` writes), else None."""
    if isinstance(doc, dict) and doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
        items = doc.get("items")
        return items if isinstance(items, list) else []
    return None


def _read(path: str) -> str:
    if path != "-" and Path(path).is_dir():
        raise UsageError(f"{path}: is a directory; give YAML files")
    return read_text(path)


def load_manifest(path_or_text: str | Path) -> list[Resource]:
    """Every ModelDeployment and CompileJob in a file (a ``Path``, or a ``str`` without a newline
    that names one) or in YAML text (a ``str`` with a newline). Raises ``UsageError`` whose
    message holds one line per problem."""
    if isinstance(path_or_text, Path) or (
        "\n" not in path_or_text and not path_or_text.lstrip().startswith("{")
    ):
        source = str(path_or_text)
        text = _read(source)
    else:
        source, text = "<manifest>", path_or_text
    objects, _, problems = check_text(text, source)
    if problems:
        raise UsageError("\n".join(problems))
    return objects


# ---------------------------------------------------------------------------------------------
# The command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", metavar="FILE", nargs="+", help="YAML manifests ('-' reads standard input)")


def run(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            text = _read(path)
        except UsageError as exc:
            print(exc)
            failed = True
            continue
        try:
            _, lines, problems = check_text(text, path)
        except Exception as exc:  # a bug here must still not show a person a traceback
            lines = problems = [
                f"{path}: could not be validated ({type(exc).__name__}: {exc}); please report this"
            ]
        for line in lines:
            print(line)
        failed = failed or bool(problems)
    return 1 if failed else 0


__all__ = [
    "KINDS",
    "check_text",
    "configure",
    "format_path",
    "format_validation_error",
    "load_manifest",
    "run",
    "validate_document",
]
