"""Discovery for kubectl, kopf and the kubernetes client: ``/api``, ``/apis``, group/version lists,
``/version`` and OpenAPI v3 documents, all computed from the served resource types (pure functions).

The OpenAPI documents only carry what clients look for: each kind's schema with its
``x-kubernetes-group-version-kind``, and the ``fieldValidation`` parameter on its operations, which makes
kubectl leave validation to the server instead of validating client-side.
"""

from __future__ import annotations

import collections
import copy
import re
from collections.abc import Mapping

from .resources import JSON, ApiError, ResourceType

__all__ = ["discovery_document", "group_versions", "openapi_document"]


def discovery_document(
    path: str, types: Mapping[tuple[str, str, str], ResourceType], revision: int
) -> JSON | None:
    """The discovery, version or OpenAPI document at ``path``; None when ``path`` is not one of them."""
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for group, version, _ in types:
        if version not in groups[group]:
            groups[group].append(version)

    def group_entry(group: str) -> JSON:
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups[group]]
        return {"name": group, "versions": versions, "preferredVersion": versions[0]}

    if path == "/openapi/v3":
        return {
            "paths": {
                gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={revision}"} for gv in group_versions(types)
            }
        }
    if path.startswith("/openapi/v3/"):
        return openapi_document(path.removeprefix("/openapi/v3/"), types)
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
        resources = [t for (g, v, _), t in types.items() if (g, v) == (group, version)]
        if not resources:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for t in resources for entry in t.discovery()],
        }
    return None


def group_versions(types: Mapping[tuple[str, str, str], ResourceType]) -> list[str]:
    """The served group/versions as OpenAPI v3 paths (``api/v1``, ``apis/apps/v1``…)."""
    return sorted({f"apis/{g}/{v}" if g else "api/v1" for g, v, _ in types})


def openapi_document(group_version: str, types: Mapping[tuple[str, str, str], ResourceType]) -> JSON:
    """An OpenAPI v3 document for one group/version: enough for kubectl to validate server-side.

    kubectl looks for the ``fieldValidation`` parameter on each kind's PATCH operation; finding
    it, it sends ``fieldValidation=Strict`` and leaves the validation to this server.
    """
    if group_version not in group_versions(types):
        raise ApiError(
            404,
            "NotFound",
            f"the server could not find the requested resource (/openapi/v3/{group_version})",
        )
    paths: JSON = {}
    schemas: JSON = {}
    for rtype in types.values():
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
        ref = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}}}
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
