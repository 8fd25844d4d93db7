"""The emulator: kmock's ``KubernetesEmulator`` with the real API server's storage and wire semantics.

It owns the objects (in kmock's ``ObjectsArray``, so every version stays inspectable), the global
resourceVersion, the watch history and the access log. Discovery, selectors, patches, schemas and
tables are pure functions in sibling modules; this module only routes requests through them.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import datetime
import json
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import apps, parsing
from kmock._internal.rendering import Response

from .discovery import discovery_document
from .patches import merge_patch, strip_directives
from .protobuf import ProtobufUnsupported, decode_object
from .resources import (
    BUILTIN_TYPES,
    CRD_KEY,
    JSON,
    NAMESPACE_KEY,
    Access,
    ApiError,
    ResourceType,
    types_from_crd,
)
from .schemas import prune_and_default, validate_object
from .selectors import labels_match, parse_field_selector, parse_label_selector
from .tables import table

__all__ = ["WATCH_HISTORY", "ConformantKubernetesEmulator"]


WATCH_HISTORY = 20_000  # events kept per resource for resumed watches; older versions get 410 Gone


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
        content_type = raw_request.headers.get("Content-Type", "")
        binary = "protobuf" in content_type or "cbor" in content_type
        try:
            resource = _resource_of(raw_request.path)
        except ValueError:  # kmock 0.8 cannot parse ``/api/v1/namespaces``
            resource = kmock.resource("", "v1", "namespaces")
        else:
            if not binary:
                return await super().__call__(raw_request)
        # kmock cannot parse this request itself: build its Request here, decoding protobuf to JSON.
        body = await raw_request.read()
        error: ApiError | None = None
        data: Any = None
        try:
            data = decode_object(body) if binary and body else json.loads(body) if body else None
        except ProtobufUnsupported as problem:
            if raw_request.method != "DELETE":  # a DELETE's protobuf DeleteOptions: use the defaults
                error = ApiError(415, "UnsupportedMediaType", str(problem))
        except ValueError:
            data = None
        headers = dict(raw_request.headers) | ({"Content-Type": "application/json"} if binary else {})
        request = kmock.Request(
            id=len(self._requests),
            method=raw_request.method,
            url=raw_request.url,
            params=dict(raw_request.query),
            headers=headers,
            body=b"" if binary and data is None else body,  # undecodable DeleteOptions: the defaults
            data=data,
            resource=resource,
            raw_request=raw_request,
        )
        self._requests.append(request)
        if error is not None:
            rejected: aiohttp.web.StreamResponse = await Response(status=error.code, payload=error.status())(
                request
            )
            return rejected
        response: aiohttp.web.StreamResponse = await self._handle(request)
        return response

    async def _handle(self, request: kmock.Request) -> Any:
        # Skip KubernetesEmulator._handle: it mutates its own store before the reactions run.
        return await apps.RawHandler._handle(self, request)

    # --- entry point -------------------------------------------------------------------------

    async def _serve(self, request: kmock.Request) -> Response:
        try:
            return await self._route(request)
        except ApiError as error:
            return Response(status=error.code, payload=error.status())

    async def _route(self, request: kmock.Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        if path == "/_emulator/access-log":
            return _json([a._asdict() for a in self.access_log])
        discovery = discovery_document(path, self._types, self._revision)
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
                return _json(table(rtype, [obj], meta, params.get("includeObject", "Metadata")))
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
                where = namespace or obj["metadata"].get("namespace")
                if self._lookup(rtype, where, obj["metadata"]["name"]) is not None:  # not cascaded away
                    self._delete(rtype, where, obj["metadata"]["name"], {})
            return _json(self._list_body(rtype, items))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

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
                    self._remove(self._type_of(res), item.raw)
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
                rtype = self._type_of_stored(res)
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
    ) -> Response:
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
    ) -> Response:
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
    ) -> Response:
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
    ) -> Response:
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
                rtype = self._type_of(res)
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
    ) -> Response:
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
            return _json(table(rtype, items, meta, params.get("includeObject", "Metadata")))
        return _json(self._list_body(rtype, items, meta))

    def _watch(
        self, rtype: ResourceType, namespace: str | None, name: str | None, params: Mapping[str, str]
    ) -> Response:
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
        return Response(
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

    def _type_of_stored(self, res: kmock.resource) -> ResourceType | None:
        return self._types.get((res.group or "", res.version or "", res.plural or ""))

    def _type_of(self, res: kmock.resource) -> ResourceType:
        rtype = self._type_of_stored(res)
        assert rtype is not None, f"stored objects of an unserved resource {res}"  # CRD removal deletes them
        return rtype

    def type_for_kind(self, api_version: str, kind: str) -> ResourceType | None:
        """The served resource type of an ``apiVersion`` and ``kind``, as in a manifest."""
        group, _, version = api_version.rpartition("/")
        return next(
            (t for t in self._types.values() if (t.group, t.version, t.kind) == (group, version, kind)), None
        )

    # --- helpers for tests in the same process -----------------------------------------------

    def stored(self, api_version: str, plural: str, namespace: str | None, name: str) -> JSON | None:
        """The stored object, or None; for assertions from the server's own event loop."""
        group, _, version = api_version.rpartition("/")
        rtype = self._types.get((group, version, plural))
        return None if rtype is None else copy.deepcopy(self._lookup(rtype, namespace, name))


def _resource_of(path: str) -> kmock.resource | None:
    """kmock's own reading of a path (ValueError where kmock 0.8 cannot parse it)."""
    parsed = parsing.parse_path(path)
    if parsed.group is None:
        return None
    return kmock.resource(parsed.group, parsed.version, parsed.plural)


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


def _json(payload: Any, *, status: int = 200, warnings: Iterable[str] = ()) -> Response:
    headers = {"Content-Type": "application/json"}
    warning_list = list(warnings)
    if warning_list:
        headers["Warning"] = ", ".join('299 - "' + w.replace('"', '\\"') + '"' for w in warning_list)
    return Response(status=status, headers=headers, payload=json.dumps(payload).encode())
