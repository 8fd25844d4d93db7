"""The operator process against the emulator: apply -> hardened children, Degraded for a bad spec,
`kubectl get md` columns, delete -> cleanup."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import GROUP, NS, Api, OperatorProcess, wait_for

from support.k8s_emulator import EmulatorThread


def md(name: str = "chat", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"uri": "pvc://weights/llama/1b"},
        "hardware": {"accelerator": "nvidia-h200"},
        "replicas": 4,
    }
    body.update(spec)
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


def test_apply_creates_hardened_children_and_status(
    cluster: tuple[EmulatorThread, Api, Path], operator: Callable[..., OperatorProcess]
) -> None:
    _, api, _ = cluster
    op = operator()
    api.create(f"{GROUP}/namespaces/{NS}/modeldeployments", md())
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
    svc = wait_for("the Service", lambda: api.get(f"/api/v1/namespaces/{NS}/services/chat"))
    assert svc["spec"]["selector"] == {"polymorph.dev/model-deployment": "chat"}
    status = wait_for(
        "status",
        lambda: (
            (api.md("chat") or {}).get("status", {}).get("observedGeneration") and api.md("chat")["status"]
        ),
    )
    assert status["activeBuild"]["id"] == "reference"
    types = {c["type"]: c for c in status["conditions"]}
    assert set(types) == {"Ready", "Compiling", "RollingOut", "Degraded"}
    assert all(c["reason"] and c["message"] for c in types.values())
    # kopf keeps its state in status, never in annotations (GitOps tools would see drift there).
    assert not any(k.startswith("kopf") for k in (api.md("chat") or {})["metadata"].get("annotations", {}))
    assert "kopf" in status
    _ = op
