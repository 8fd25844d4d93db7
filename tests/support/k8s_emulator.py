"""A conformant-enough Kubernetes API server for tests: kmock 0.8's emulator with real API semantics.

``ConformantKubernetesEmulator`` subclasses ``kmock.KubernetesEmulator``. It keeps kmock's DSL (user
reactions such as ``emulator['get /api/v1/pods'] << 500`` take priority, iterating it yields the recorded requests
every request, ``emulator.objects[res, ns, name].history`` holds every stored version), and replaces its
storage semantics with what the real kube-apiserver does, so kopf, kubectl and the kubernetes client
behave as they would against a cluster:

- Every write bumps a global ``resourceVersion``; objects get ``uid``, ``creationTimestamp`` and a
  ``generation`` that changes only when something other than metadata and status changes.
  ``generateName`` is honoured, and namespaced objects need an existing namespace.
- The status subresource is separated for built-ins that have one and for CRDs that declare it.
- Create answers 201; GET, LIST (``XxxList`` with ``metadata.resourceVersion``, label and field
  selectors, ``limit``/``continue``), PUT (409 on a stale ``resourceVersion``), PATCH (merge,
  strategic treated as merge, JSON-patch with a failed ``test`` giving 422, server-side apply
  approximated as create-or-merge), DELETE (finalizers keep the object with ``deletionTimestamp``;
  owner references cascade as the garbage collector would; ``propagationPolicy=Orphan`` orphans)
  and deletecollection.
- Watches honour ``resourceVersion`` (after it; absent or ``0``: synthetic ADDED events first),
  ``timeoutSeconds``, selectors (an object leaving a selector is DELETED for that watch), answer
  ``application/json`` and send 410 Gone for a version older than the retained history.
- Discovery (``/api``, ``/apis``, ``/apis/<g>``, ``/apis/<g>/<v>``, ``/version``) lists the built-in
  kinds the operator uses and every CRD created through ``apiextensions.k8s.io/v1``.
- Server-side Tables (``Accept: application/json;as=Table;g=meta.k8s.io;v=v1``) use a CRD's
  ``additionalPrinterColumns``, so ``kubectl get md`` prints them.
- Custom objects are defaulted, pruned and validated against the CRD's ``openAPIV3Schema`` with
  jsonschema: 422 with the field path on invalid values; unknown fields are pruned with a ``Warning``
  header, or refused with 400 "strict decoding error" under ``fieldValidation=Strict`` (kubectl's
  default), as the real server does.
- ``access_log`` records (verb, apiGroup, resource, subresource, namespace) per API request, with
  RBAC verb names, for RBAC tests.

It is not a full server: no admission webhooks, no RBAC enforcement, no managed fields, no
controllers (Deployments never get ready pods on their own: tests patch their ``/status``), and
strategic-merge patches merge lists by replacement.

Running it: ``EmulatorThread`` serves it on a loopback port from a background thread (the
``k8s_emulator`` pytest fixture uses it); ``python -m support.k8s_emulator --port N --ready-file F``
serves it as a separate process; ``write_kubeconfig`` points clients at it over plain http.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import copy
import datetime
import json
import os
import random
import re
import signal
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp.web
import attrs
import jsonpatch
import jsonschema
import kmock
import pytest
import yaml
from kmock._internal import apps, parsing

__all__ = [
    "Access",
    "ApiError",
    "ConformantKubernetesEmulator",
    "EmulatorThread",
    "ResourceType",
    "k8s_emulator",
    "main",
    "write_kubeconfig",
]

JSON = dict[str, Any]
WATCH_HISTORY = 20_000  # events kept per resource for resumed watches; older versions get 410 Gone


class Access(NamedTuple):
    """One API request, as RBAC would see it."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    api_group: str
    resource: str
    subresource: str
    namespace: str


class ApiError(Exception):
    """A failure answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> JSON:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


# ---------------------------------------------------------------------------------------------
# Resource types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceType:
    """What the server knows about one group/version/plural: discovery, scope, schema, columns."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    schema: JSON | None = None  # the CRD's openAPIV3Schema; None for built-ins (not validated)
    printer_columns: tuple[JSON, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> kmock.resource:
        return kmock.resource(self.group, self.version, self.plural)

    def discovery(self) -> list[JSON]:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        entry = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
            "shortNames": list(self.short_names),
            "categories": list(self.categories),
        }
        entries = [entry]
        if self.status_subresource:
            status = {"name": f"{self.plural}/status", "singularName": "", "namespaced": self.namespaced}
            entries.append(status | {"kind": self.kind, "verbs": ["get", "patch", "update"]})
        return entries


def _builtin(group: str, version: str, plural: str, kind: str, **extra: Any) -> ResourceType:
    return ResourceType(group, version, plural, kind, **extra)


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _builtin(
        "", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",), status_subresource=True
    ),
    _builtin("", "v1", "pods", "Pod", short_names=("po",), status_subresource=True),
    _builtin("", "v1", "services", "Service", short_names=("svc",), status_subresource=True),
    _builtin("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    _builtin("", "v1", "secrets", "Secret"),
    _builtin("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _builtin("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short_names=("pvc",)),
    _builtin("", "v1", "events", "Event", short_names=("ev",)),
    _builtin("apps", "v1", "deployments", "Deployment", short_names=("deploy",), status_subresource=True),
    _builtin("apps", "v1", "replicasets", "ReplicaSet", short_names=("rs",), status_subresource=True),
    _builtin("batch", "v1", "jobs", "Job", status_subresource=True),
    _builtin("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease"),
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _builtin(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
    ),
    _builtin(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        status_subresource=True,
    ),
)
CRD_KEY = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACE_KEY = ("", "v1", "namespaces")


def types_from_crd(crd: JSON) -> list[ResourceType]:
    """The served resource types that one CustomResourceDefinition declares, one per served version."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    result = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        result.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                status_subresource="status" in (version.get("subresources") or {}),
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=tuple(version.get("additionalPrinterColumns", ())),
            )
        )
    return result


# ---------------------------------------------------------------------------------------------
# Selectors
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Structural schemas: defaulting, pruning, validation
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------

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


def _table(rtype: ResourceType, objects: list[JSON], list_meta: JSON, include: str) -> JSON:
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


# ---------------------------------------------------------------------------------------------
# The emulator
# ---------------------------------------------------------------------------------------------


@dataclass
class _Watcher:
    resource: tuple[str, str, str]
    namespace: str | None
    name: str | None
    matches: Callable[[JSON], bool]
    queue: asyncio.Queue[tuple[str, JSON | None, JSON]] = field(default_factory=asyncio.Queue)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


@attrs.define(kw_only=True)
class ConformantKubernetesEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the real API server's semantics (see the module docstring)."""

    namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public", "kube-node-lease")
    access_log: list[Access] = attrs.field(factory=list, init=False)
    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    _revision: int = attrs.field(default=0, init=False)
    watch_history: int = WATCH_HISTORY
    _history: dict[tuple[str, str, str], collections.deque[tuple[int, str, JSON | None, JSON]]] = attrs.field(
        factory=dict, init=False
    )
    _watchers: list[_Watcher] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        # Deliberately not the parent's: its fallbacks implement the semantics replaced here.
        self.fallback << self._serve
        for rtype in BUILTIN_TYPES:
            self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
        for name in self.namespaces:
            self._store(
                self._types[NAMESPACE_KEY],
                None,
                self._new_object(
                    self._types[NAMESPACE_KEY],
                    None,
                    {
                        "metadata": {"name": name},
                        "spec": {"finalizers": ["kubernetes"]},
                        "status": {"phase": "Active"},
                    },
                ),
            )

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        try:
            parsing.parse_path(raw_request.path)
        except ValueError:  # kmock 0.8 cannot parse ``/api/v1/namespaces``: serve it without reactions
            body = await raw_request.read()
            try:
                data = json.loads(body) if body else None
            except ValueError:
                data = None
            request = kmock.Request(
                id=len(self._requests),
                method=raw_request.method,
                url=raw_request.url,
                params=dict(raw_request.query),
                headers=dict(raw_request.headers),
                body=body,
                text=body.decode(errors="replace"),
                data=data,
                resource=kmock.resource("", "v1", "namespaces"),
                raw_request=raw_request,
            )
            self._requests.append(request)
            response: aiohttp.web.StreamResponse = await (await self._serve(request))(request)
            return response
        return await super().__call__(raw_request)

    async def _handle(self, request: kmock.Request) -> Any:
        # Skip KubernetesEmulator._handle: it mutates its own store before the reactions run.
        return await apps.RawHandler._handle(self, request)

    # --- entry point -------------------------------------------------------------------------

    async def _serve(self, request: kmock.Request) -> kmock.Response:
        try:
            return await self._route(request)
        except ApiError as error:
            return kmock.Response(status=error.code, payload=error.status())

    async def _route(self, request: kmock.Request) -> kmock.Response:
        path = request.url.path.rstrip("/") or "/"
        if path == "/_emulator/access-log":
            return _json([a._asdict() for a in self.access_log])
        discovery = self._discovery(path)
        if discovery is not None:
            return _json(discovery)
        if request.resource is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        parts = path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        namespace: str | None = None
        if (
            len(rest) > 2
            and rest[0] == "namespaces"
            and not (group == "" and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        version = parts[1] if parts[0] == "api" else parts[2]
        plural = rest[0] if rest else ""
        name = rest[1] if len(rest) > 1 else None
        subresource = "/".join(rest[2:])
        rtype = self._types.get((group, version, plural))
        if rtype is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        if not rtype.namespaced and namespace is not None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        method = request.method.value if request.method is not None else "GET"
        params = request.params
        watching = method == "GET" and params.get("watch") in ("true", "1")
        verb = _rbac_verb(method, name, watching)
        self.access_log.append(Access(verb, group, plural, subresource, namespace or ""))
        if subresource and subresource != "status":
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        if subresource == "status" and not rtype.status_subresource:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")

        if verb == "watch":
            return self._watch(rtype, namespace, name, params)
        if verb == "list":
            return self._list(rtype, namespace, params, request.headers.get("Accept", ""))
        if verb == "get":
            obj = self._get(rtype, namespace, name)
            if "as=Table" in request.headers.get("Accept", ""):
                meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                return _json(_table(rtype, [obj], meta, params.get("includeObject", "Metadata")))
            return _json(obj)
        body = _body(request)
        if verb == "create":
            return self._create(rtype, namespace, body, params)
        assert name is not None or verb == "deletecollection"
        if verb == "update":
            return self._update(rtype, namespace, name or "", body, subresource, params)
        if verb == "patch":
            content_type = request.headers.get("Content-Type", "application/merge-patch+json").split(";")[0]
            return self._patch(rtype, namespace, name or "", body, content_type, subresource, params)
        if verb == "delete":
            return _json(self._delete(rtype, namespace, name or "", body if isinstance(body, dict) else {}))
        if verb == "deletecollection":
            items = self._select(rtype, namespace, params)
            for obj in items:
                self._delete(
                    rtype, namespace or obj["metadata"].get("namespace"), obj["metadata"]["name"], {}
                )
            return _json(self._list_body(rtype, items))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    # --- discovery ---------------------------------------------------------------------------

    def _discovery(self, path: str) -> JSON | None:
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for group, version, _ in self._types:
            if version not in groups[group]:
                groups[group].append(version)

        def group_entry(group: str) -> JSON:
            versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups[group]]
            return {"name": group, "versions": versions, "preferredVersion": versions[0]}

        if path == "/openapi/v3":
            return {
                "paths": {
                    gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={self._revision}"}
                    for gv in self._group_versions()
                }
            }
        if path.startswith("/openapi/v3/"):
            return self._openapi(path.removeprefix("/openapi/v3/"))
        if path == "/version":
            return {
                "major": "1",
                "minor": "35",
                "gitVersion": "v1.35.0-polymorph-emulator",
                "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if path == "/api":
            address = {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [address]}
        if path == "/apis":
            entries = [group_entry(g) for g in groups if g]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": entries}
        match = re.fullmatch(r"/apis/([^/]+)", path)
        if match:
            if match.group(1) not in groups or not match.group(1):
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return {"kind": "APIGroup", "apiVersion": "v1"} | group_entry(match.group(1))
        match = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if match:
            group, version = ("", "v1") if match.group(1) else (match.group(2), match.group(3))
            resources = [t for (g, v, _), t in self._types.items() if (g, v) == (group, version)]
            if not resources:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [entry for t in resources for entry in t.discovery()],
            }
        return None

    def _group_versions(self) -> list[str]:
        return sorted({f"apis/{g}/{v}" if g else "api/v1" for g, v, _ in self._types})

    def _openapi(self, group_version: str) -> JSON:
        """An OpenAPI v3 document for one group/version: enough for kubectl to validate server-side.

        kubectl looks for the ``fieldValidation`` parameter on each kind's PATCH operation; finding
        it, it sends ``fieldValidation=Strict`` and leaves the validation to this server.
        """
        if group_version not in self._group_versions():
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource (/openapi/v3/{group_version})",
            )
        paths: JSON = {}
        schemas: JSON = {}
        for rtype in self._types.values():
            if (f"apis/{rtype.group}/{rtype.version}" if rtype.group else "api/v1") != group_version:
                continue
            gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
            name = ".".join(reversed(rtype.group.split("."))) if rtype.group else "io.k8s.api.core"
            schema_name = f"{name}.{rtype.version}.{rtype.kind}"
            schema = (
                copy.deepcopy(rtype.schema)
                if rtype.schema
                else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            )
            schemas[schema_name] = schema | {"x-kubernetes-group-version-kind": [gvk]}
            scope = "/namespaces/{namespace}" if rtype.namespaced else ""
            item_path = f"/{group_version}{scope}/{rtype.plural}/{{name}}"
            parameters = [
                {"name": p, "in": "query", "schema": {"type": "string"}}
                for p in ("dryRun", "fieldManager", "fieldValidation")
            ]
            ref = {
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}}
            }
            operation = {
                "parameters": parameters,
                "responses": {"200": ref},
                "x-kubernetes-group-version-kind": gvk,
            }
            paths[item_path] = {"get": operation, "put": operation, "patch": operation}
            paths[f"/{group_version}{scope}/{rtype.plural}"] = {"post": operation}
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.35.0"},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    # --- storage -----------------------------------------------------------------------------

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    def _lookup(self, rtype: ResourceType, namespace: str | None, name: str) -> JSON | None:
        key = (rtype.key, namespace if rtype.namespaced else None, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return self._objects[key].raw

    def _get(self, rtype: ResourceType, namespace: str | None, name: str | None) -> JSON:
        obj = self._lookup(rtype, namespace, name or "")
        if obj is None:
            group = f".{rtype.group}" if rtype.group else ""
            details = {"name": name, "group": rtype.group, "kind": rtype.plural}
            raise ApiError(404, "NotFound", f'{rtype.plural}{group} "{name}" not found', details)
        return copy.deepcopy(obj)

    def _store(self, rtype: ResourceType, old: JSON | None, new: JSON) -> None:
        """Persist a new version (bumping resourceVersion) and notify watches."""
        meta = new["metadata"]
        meta["resourceVersion"] = self._next_revision()
        key = (rtype.key, meta.get("namespace") if rtype.namespaced else None, meta["name"])
        if key in self._objects:
            self._objects[key].history.append(copy.deepcopy(new))
        else:
            self._objects[key] = copy.deepcopy(new)
        self._emit(rtype, "MODIFIED" if old is not None else "ADDED", old, new)

    def _remove(self, rtype: ResourceType, obj: JSON) -> JSON:
        """Delete an object for good (its last version gets a new resourceVersion) and cascade."""
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._next_revision()
        meta = gone["metadata"]
        self._objects[(rtype.key, meta.get("namespace") if rtype.namespaced else None, meta["name"])].delete()
        self._emit(rtype, "DELETED", obj, gone)
        if (rtype.group, rtype.version, rtype.plural) == CRD_KEY:
            for served in types_from_crd(obj):
                for (res, _ns, _name), item in list(self._objects.items()):
                    if res == served.key and not item.deleted:
                        self._remove(served, item.raw)
                self._types.pop((served.group, served.version, served.plural), None)
        if (rtype.group, rtype.version, rtype.plural) == NAMESPACE_KEY:
            for (res, ns, _name), item in list(self._objects.items()):
                if ns == meta["name"] and not item.deleted:
                    self._remove(self._types[(res.group, res.version, res.plural)], item.raw)
        self._collect_garbage(meta["uid"])
        return gone

    def _collect_garbage(self, owner_uid: str) -> None:
        """Delete dependents whose owners are all gone, as the garbage collector does."""
        live_uids = {o.raw["metadata"].get("uid") for o in self._objects.values() if not o.deleted}
        for (res, _, _), item in list(self._objects.items()):
            if item.deleted:
                continue
            obj = item.raw
            owners = obj["metadata"].get("ownerReferences") or []
            orphaned = not any(o.get("uid") in live_uids for o in owners)
            if owners and orphaned and any(o.get("uid") == owner_uid for o in owners):
                rtype = self._types.get((res.group, res.version, res.plural))
                if rtype is not None:
                    self._delete(rtype, obj["metadata"].get("namespace"), obj["metadata"]["name"], {})

    def _emit(self, rtype: ResourceType, event: str, old: JSON | None, new: JSON) -> None:
        key = (rtype.group, rtype.version, rtype.plural)
        history = self._history.setdefault(key, collections.deque(maxlen=self.watch_history))
        history.append((int(new["metadata"]["resourceVersion"]), event, old, new))
        for watcher in self._watchers:
            if watcher.resource == key:
                watcher.queue.put_nowait((event, old, new))

    def _new_object(self, rtype: ResourceType, namespace: str | None, body: JSON) -> JSON:
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices(_GENERATE_ALPHABET, k=5))
            meta["name"] = meta["generateName"] + suffix
        if not meta.get("name"):
            raise ApiError(
                422,
                "Invalid",
                f"{rtype.kind} is invalid: metadata.name: Required value: name or generateName is required",
            )
        if rtype.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for server_field in (
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ):
            meta.pop(server_field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        return obj

    # --- verbs -------------------------------------------------------------------------------

    def _create(
        self, rtype: ResourceType, namespace: str | None, body: Any, params: Mapping[str, str]
    ) -> kmock.Response:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        body_ns = (body.get("metadata") or {}).get("namespace")
        if rtype.namespaced:
            if namespace is None:
                raise ApiError(
                    404, "NotFound", f"the server could not find the requested resource ({rtype.plural})"
                )
            if body_ns and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            if self._lookup(self._types[NAMESPACE_KEY], None, namespace) is None:
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{namespace}" not found',
                    {"name": namespace, "kind": "namespaces"},
                )
        obj = self._new_object(rtype, namespace, body)
        if rtype.status_subresource and rtype.schema is not None:
            obj.pop("status", None)  # custom resources: status is set only through /status
        warnings = self._admit(rtype, obj, params)
        name = obj["metadata"]["name"]
        if self._lookup(rtype, namespace, name) is not None:
            group = f".{rtype.group}" if rtype.group else ""
            details = {"name": name, "group": rtype.group, "kind": rtype.plural}
            raise ApiError(409, "AlreadyExists", f'{rtype.plural}{group} "{name}" already exists', details)
        if params.get("dryRun") != "All":
            self._store(rtype, None, obj)
            self._on_stored(rtype, obj)
        return _json(obj, status=201, warnings=warnings)

    def _on_stored(self, rtype: ResourceType, obj: JSON) -> None:
        if (rtype.group, rtype.version, rtype.plural) == CRD_KEY:
            for served in types_from_crd(obj):
                self._types[(served.group, served.version, served.plural)] = served
            status = {
                "conditions": [
                    {
                        "type": "NamesAccepted",
                        "status": "True",
                        "reason": "NoConflicts",
                        "lastTransitionTime": _now(),
                    },
                    {
                        "type": "Established",
                        "status": "True",
                        "reason": "InitialNamesAccepted",
                        "lastTransitionTime": _now(),
                    },
                ],
                "acceptedNames": obj["spec"].get("names", {}),
                "storedVersions": [v["name"] for v in obj["spec"].get("versions", []) if v.get("storage")],
            }
            if obj.get("status") != status:
                established = copy.deepcopy(obj) | {"status": status}
                self._store(rtype, obj, established)

    def _admit(self, rtype: ResourceType, obj: JSON, params: Mapping[str, str]) -> list[str]:
        """Default, prune and validate a custom object in place; returns the Warning texts."""
        if rtype.schema is None:
            return []
        unknown: list[str] = []
        pruned = prune_and_default(obj, rtype.schema, "", unknown, top=True)
        obj.clear()
        obj.update(pruned)
        name = obj["metadata"]["name"]
        if unknown and params.get("fieldValidation") == "Strict":
            fields = ", ".join(f'unknown field "{u}"' for u in unknown)
            message = f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: strict decoding error: {fields}'
            raise ApiError(400, "BadRequest", message)
        causes = validate_object(obj, rtype.schema)
        if causes:
            summary = ", ".join(c["message"] for c in causes)
            details = {"name": name, "group": rtype.group, "kind": rtype.kind, "causes": causes}
            raise ApiError(
                422, "Invalid", f'{rtype.kind}.{rtype.group} "{name}" is invalid: {summary}', details
            )
        if params.get("fieldValidation") == "Ignore":
            return []
        return [f'unknown field "{u}"' for u in unknown]

    def _replace(
        self,
        rtype: ResourceType,
        current: JSON,
        candidate: JSON,
        subresource: str,
        params: Mapping[str, str],
    ) -> kmock.Response:
        """Store ``candidate`` as the next version of ``current``, enforcing what a write may change."""
        if not isinstance(candidate, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        wanted_rv = (candidate.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            name = current["metadata"]["name"]
            group = f".{rtype.group}" if rtype.group else ""
            message = f'Operation cannot be fulfilled on {rtype.plural}{group} "{name}": the object has been modified; please apply your changes to the latest version and try again'
            raise ApiError(
                409, "Conflict", message, {"name": name, "group": rtype.group, "kind": rtype.plural}
            )
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in candidate:
                new["status"] = copy.deepcopy(candidate["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(candidate)
            new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
            meta = new.setdefault("metadata", {})
            for kept in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation"):
                if kept in current["metadata"]:
                    meta[kept] = current["metadata"][kept]
                else:
                    meta.pop(kept, None)
            if rtype.status_subresource:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
            if current["metadata"].get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(current["metadata"].get("finalizers") or [])
                if added:
                    raise ApiError(
                        422,
                        "Invalid",
                        f"metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)}",
                    )
        warnings = self._admit(rtype, new, params)
        if _content(rtype, new) != _content(rtype, current):
            new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:
            return _json(new, warnings=warnings)  # a no-op write does not bump resourceVersion
        if params.get("dryRun") == "All":
            return _json(new, warnings=warnings)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return _json(self._remove(rtype, new), warnings=warnings)
        self._store(rtype, current, new)
        self._on_stored(rtype, new)
        return _json(new, warnings=warnings)

    def _update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str,
        params: Mapping[str, str],
    ) -> kmock.Response:
        current = self._get(rtype, namespace, name)
        if isinstance(body, dict) and (body.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        return self._replace(rtype, current, body, subresource, params)

    def _patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        content_type: str,
        subresource: str,
        params: Mapping[str, str],
    ) -> kmock.Response:
        if content_type == "application/apply-patch+yaml":
            if self._lookup(rtype, namespace, name) is None:
                return self._create(rtype, namespace, body, params)
            content_type = "application/merge-patch+json"  # an approximation: no field ownership
        current = self._get(rtype, namespace, name)
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            try:
                patched = jsonpatch.apply_patch(current, body)
            except jsonpatch.JsonPatchTestFailed as error:
                raise ApiError(
                    422, "Invalid", f"the server rejected our request due to an error in our request: {error}"
                ) from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                raise ApiError(
                    422, "Invalid", f"the server rejected our request due to an error in our request: {error}"
                ) from None
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            if content_type == "application/strategic-merge-patch+json":
                if rtype.schema is not None:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    )
                body = strip_directives(body)
            patched = merge_patch(current, body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {content_type}",
            )
        return self._replace(rtype, current, patched, subresource, params)

    def _delete(self, rtype: ResourceType, namespace: str | None, name: str, options: JSON) -> JSON:
        current = self._get(rtype, namespace, name)
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid") not in (None, current["metadata"]["uid"]):
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in object meta: {current['metadata']['uid']}",
            )
        if preconditions.get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
            raise ApiError(409, "Conflict", "Precondition failed: resourceVersion does not match")
        if options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents"):
            self._orphan(current["metadata"]["uid"])
        if current["metadata"].get("finalizers"):
            if current["metadata"].get("deletionTimestamp"):
                return current
            marked = copy.deepcopy(current)
            marked["metadata"]["deletionTimestamp"] = _now()
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            self._store(rtype, current, marked)
            return marked
        return self._remove(rtype, current)

    def _orphan(self, owner_uid: str) -> None:
        for (res, _, _), item in list(self._objects.items()):
            if item.deleted:
                continue
            owners = item.raw["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == owner_uid for o in owners):
                rtype = self._types[(res.group, res.version, res.plural)]
                new = copy.deepcopy(item.raw)
                new["metadata"]["ownerReferences"] = [o for o in owners if o.get("uid") != owner_uid]
                self._store(rtype, item.raw, new)

    # --- reading -----------------------------------------------------------------------------

    def _matcher(self, rtype: ResourceType, params: Mapping[str, str]) -> Callable[[JSON], bool]:
        try:
            labels = parse_label_selector(params.get("labelSelector", ""))
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {error}") from None
        fields = parse_field_selector(params.get("fieldSelector", ""), rtype.kind)

        def matches(obj: JSON) -> bool:
            if not labels_match(labels, obj["metadata"].get("labels") or {}):
                return False
            return all((getter(obj) == value) == equal for getter, equal, value in fields)

        return matches

    def _select(self, rtype: ResourceType, namespace: str | None, params: Mapping[str, str]) -> list[JSON]:
        matches = self._matcher(rtype, params)
        found = [
            item.raw
            for (res, ns, _), item in self._objects.items()
            if res == rtype.key and not item.deleted and (namespace is None or ns == namespace)
        ]
        found = [copy.deepcopy(o) for o in found if matches(o)]
        return sorted(found, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))

    def _list_body(self, rtype: ResourceType, items: list[JSON], meta: JSON | None = None) -> JSON:
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": meta or {"resourceVersion": str(self._revision)},
            "items": items,
        }

    def _list(
        self, rtype: ResourceType, namespace: str | None, params: Mapping[str, str], accept: str
    ) -> kmock.Response:
        items = self._select(rtype, namespace, params)
        meta: JSON = {"resourceVersion": str(self._revision)}
        if params.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(params["continue"]))
                after, meta["resourceVersion"] = tuple(token["after"]), token["rv"]
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "continue key is not valid") from None
            items = [
                o for o in items if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > after
            ]
        limit = int(params.get("limit") or 0)
        if 0 < limit < len(items):
            items, last = items[:limit], items[limit - 1]["metadata"]
            after_key = [last.get("namespace") or "", last["name"]]
            token_bytes = json.dumps({"after": after_key, "rv": meta["resourceVersion"]}).encode()
            meta["continue"] = base64.urlsafe_b64encode(token_bytes).decode()
            meta["remainingItemCount"] = len(self._select(rtype, namespace, params)) - limit
        if "as=Table" in accept:
            return _json(_table(rtype, items, meta, params.get("includeObject", "Metadata")))
        return _json(self._list_body(rtype, items, meta))

    def _watch(
        self, rtype: ResourceType, namespace: str | None, name: str | None, params: Mapping[str, str]
    ) -> kmock.Response:
        base = self._matcher(rtype, params)

        def matches(obj: JSON) -> bool:
            meta = obj["metadata"]
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            return (name is None or meta["name"] == name) and base(obj)

        key = (rtype.group, rtype.version, rtype.plural)
        since = params.get("resourceVersion") or "0"
        backlog: list[tuple[str, JSON | None, JSON]] = []
        if since == "0":
            backlog = [("ADDED", None, o) for o in self._select(rtype, namespace, params) if matches(o)]
            backlog.sort(key=lambda e: int(e[2]["metadata"]["resourceVersion"]))
        else:
            try:
                since_rv = int(since)
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion: {since!r}") from None
            history = self._history.get(key, collections.deque())
            if history and len(history) == history.maxlen and since_rv < history[0][0] - 1:
                backlog = [
                    (
                        "ERROR",
                        None,
                        ApiError(
                            410, "Expired", f"too old resource version: {since} ({history[0][0]})"
                        ).status(),
                    )
                ]
            else:
                backlog = [(event, old, new) for rv, event, old, new in history if rv > since_rv]
        watcher = _Watcher(key, namespace, name, matches)
        self._watchers.append(watcher)  # synchronously after the backlog: no event can fall between
        timeout = float(params.get("timeoutSeconds") or 1800)
        return kmock.Response(
            headers={"Content-Type": "application/json"},
            payload=self._stream(watcher, backlog, timeout),
        )

    async def _stream(
        self, watcher: _Watcher, backlog: list[tuple[str, JSON | None, JSON]], timeout: float
    ) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            yield b""  # send the headers now, even if nothing happens for a while
            for event in backlog:
                line = self._event_line(watcher, *event)
                if line is not None:
                    yield line
                if event[0] == "ERROR":
                    return
            while (remaining := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout=min(remaining, 1.0))
                except TimeoutError:
                    continue
                line = self._event_line(watcher, *event)
                if line is not None:
                    yield line
        finally:
            self._watchers.remove(watcher)

    @staticmethod
    def _event_line(watcher: _Watcher, event: str, old: JSON | None, new: JSON) -> bytes | None:
        if event != "ERROR":
            was, now = old is not None and watcher.matches(old), watcher.matches(new)
            if (event == "ADDED" and not now) or (event == "DELETED" and not was):
                return None
            if event == "MODIFIED":
                if not was and not now:
                    return None
                event = "ADDED" if not was else "DELETED" if not now else "MODIFIED"
        return json.dumps({"type": event, "object": new}).encode() + b"\n"

    # --- helpers for tests in the same process -----------------------------------------------

    def stored(self, api_version: str, plural: str, namespace: str | None, name: str) -> JSON | None:
        """The stored object, or None; for assertions from the server's own event loop."""
        group, _, version = api_version.rpartition("/")
        rtype = self._types.get((group, version, plural))
        return None if rtype is None else copy.deepcopy(self._lookup(rtype, namespace, name))


def _rbac_verb(method: str, name: str | None, watching: bool) -> str:
    if watching:
        return "watch"
    if method == "GET":
        return "get" if name else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return method.lower()


def _content(rtype: ResourceType, obj: JSON) -> JSON:
    """What the generation counts: everything except metadata, and status when it is a subresource."""
    skipped = {"metadata", "apiVersion", "kind"} | ({"status"} if rtype.status_subresource else set())
    return {k: v for k, v in obj.items() if k not in skipped}


def _body(request: kmock.Request) -> Any:
    content_type = request.headers.get("Content-Type", "application/json")
    if "protobuf" in content_type or "cbor" in content_type:
        # As a server without protobuf would: clients then fall back to JSON.
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: application/json, application/yaml ({content_type})",
        )
    if request.data is not None and not hasattr(request.data, "getall"):
        return request.data
    if not request.body:
        return None
    try:
        return yaml.safe_load(request.body)  # apply-patch+yaml; JSON is YAML too
    except yaml.YAMLError:
        raise ApiError(400, "BadRequest", "the request body is neither JSON nor YAML") from None


def _json(payload: Any, *, status: int = 200, warnings: Iterable[str] = ()) -> kmock.Response:
    headers = {"Content-Type": "application/json"}
    warning_list = list(warnings)
    if warning_list:
        headers["Warning"] = ", ".join('299 - "' + w.replace('"', '\\"') + '"' for w in warning_list)
    return kmock.Response(status=status, headers=headers, payload=json.dumps(payload).encode())


# ---------------------------------------------------------------------------------------------
# Running it: a thread, a process, a kubeconfig, a fixture
# ---------------------------------------------------------------------------------------------


def write_kubeconfig(path: Path, url: str, *, namespace: str = "default") -> Path:
    """Write a kubeconfig whose current context talks plain http to ``url``; returns ``path``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


class EmulatorThread:
    """Serves a ``ConformantKubernetesEmulator`` on 127.0.0.1 from its own event loop in a thread.

    Use it as a context manager; ``url`` is known once entered. ``call(fn)`` runs ``fn(emulator)`` on
    the server's loop, for assertions that must not race with requests.
    """

    def __init__(self, port: int = 0, **options: Any) -> None:
        self.port = port
        self._options = options
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)
        self.emulator = ConformantKubernetesEmulator(**options)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(timeout=30) or self._error is not None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._error!r}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def call(self, fn: Callable[[ConformantKubernetesEmulator], Any]) -> Any:
        """Run ``fn(emulator)`` on the server's event loop and return its result."""
        assert self._loop is not None

        async def run() -> Any:
            return fn(self.emulator)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace=namespace)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to the thread that waits in __enter__
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with (
            self.emulator,
            kmock.Server(self.emulator, port=self.port or None, user_agent="") as server,
        ):
            self.port = server.port
            self._ready.set()
            await self._stop.wait()


@pytest.fixture
def k8s_emulator() -> Iterator[EmulatorThread]:
    """A fresh emulator on a loopback port for one test (``.url``, ``.emulator``, ``.kubeconfig(path)``)."""
    with EmulatorThread() as running:
        yield running


def _preload(running: EmulatorThread, paths: Iterable[Path]) -> None:
    """Create every object of the YAML files (CRDs first), as ``kubectl create -f`` would."""
    documents = [
        d
        for p in paths
        for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    documents.sort(key=lambda d: d.get("kind") != "CustomResourceDefinition")
    for document in documents:
        group, _, version = document["apiVersion"].rpartition("/")
        rtype = running.call(
            lambda e, g=group, v=version, k=document["kind"]: next(
                (t for (tg, tv, _), t in e._types.items() if (tg, tv, t.kind) == (g, v, k)), None
            )
        )
        if rtype is None:
            raise SystemExit(f"cannot preload {document['kind']} {document['apiVersion']}: unknown kind")
        prefix = f"/apis/{group}/{version}" if group else "/api/v1"
        namespace = (document.get("metadata") or {}).get("namespace") or "default"
        url = (
            f"{running.url}{prefix}/namespaces/{namespace}/{rtype.plural}"
            if rtype.namespaced
            else f"{running.url}{prefix}/{rtype.plural}"
        )
        request = urllib.request.Request(
            url, json.dumps(document).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10):
            pass


def main(argv: list[str] | None = None) -> None:
    """``python -m support.k8s_emulator --port N --ready-file F``: serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m support.k8s_emulator", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--ready-file", type=Path, help="written with {url, port, pid} once serving")
    parser.add_argument("--kubeconfig", type=Path, help="also write a kubeconfig for the server here")
    parser.add_argument(
        "--preload", type=Path, action="append", default=[], help="YAML file or folder to create"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with EmulatorThread(port=args.port) as running:
        _preload(running, args.preload)
        if args.kubeconfig:
            running.kubeconfig(args.kubeconfig)
        if args.ready_file:
            partial = args.ready_file.with_suffix(".partial")
            partial.write_text(json.dumps({"url": running.url, "port": running.port, "pid": os.getpid()}))
            os.replace(partial, args.ready_file)  # readers never see a half-written file
        stop.wait()


if __name__ == "__main__":
    main()
