"""Two operator replicas with kopf peering (no ``--standalone``), watching every namespace: exactly
one acts, and when it stops the standby takes over.

kopf pauses a replica that sees a live peer of higher *or equal* priority, so replicas that shared
one priority would all pause and nothing would run; each process takes its own (random) priority.

Both install modes run: cluster-wide (a ClusterKopfPeering) and one watched namespace (a
KopfPeering there). Their recorded API calls must all be granted by the chart rendered for that
mode, and each permission the chart grants beyond the watched-namespace rows (CRD scanning, the
peering object) must be one they used; test_operator_loop measures the watched rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from operator_harness import (
    GROUP,
    NS,
    Api,
    OperatorProcess,
    audit_against_chart,
    operator_access,
    trace_agents,
    wait_for,
)

from charts.chart_rbac import rbac_table
from support.k8s_emulator import EmulatorThread

MODES = {  # mode -> (the operator's --namespace, the peering objects' path, the chart values)
    "cluster-wide": (None, "/apis/kopf.dev/v1/clusterkopfpeerings", {"replicas": 2}),
    "namespaced": (NS, f"/apis/kopf.dev/v1/namespaces/{NS}/kopfpeerings", {"replicas": 2, "watchNamespaces": [NS]}),
}  # fmt: skip
RECONCILES = "polymorph_operator_reconciles_total"
DEPLOYMENT = {
    "apiVersion": "polymorph.dev/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "chat", "namespace": NS},
    "spec": {"model": {"uri": "tiny"}, "hardware": {"accelerator": "cpu"}, "replicas": 2,
             "recompile": {"enabled": False}},
}  # fmt: skip


def peering_crd(cluster_wide: bool) -> dict[str, Any]:
    """kopf's peering CRD, as the chart installs it for replicas > 1."""
    version = {"name": "v1", "served": True, "storage": True,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}  # fmt: skip
    kind = "ClusterKopfPeering" if cluster_wide else "KopfPeering"
    names = {"kind": kind, "plural": f"{kind.lower()}s", "singular": kind.lower()}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.lower()}s.kopf.dev"},
        "spec": {"scope": "Cluster" if cluster_wide else "Namespaced", "group": "kopf.dev", "names": names,
                 "versions": [version]},
    }  # fmt: skip


def peers(api: Api, path: str) -> dict[str, dict[str, Any]]:
    return dict((api.get(f"{path}/polymorph") or {}).get("status") or {})


def stable_replicas(api: Api) -> int | None:
    d = api.deployment("chat")
    return None if d is None else int(d["spec"]["replicas"])


@pytest.mark.parametrize("mode", list(MODES))
def test_two_replicas_one_acts_and_the_standby_takes_over(
    cluster: tuple[EmulatorThread, Api, Path], operator: Callable[..., OperatorProcess], mode: str
) -> None:
    namespace, path, values = MODES[mode]
    running, api, _ = cluster
    crd = peering_crd(cluster_wide=namespace is None)
    api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    api.create(path, {"apiVersion": "kopf.dev/v1", "kind": crd["spec"]["names"]["kind"], "metadata": {"name": "polymorph"}})  # fmt: skip
    agents = running.call(trace_agents)
    replicas = {
        pod: operator(namespace=namespace, standalone=False, pod_id=pod) for pod in ("replica-a", "replica-b")
    }
    seen = wait_for("both replicas in the peering", lambda: len(peers(api, path)) == 2 and peers(api, path))
    priorities = {pod: int(info["priority"]) for pod, info in seen.items()}
    assert set(priorities) == set(replicas) and len(set(priorities.values())) == 2, priorities
    active = max(priorities, key=priorities.__getitem__)
    standby = next(pod for pod in replicas if pod != active)

    api.create(f"{GROUP}/namespaces/{NS}/modeldeployments", DEPLOYMENT)
    wait_for("the stable Deployment (some replica acts)", lambda: stable_replicas(api) == 2, timeout=30)
    assert (replicas[active].metric(RECONCILES) or 0) > 0
    assert replicas[standby].metric(RECONCILES) is None  # the standby decided nothing

    # The active replica stops (a clean exit takes it out of the peering): the standby resumes.
    replicas[active].stop()
    wait_for("the active replica gone from the peering", lambda: set(peers(api, path)) == {standby})
    api.patch(f"{GROUP}/namespaces/{NS}/modeldeployments/chat", {"spec": {"replicas": 3}})
    wait_for("the standby acting on a change", lambda: stable_replicas(api) == 3, timeout=30)
    assert (replicas[standby].metric(RECONCILES) or 0) > 0

    # RBAC exactly as used: the chart for this mode grants every call; what it grants beyond the
    # watched-namespace rows (measured by test_operator_loop) this scenario used.
    unused = audit_against_chart(operator_access(agents), values)
    watched = {use for row in rbac_table() if row.where == "watched" for use in row.uses()}
    assert unused <= watched, sorted(unused - watched)
