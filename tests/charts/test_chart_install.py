"""The real helm v4 installs, upgrades and uninstalls the chart on the real control plane
(``support.control_plane``, a fresh one per test, so cluster-scoped objects and CRDs are each
test's own): the CRDs, the kopf peering CRD among the templates, the peering objects as
post-install hooks that helm runs while they do not exist (``lookup`` is guarded, as it fails on
a kind the server does not serve yet), and an upgrade that leaves a live peering alone.

The chart's pods have no node here (a scheduler binds them once a node agent registers one): this
shows how helm applies the chart; tests/control_plane runs the operator under its RBAC and peering.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chart_render import CHART, FULLNAME, NAMESPACE, RELEASE, values_file

from support import yamls
from support.control_plane import ControlPlane
from support.k8s_binaries import helm

Helm = Callable[..., str]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ControlPlane]:
    """A fresh real control plane, for this test alone."""
    with ControlPlane(tmp_path / "control-plane") as running:
        yield running


@pytest.fixture
def api(cluster: ControlPlane) -> Iterator[httpx.Client]:
    with cluster.api(timeout=10) as client:
        for name in (NAMESPACE, "team-a", "team-b"):
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            assert client.post("/api/v1/namespaces", json=namespace).status_code == 201
        yield client


@pytest.fixture
def run_helm(cluster: ControlPlane, tmp_path: Path) -> Helm:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(cluster.kubeconfig)}

    def run(*args: str, values: dict[str, Any] | None = None) -> str:
        extra = ["-f", str(values_file(values, tmp_path))] if values is not None else []
        done = subprocess.run(
            [str(helm()), *args, "--namespace", NAMESPACE, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run


def _items(api: httpx.Client, path: str) -> list[dict[str, Any]]:
    response = api.get(path)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def _crd_names(api: httpx.Client) -> set[str]:
    return {
        c["metadata"]["name"] for c in _items(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    }


def _hook_kinds(run_helm: Helm) -> list[str]:
    hooks = [d for d in yamls.load_all(run_helm("get", "hooks", RELEASE)) if d]
    return sorted(h["kind"] for h in hooks)


def test_install_cluster_wide_with_peering_then_upgrade_and_uninstall(
    api: httpx.Client, run_helm: Helm
) -> None:
    run_helm("install", RELEASE, str(CHART), values={"replicas": 2})
    assert {
        "modeldeployments.polymorph.dev",
        "compilejobs.polymorph.dev",
        "clusterkopfpeerings.kopf.dev",
    } <= _crd_names(api)
    (deployment,) = _items(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")
    assert deployment["spec"]["replicas"] == 2
    assert _hook_kinds(run_helm) == ["ClusterKopfPeering"]  # it did not exist yet: the hook created it
    path = "/apis/kopf.dev/v1/clusterkopfpeerings/polymorph"
    created = api.get(path)
    assert created.status_code == 200, created.text
    assert created.json()["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"

    # The peers kopf keeps in the peering's status.
    peers = {"status": {"pm-polymorph-abc": {"priority": 7, "lifetime": 60}}}
    patched = api.patch(path, json=peers, headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status_code == 200, patched.text

    run_helm("upgrade", RELEASE, str(CHART), values={"replicas": 2, "settings": {"logLevel": "debug"}})
    assert _hook_kinds(run_helm) == []  # the live peering is found, so no hook would recreate it
    assert api.get(path).json()["status"] == peers["status"]
    (config,) = [
        c
        for c in _items(api, f"/api/v1/namespaces/{NAMESPACE}/configmaps")
        if c["metadata"]["name"] == FULLNAME
    ]
    assert config["data"]["POLYMORPH_LOG_LEVEL"] == "debug"

    run_helm("uninstall", RELEASE)
    assert _items(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments") == []
    assert "clusterkopfpeerings.kopf.dev" in _crd_names(api)  # kept: other kopf operators may use it


def test_install_namespaced_creates_roles_and_peering_hooks_in_each_namespace(
    api: httpx.Client, run_helm: Helm
) -> None:
    run_helm("install", RELEASE, str(CHART), values={"replicas": 2, "watchNamespaces": ["team-a", "team-b"]})
    assert "kopfpeerings.kopf.dev" in _crd_names(api)
    for namespace in ("team-a", "team-b"):
        roles = _items(api, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles")
        assert [r["metadata"]["name"] for r in roles] == [FULLNAME]
    # Nothing cluster-scoped: with a list of namespaces kopf scans nothing (tests/charts/test_chart_rbac).
    clusterroles = _items(api, "/apis/rbac.authorization.k8s.io/v1/clusterroles")
    assert [r for r in clusterroles if r["metadata"]["name"] == FULLNAME] == []
    hooks = [d for d in yamls.load_all(run_helm("get", "hooks", RELEASE)) if d]
    assert sorted((h["kind"], h["metadata"]["namespace"]) for h in hooks) == [
        ("KopfPeering", "team-a"),
        ("KopfPeering", "team-b"),
    ]
    for namespace in ("team-a", "team-b"):  # helm ran the hooks: the peerings exist
        made = api.get(f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/polymorph")
        assert made.status_code == 200, made.text


def test_install_standalone_ships_no_peering(api: httpx.Client, run_helm: Helm) -> None:
    run_helm("install", RELEASE, str(CHART), values={})
    assert not {n for n in _crd_names(api) if n.endswith("kopf.dev")}
    (deployment,) = _items(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")
    assert "--standalone" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
