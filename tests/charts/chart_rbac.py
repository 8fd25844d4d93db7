"""The chart's RBAC as the API server's authorizer sees it, and the chart's one RBAC table.

- ``effective_permissions(docs, sa, ns)`` resolves rendered (Cluster)RoleBindings to the rules
  that reach a ServiceAccount; ``permits`` answers one API call against them.
- ``rbac_table()`` reads the table in ``templates/_helpers.tpl`` (``polymorph.rbacTable``), with
  each row's ``unexercised`` verbs and the reason no scenario uses them.
- ``audit(granted, calls)`` compares recorded API calls (the real API server's audit log, through
  ``audited_calls``) with the grants: the calls that were refused, and the granted (verb, group,
  resource) never used.
- ``audited_calls(events)`` and ``forbidden(events)``: the real API server's audit events
  (``audit.k8s.io/v1``) as calls, and those its authorizer refused.

It imports no sibling module, so the operator's integration tests (``charts.chart_rbac``) and the
chart tests (``chart_rbac``) share it. It knows nothing about helm: it reads rendered documents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

HELPERS = Path(__file__).resolve().parents[2] / "charts" / "polymorph" / "templates" / "_helpers.tpl"

CLUSTER = "*"
"""The scope of a ClusterRoleBinding: every namespace and the cluster-scoped resources."""


class Permission(NamedTuple):
    scope: str  # a namespace, or CLUSTER
    api_group: str
    resource: str
    verb: str


class Call(NamedTuple):
    """One API request as RBAC sees it; ``namespace`` None for cluster-scoped or all-namespaces calls."""

    verb: str
    api_group: str
    resource: str  # resource[/subresource]
    namespace: str | None


Use = tuple[str, str, str]
"""(verb, apiGroup, resource): a permission regardless of where it is granted."""


@dataclass(frozen=True)
class Row:
    """One row of the chart's RBAC table."""

    where: str  # watched | clusterWide | peering
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    cluster_resources: tuple[str, ...] = ()
    unexercised: dict[str, str] = field(default_factory=dict)
    """verb -> why no scenario uses it (each such verb is still one the code calls)."""

    def uses(self) -> set[Use]:
        return {
            (v, g, r)
            for v in self.verbs
            for g in self.api_groups
            for r in {*self.resources, *self.cluster_resources}
        }


def _of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def _rules_of(
    docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None
) -> list[dict[str, Any]]:
    roles = [
        d
        for d in _of_kind(docs, kind)
        if d["metadata"]["name"] == name and d["metadata"].get("namespace") == namespace
    ]
    assert len(roles) == 1, f"{kind} {name} in {namespace} is bound but not rendered"
    rules: list[dict[str, Any]] = roles[0]["rules"]
    return rules


def effective_permissions(
    docs: list[dict[str, Any]], service_account: str, namespace: str
) -> set[Permission]:
    """Every (scope, group, resource, verb) the bindings in ``docs`` grant to the ServiceAccount."""
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
    granted: set[Permission] = set()
    for binding in _of_kind(docs, "ClusterRoleBinding") + _of_kind(docs, "RoleBinding"):
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        bound_ns = binding["metadata"].get("namespace")
        scope = CLUSTER if binding["kind"] == "ClusterRoleBinding" else bound_ns
        role_ns = None if ref["kind"] == "ClusterRole" else bound_ns
        for rule in _rules_of(docs, ref["kind"], ref["name"], role_ns):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted |= {Permission(scope, group, resource, verb) for verb in rule["verbs"]}
    return granted


def permits(granted: set[Permission], namespace: str | None, group: str, resource: str, verb: str) -> bool:
    """Whether one API call (``namespace`` None for a cluster-scoped or all-namespaces call) is allowed."""
    scopes = {CLUSTER} if namespace is None else {CLUSTER, namespace}
    return any(Permission(s, group, resource, verb) in granted for s in scopes)


def rbac_table(path: Path = HELPERS) -> list[Row]:
    """The rows of ``polymorph.rbacTable`` (plain YAML between its define and end)."""
    text = path.read_text()
    found = re.search(r'{{-? define "polymorph\.rbacTable" -?}}(.*?){{-? end }}', text, re.S)
    assert found, f"no polymorph.rbacTable in {path}"
    rows = yaml.safe_load(found.group(1))
    return [
        Row(
            where=r["where"],
            api_groups=tuple(r["apiGroups"]),
            resources=tuple(r["resources"]),
            verbs=tuple(r["verbs"]),
            cluster_resources=tuple(r.get("clusterResources") or ()),
            unexercised=dict(r.get("unexercised") or {}),
        )
        for r in rows
    ]


def documented_unexercised(rows: list[Row]) -> set[Use]:
    """The (verb, group, resource) the table says no scenario uses, each with its reason."""
    out: set[Use] = set()
    for row in rows:
        assert set(row.unexercised) <= set(row.verbs), f"unexercised verbs not granted: {row}"
        assert all(why.strip() for why in row.unexercised.values()), (
            f"an unexercised verb needs a reason: {row}"
        )
        out |= {(v, g, r) for (v, g, r) in row.uses() if v in row.unexercised}
    return out


def audited_calls(events: list[dict[str, Any]]) -> set[Call]:
    """The resource requests among the audit events, as RBAC sees them."""
    out = set()
    for event in events:
        ref = event.get("objectRef") or {}
        if ref.get("resource"):
            resource = "/".join(filter(None, (ref["resource"], ref.get("subresource"))))
            out.add(Call(event["verb"], ref.get("apiGroup", ""), resource, ref.get("namespace")))
    return out


def forbidden(events: list[dict[str, Any]]) -> list[str]:
    """The audit events the authorizer refused, each as ``verb resource: reason``."""
    return [
        f"{e['verb']} {(e.get('objectRef') or {}).get('resource')}: {e['annotations'].get('authorization.k8s.io/reason')}"
        for e in events
        if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"
    ]


def audit(granted: set[Permission], calls: set[Call]) -> tuple[list[Call], set[Use]]:
    """(the calls ``granted`` refuses, the granted (verb, group, resource) that no call used)."""
    refused = sorted(c for c in calls if not permits(granted, c.namespace, c.api_group, c.resource, c.verb))
    used = {(c.verb, c.api_group, c.resource) for c in calls}
    unused = {(p.verb, p.api_group, p.resource) for p in granted} - used
    return refused, unused
