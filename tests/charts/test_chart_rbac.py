"""The chart's RBAC: exactly the rows of its one table (``_helpers.tpl``), in the scope each row
names, and nothing broader (no wildcard, no extra verb, resource or namespace).

Whether the table is exactly what the operator uses is checked against the operator's recorded
API calls: tests/operator/test_operator_loop, and on the real control plane
tests/control_plane (test_operator_peering, test_operator_rbac) and the e2e; these tests check
that the templates put each row where it belongs. ``chart_rbac`` resolves the rendered
bindings as the API server's authorizer would.
"""

from __future__ import annotations

from typing import Any

import pytest
from chart_rbac import CLUSTER, Permission, Row, effective_permissions, permits, rbac_table
from chart_render import CHART, FULLNAME, NAMESPACE, VALUE_SETS, of_kind, render

TABLE = rbac_table()


def _grant(scope: str, rows: list[Row], cluster_names: bool = False) -> set[Permission]:
    return {
        Permission(scope, group, resource, verb)
        for row in rows
        for group in row.api_groups
        for resource in (row.cluster_resources if cluster_names else row.resources)
        for verb in row.verbs
    }


def expected(namespaces: list[str], peering: bool) -> set[Permission]:
    """What the table says a mode grants: watched rows per namespace (or cluster-wide), cluster-wide
    only rows when watching all, and the peering row (namespaced or cluster) with replicas > 1."""
    watched = [r for r in TABLE if r.where == "watched"]
    peers = [r for r in TABLE if r.where == "peering"] if peering else []
    if not namespaces:
        cluster_wide = [r for r in TABLE if r.where == "clusterWide"]
        return _grant(CLUSTER, watched + cluster_wide) | _grant(CLUSTER, peers, cluster_names=True)
    out: set[Permission] = set()
    for ns in namespaces:
        out |= _grant(ns, watched + peers)
    return out


def test_the_table_is_well_formed() -> None:
    assert {r.where for r in TABLE} == {"watched", "clusterWide", "peering"}
    uses = [u for row in TABLE for u in row.uses()]
    assert len(uses) == len(set(uses)), "a permission is granted by two rows"
    assert all(row.cluster_resources for row in TABLE if row.where == "peering")


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
def test_each_mode_grants_the_table_rows_meant_for_it(
    values: dict[str, Any], namespaces: list[str], peering: bool
) -> None:
    granted = effective_permissions(render(values), FULLNAME, NAMESPACE)
    assert granted == expected(namespaces, peering)


def test_namespaced_install_grants_nothing_outside_the_watched_namespaces() -> None:
    granted = effective_permissions(render(VALUE_SETS["namespaced"]), FULLNAME, NAMESPACE)
    assert permits(granted, "team-a", "apps", "deployments", "create")
    assert not permits(granted, "kube-system", "apps", "deployments", "create")
    assert {p.scope for p in granted} == {"team-a", "team-b"}  # nothing cluster-scoped: kopf scans nothing
    assert not permits(granted, None, "apiextensions.k8s.io", "customresourcedefinitions", "watch")
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        assert not permits(granted, "team-a", "", "secrets", verb)  # secrets reach pods by secretKeyRef only
        # The operator lists a sandbox Job's pods (why they wait: Unschedulable, ImagePullBackOff),
        # in the watched namespaces only, and changes no pod.
        assert permits(granted, "team-a", "", "pods", verb) == (verb == "list")
        assert not permits(granted, "kube-system", "", "pods", verb)
    assert not permits(granted, "team-a", "polymorph.dev", "modeldeployments", "update")  # never writes spec
    assert not permits(granted, "team-a", "polymorph.dev", "modeldeployments", "delete")
    assert not permits(granted, "team-a", "", "services", "delete")  # owner references remove children
    assert not permits(granted, "team-a", "events.k8s.io", "events", "create")  # it posts core/v1 Events


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
    assert len(bindings) == 2 and of_kind(docs, "ClusterRole") == []  # a RoleBinding per watched namespace
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
