"""The chart's RBAC: exactly the API permissions the operator uses, in the scope it uses them, and
nothing broader (no wildcard, no extra verb, resource or namespace).

``effective_permissions`` resolves the rendered bindings to the rules that reach the operator's
ServiceAccount, as the API server's authorizer would; ``permits`` answers one API call. The
expected table below is the operator's API surface (issue 11); a recorded trace of the
operator's calls can be checked with ``permits`` one call at a time.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from chart_render import CHART, FULLNAME, NAMESPACE, VALUE_SETS, of_kind, render

CRUD = frozenset({"get", "list", "watch", "create", "patch", "delete"})
READ = frozenset({"get", "list", "watch"})

# (apiGroup, resource) -> verbs, in each watched namespace.
WATCHED: dict[tuple[str, str], frozenset[str]] = {
    ("polymorph.dev", "modeldeployments"): READ | {"patch"},
    ("polymorph.dev", "compilejobs"): READ | {"create", "patch"},  # the drift loop opens CompileJobs
    ("polymorph.dev", "modeldeployments/status"): frozenset({"get", "patch"}),
    ("polymorph.dev", "compilejobs/status"): frozenset({"get", "patch"}),
    ("apps", "deployments"): CRUD,
    ("", "services"): CRUD,
    ("", "configmaps"): CRUD,
    ("batch", "jobs"): CRUD,
    ("", "pods"): READ,
    ("", "events"): frozenset({"create", "patch"}),
    ("events.k8s.io", "events"): frozenset({"create", "patch"}),
}
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"): READ}
CLUSTER_WIDE_ONLY = {("", "namespaces"): READ}
PEERING_NAMESPACED = {("kopf.dev", "kopfpeerings"): READ | {"patch"}}
PEERING_CLUSTER = {("kopf.dev", "clusterkopfpeerings"): READ | {"patch"}}

CLUSTER = "*"
"""The scope of a ClusterRoleBinding: every namespace and the cluster-scoped resources."""


class Permission(NamedTuple):
    scope: str  # a namespace, or CLUSTER
    api_group: str
    resource: str
    verb: str


def _rules_of(
    docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None
) -> list[dict[str, Any]]:
    roles = [
        d
        for d in of_kind(docs, kind)
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
    for binding in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
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


def expected(namespaces: list[str], peering: bool) -> set[Permission]:
    def grant(scope: str, table: dict[tuple[str, str], frozenset[str]]) -> set[Permission]:
        return {Permission(scope, g, r, v) for (g, r), verbs in table.items() for v in verbs}

    if not namespaces:
        out = grant(CLUSTER, {**WATCHED, **CLUSTER_SCOPED, **CLUSTER_WIDE_ONLY})
        return out | (grant(CLUSTER, PEERING_CLUSTER) if peering else set())
    out = grant(CLUSTER, CLUSTER_SCOPED)
    for ns in namespaces:
        out |= grant(ns, WATCHED) | (grant(ns, PEERING_NAMESPACED) if peering else set())
    return out


@pytest.mark.parametrize(
    ("values", "namespaces", "peering"),
    [
        ({}, [], False),
        ({"replicas": 2}, [], True),
        ({"watchNamespaces": ["team-a", "team-b"]}, ["team-a", "team-b"], False),
        ({"replicas": 2, "watchNamespaces": ["team-a", "team-b"]}, ["team-a", "team-b"], True),
        (VALUE_SETS["everything"], ["team-a"], True),
    ],
    ids=["cluster", "cluster-peering", "namespaced", "namespaced-peering", "everything"],
)
def test_operator_gets_exactly_the_permissions_it_uses(
    values: dict[str, Any], namespaces: list[str], peering: bool
) -> None:
    granted = effective_permissions(render(values), FULLNAME, NAMESPACE)
    assert granted == expected(namespaces, peering)


def test_namespaced_install_grants_nothing_outside_the_watched_namespaces() -> None:
    granted = effective_permissions(render(VALUE_SETS["namespaced"]), FULLNAME, NAMESPACE)
    assert permits(granted, "team-a", "apps", "deployments", "create")
    assert not permits(granted, "kube-system", "apps", "deployments", "create")
    assert not permits(granted, None, "", "namespaces", "list")  # only a cluster-wide operator lists them
    assert permits(granted, None, "apiextensions.k8s.io", "customresourcedefinitions", "watch")
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        assert not permits(granted, "team-a", "", "secrets", verb)  # secrets reach pods by secretKeyRef only
    assert not permits(granted, "team-a", "polymorph.dev", "modeldeployments", "update")  # never writes spec
    assert not permits(granted, "team-a", "polymorph.dev", "modeldeployments", "delete")


@pytest.mark.parametrize(("case", "values"), list(VALUE_SETS.items()), ids=list(VALUE_SETS))
def test_no_wildcard_and_nothing_but_resource_rules(case: str, values: dict[str, Any]) -> None:
    docs = render(values)
    roles = of_kind(docs, "ClusterRole") + of_kind(docs, "Role")
    assert roles
    for role in roles:
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no nonResourceURLs, resourceNames
            for field in ("apiGroups", "resources", "verbs"):
                assert rule[field] and all("*" not in item for item in rule[field]), rule


def test_bindings_name_only_the_operator_service_account() -> None:
    docs = render(VALUE_SETS["peering-namespaced"])
    bindings = of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding")
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    existing = {"serviceAccount": {"create": False, "name": "platform-operator"}}
    docs = render(existing)
    assert of_kind(docs, "ServiceAccount") == []
    assert effective_permissions(docs, "platform-operator", NAMESPACE) == expected([], False)


def test_rbac_rules_are_written_in_one_place() -> None:
    """Every verb list lives in the one table in _helpers.tpl; the role templates only include it."""
    holders = sorted(p.name for p in (CHART / "templates").iterdir() if "verbs:" in p.read_text())
    assert holders == ["_helpers.tpl"]
