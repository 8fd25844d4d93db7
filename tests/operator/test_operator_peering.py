"""Two operator replicas with kopf peering (no ``--standalone``), watching every namespace: exactly
one acts, and when it stops the standby takes over.

kopf pauses a replica that sees a live peer of higher *or equal* priority, so replicas that shared
one priority would all pause and nothing would run; each process takes its own (random) priority.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from operator_harness import GROUP, NS, Api, OperatorProcess, operator_access, trace_agents, wait_for

from support.k8s_emulator import EmulatorThread

PEERINGS = "/apis/kopf.dev/v1/clusterkopfpeerings"
RECONCILES = "polymorph_operator_reconciles_total"
DEPLOYMENT = {
    "apiVersion": "polymorph.dev/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "chat", "namespace": NS},
    "spec": {"model": {"uri": "tiny"}, "hardware": {"accelerator": "cpu"}, "replicas": 2,
             "recompile": {"enabled": False}},
}  # fmt: skip


def peering_crd() -> dict[str, Any]:
    """kopf's cluster-wide peering CRD, as the chart installs it for replicas > 1."""
    version = {"name": "v1", "served": True, "storage": True,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}  # fmt: skip
    names = {"kind": "ClusterKopfPeering", "plural": "clusterkopfpeerings", "singular": "clusterkopfpeering"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusterkopfpeerings.kopf.dev"},
        "spec": {"scope": "Cluster", "group": "kopf.dev", "names": names, "versions": [version]},
    }


def peers(api: Api) -> dict[str, dict[str, Any]]:
    return dict((api.get(f"{PEERINGS}/polymorph") or {}).get("status") or {})


def stable_replicas(api: Api) -> int | None:
    d = api.deployment("chat")
    return None if d is None else int(d["spec"]["replicas"])


def peering_scenario(
    cluster: tuple[EmulatorThread, Api, Path], operator: Callable[..., OperatorProcess]
) -> set[tuple[str, str, str]]:
    """Two peered replicas serve a deployment, the active one stops, the standby takes over.
    Returns the replicas' API calls as ``(verb, group, resource)``."""
    running, api, _ = cluster
    api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", peering_crd())
    api.create(PEERINGS, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "polymorph"}})  # fmt: skip
    agents = running.call(trace_agents)
    replicas = {
        pod: operator(namespace=None, standalone=False, pod_id=pod) for pod in ("replica-a", "replica-b")
    }
    seen = wait_for("both replicas in the peering", lambda: len(peers(api)) == 2 and peers(api))
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
    wait_for("the active replica gone from the peering", lambda: set(peers(api)) == {standby})
    api.patch(f"{GROUP}/namespaces/{NS}/modeldeployments/chat", {"spec": {"replicas": 3}})
    wait_for("the standby acting on a change", lambda: stable_replicas(api) == 3, timeout=30)
    assert (replicas[standby].metric(RECONCILES) or 0) > 0
    return operator_access(agents)


def test_two_replicas_one_acts_and_the_standby_takes_over(
    cluster: tuple[EmulatorThread, Api, Path], operator: Callable[..., OperatorProcess]
) -> None:
    peering_scenario(cluster, operator)
