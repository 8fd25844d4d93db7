"""What the emulated server knows about resource types: built-ins, CRD-declared types, errors.

Pure data and pure functions; no HTTP and no storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import kmock

__all__ = [
    "BUILTIN_TYPES",
    "CRD_KEY",
    "JSON",
    "NAMESPACE_KEY",
    "Access",
    "ApiError",
    "ResourceType",
    "types_from_crd",
]


JSON = dict[str, Any]


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
