"""The operator process against the real control plane: apply -> hardened children, `kubectl get
md` columns, delete -> cleanup by the real garbage collector, and Degraded for a spec the
operator's model refuses: one stored under an older CRD without the rule that refuses it now (the
API server never checks a stored object again, so an upgrade of the CRDs leaves it as it was; the
CRD is put back afterwards, as the other tests share the control plane)."""

from __future__ import annotations

import copy
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from operator_harness import GROUP, Api, OperatorProcess, wait_for

from support.control_plane import ControlPlane
from support.k8s_binaries import kubectl


def md(ns: str, name: str = "chat", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"uri": "pvc://weights/llama/1b"},
        "hardware": {"accelerator": "nvidia-h200"},
        "replicas": 4,
    }
    body.update(spec)
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }


def test_apply_creates_hardened_children_and_status(
    real_cluster: tuple[ControlPlane, Api, Path], real_operator: Callable[..., OperatorProcess], ns: str
) -> None:
    _, api, _ = real_cluster
    op = real_operator()
    api.create(f"{GROUP}/namespaces/{ns}/modeldeployments", md(ns))
    stable = wait_for("the stable Deployment", lambda: api.deployment("chat"))
    assert api.deployment("chat-canary") is None
    labels = stable["spec"]["template"]["metadata"]["labels"]
    assert labels["polymorph.dev/model-deployment"] == "chat" and labels["polymorph.dev/track"] == "stable"
    assert labels["polymorph.dev/build"] == "reference"
    owner = stable["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ModelDeployment" and owner["controller"] is True
    pod = stable["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert engine["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert (
        pod["automountServiceAccountToken"] is False and engine["securityContext"]["readOnlyRootFilesystem"]
    )
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod[
        "volumes"
    ]
    assert stable["spec"]["replicas"] == 4
    svc = wait_for("the Service", lambda: api.get(f"/api/v1/namespaces/{ns}/services/chat"))
    assert svc["spec"]["selector"] == {"polymorph.dev/model-deployment": "chat"}
    status = wait_for(
        "status",
        lambda: (
            (api.md("chat") or {}).get("status", {}).get("observedGeneration") and api.md("chat")["status"]
        ),
    )
    assert status["activeBuild"]["id"] == "reference"
    types = {c["type"]: c for c in status["conditions"]}
    assert set(types) == {"Ready", "Reconciling", "Stalled", "Compiling", "RollingOut", "Degraded"}
    assert all(c["reason"] and c["message"] for c in types.values())
    assert all(c["observedGeneration"] == status["observedGeneration"] for c in types.values())
    # kopf keeps its state in status, never in annotations (GitOps tools would see drift there).
    assert not any(k.startswith("kopf") for k in (api.md("chat") or {})["metadata"].get("annotations", {}))
    assert "kopf" in status
    assert op.healthy()


CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/modeldeployments.polymorph.dev"
STEPS_RULE = "step weights must be strictly increasing"


def _without_rule(crd: dict[str, Any], message: str) -> dict[str, Any]:
    """``crd`` without the CEL rule whose message starts with ``message``: the CRD as it was before it."""
    older = copy.deepcopy(crd)
    dropped = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            rules = node.get("x-kubernetes-validations")
            if rules:
                dropped.extend(r for r in rules if r["message"].startswith(message))
                node["x-kubernetes-validations"] = [r for r in rules if not r["message"].startswith(message)]
                if not node["x-kubernetes-validations"]:
                    del node["x-kubernetes-validations"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(older["spec"])
    assert len(dropped) == 1, dropped
    return older


def _replace_crd(api: Api, crd: dict[str, Any]) -> None:
    current = api.get(CRD)
    assert current is not None
    body = {**crd, "metadata": {**crd["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    r = api.client.put(CRD, json=body)
    assert r.status_code == 200, r.text


def test_invalid_spec_sets_degraded_once_without_crash_loop(
    real_cluster: tuple[ControlPlane, Api, Path], real_operator: Callable[..., OperatorProcess], ns: str
) -> None:
    _, api, _ = real_cluster
    # Decreasing weights: the CRD's CEL rule refuses them, and so does the operator's pydantic model.
    bad = md(ns, rollout={"steps": [{"weight": 50}, {"weight": 25}]})
    path = f"{GROUP}/namespaces/{ns}/modeldeployments"
    refused = api.client.post(path, json=bad)
    assert refused.status_code == 422 and STEPS_RULE in refused.text, refused.text
    # Stored under the CRD as it was before that rule (the API server takes a CRD change within a
    # moment), then the CRD upgraded as docs/install.md says: the object stays as it was stored.
    crd = api.get(CRD)
    assert crd is not None
    current = {k: crd[k] for k in ("apiVersion", "kind", "spec")} | {
        "metadata": {"name": crd["metadata"]["name"]}
    }
    _replace_crd(api, _without_rule(current, STEPS_RULE))
    try:
        wait_for(
            "the older CRD served", lambda: api.client.post(path, json=bad).status_code == 201, timeout=30
        )
    finally:  # the CRD is the control plane's, which the other tests share: back as it was, whatever happened
        _replace_crd(api, current)
    probe = md(ns, "probe", rollout={"steps": [{"weight": 50}, {"weight": 25}]})
    wait_for("the rule back", lambda: api.client.post(f"{path}?dryRun=All", json=probe).status_code == 422,
             timeout=30)  # fmt: skip
    assert [step["weight"] for step in (api.md("chat") or {})["spec"]["rollout"]["steps"]] == [50, 25]

    op = real_operator()
    degraded = wait_for(
        "Degraded",
        lambda: next((c for c in (api.md("chat") or {}).get("status", {}).get("conditions", []) if c["type"] == "Degraded"), None),
    )  # fmt: skip
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert (
        degraded["message"].startswith("spec.rollout.steps") and "strictly increasing" in degraded["message"]
    )
    time.sleep(3)  # six rollout ticks
    assert len(api.events("InvalidSpec")) == 1
    assert api.deployment("chat") is None
    assert op.healthy()
    # Fixing the spec clears it.
    api.patch(
        f"{GROUP}/namespaces/{ns}/modeldeployments/chat",
        {"spec": {"rollout": {"steps": [{"weight": 25}, {"weight": 50}]}}},
    )
    wait_for("the stable Deployment after the fix", lambda: api.deployment("chat"))
    wait_for(
        "Degraded cleared",
        lambda: any(
            c["type"] == "Degraded" and c["status"] == "False" for c in api.md("chat")["status"]["conditions"]
        ),  # type: ignore[index]
    )


def test_kubectl_get_md_shows_build_phase_drift_and_tok_s(
    real_cluster: tuple[ControlPlane, Api, Path], real_operator: Callable[..., OperatorProcess], ns: str
) -> None:
    _, api, kubeconfig = real_cluster
    real_operator()
    api.create(f"{GROUP}/namespaces/{ns}/modeldeployments", md(ns))
    wait_for("status", lambda: (api.md("chat") or {}).get("status", {}).get("activeBuild"))
    build = "sha256:" + "ab" * 32
    figures = {"outputTokensPerSecond": 1234.5, "totalTokensPerSecond": 2000, "ttftP50Ms": 10, "ttftP95Ms": 20,
               "itlP50Ms": 5, "itlP95Ms": 8, "noise": 0.01}  # fmt: skip
    api.patch(
        f"{GROUP}/namespaces/{ns}/modeldeployments/chat/status",
        {
            "status": {
                "activeBuild": {"id": build, "name": "static-cache", "figures": figures},
                "drift": {"score": 0.42},
            }
        },
    )
    wait_for("Ready", lambda: api.md("chat")["status"].get("phase") in ("Serving", "Pending"))  # type: ignore[index]
    # The operator derives the display fields (a promoted build has no name; tok/s is rounded).
    wait_for("display fields", lambda: api.md("chat")["status"]["activeBuild"].get("tokensPerSecond"))  # type: ignore[index]
    out = subprocess.run(
        [str(kubectl()), "--kubeconfig", str(kubeconfig), "-n", ns, "get", "md"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    header, row = out.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "BUILD", "PHASE", "DRIFT", "BENCH-TOK/S", "AGE"]
    cells = row.split()
    assert (
        cells[0] == "chat" and cells[1] == "sha256:abababababab" and cells[3] == "0.42" and cells[4] == "1235"
    )
    assert cells[2] in ("Pending", "Serving")


def test_delete_cleans_up_children(
    real_cluster: tuple[ControlPlane, Api, Path], real_operator: Callable[..., OperatorProcess], ns: str
) -> None:
    _, api, _ = real_cluster
    real_operator()
    api.create(f"{GROUP}/namespaces/{ns}/modeldeployments", md(ns))
    wait_for("the stable Deployment", lambda: api.deployment("chat"))
    wait_for("the Service", lambda: api.get(f"/api/v1/namespaces/{ns}/services/chat"))
    job = {"apiVersion": "polymorph.dev/v1alpha1", "kind": "CompileJob", "metadata": {"name": "chat-manual", "namespace": ns},
           "spec": {"deploymentRef": {"name": "chat"}, "workload": {"profile": {
               "inputTokens": {"bounds": [128], "counts": [1]}, "outputTokens": {"bounds": [64], "counts": [1]}}}}}  # fmt: skip
    api.create(f"{GROUP}/namespaces/{ns}/compilejobs", job)
    wait_for("the sandbox Job", lambda: api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/chat-manual"))
    assert api.get(f"/api/v1/namespaces/{ns}/configmaps/chat-manual-spec") is not None
    # A Job lost while the campaign runs is made again.
    uid = api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/chat-manual")["metadata"]["uid"]  # type: ignore[index]
    api.delete(f"/apis/batch/v1/namespaces/{ns}/jobs/chat-manual")
    wait_for(
        "the Job made again",
        lambda: (
            (j := api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/chat-manual")) and j["metadata"]["uid"] != uid
        ),
    )
    # Deleting the CompileJob removes its Job and ConfigMap ...
    api.delete(f"{GROUP}/namespaces/{ns}/compilejobs/chat-manual")
    wait_for("the Job gone", lambda: api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/chat-manual") is None)
    wait_for(
        "the ConfigMap gone", lambda: api.get(f"/api/v1/namespaces/{ns}/configmaps/chat-manual-spec") is None
    )
    # ... and deleting the ModelDeployment removes its Deployments and Service.
    api.delete(f"{GROUP}/namespaces/{ns}/modeldeployments/chat")
    wait_for("the Deployment gone", lambda: api.deployment("chat") is None)
    wait_for("the Service gone", lambda: api.get(f"/api/v1/namespaces/{ns}/services/chat") is None)
