"""Rendered children: hardware profiles, labels, owner references, weights, serving command, hardened sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from polymorph.contract.api import CompileJob, ModelDeployment, parse_duration
from polymorph.core.hardware import placement
from polymorph.core.resources import (
    ClusterSettings,
    build_label,
    sandbox_configmap,
    sandbox_job,
    serving_deployment,
    serving_service,
    tensor_parallel,
)

EXAMPLES = Path(__file__).parents[2] / "crds" / "examples"
SETTINGS = ClusterSettings(store="s3://polymorph/store", store_secret="polymorph-store")
BUILD = "sha256:" + "0123456789abcdef" * 4


def md(**spec: Any) -> ModelDeployment:
    doc = yaml.safe_load((EXAMPLES / "modeldeployment-full.yaml").read_text())
    doc["metadata"]["uid"] = "uid-md"
    doc["spec"].update(spec)
    return ModelDeployment.model_validate(doc)


def cj(**spec: Any) -> CompileJob:
    doc = yaml.safe_load((EXAMPLES / "compilejob-standalone.yaml").read_text())
    doc["metadata"]["uid"] = "uid-cj"
    doc["spec"].update(spec)
    return CompileJob.model_validate(doc)


@pytest.mark.parametrize(
    ("accelerator", "resource", "selector_key", "toleration"),
    [
        ("cpu", None, None, None),
        ("nvidia-h200", "nvidia.com/gpu", "nvidia.com/gpu.product", "nvidia.com/gpu"),
        ("amd-mi355x", "amd.com/gpu", "amd.com/gpu.product-name", "amd.com/gpu"),
        (
            "aws-trainium2",
            "aws.amazon.com/neuron",
            "node.kubernetes.io/instance-type",
            "aws.amazon.com/neuron",
        ),
    ],
)
def test_hardware_profiles(
    accelerator: str, resource: str | None, selector_key: str | None, toleration: str | None
) -> None:
    hw = md(hardware={"accelerator": accelerator, "count": 2, "nodeSelector": {"pool": "a"},
                      "tolerations": [{"key": "dedicated", "operator": "Exists"}]}).spec.hardware  # fmt: skip
    p = placement(hw)
    assert p.node_selector["pool"] == "a"
    if resource is None:
        assert p.resources == {} and set(p.node_selector) == {"pool"} and p.device == "cpu"
    else:
        assert p.resources["limits"] == {resource: "2"}
        assert selector_key in p.node_selector
        assert {"key": toleration, "operator": "Exists", "effect": "NoSchedule"} in p.tolerations
    assert {"key": "dedicated", "operator": "Exists"} in p.tolerations


def test_spec_node_selector_overrides_the_profile() -> None:
    hw = md(
        hardware={"accelerator": "nvidia-h200", "nodeSelector": {"nvidia.com/gpu.product": "X"}}
    ).spec.hardware
    assert placement(hw).node_selector == {"nvidia.com/gpu.product": "X"}


def test_build_label_is_label_safe() -> None:
    assert build_label("reference") == "reference"
    label = build_label(BUILD)
    assert label == "sha256-" + BUILD[7:63] and len(label) == 63


def test_stable_deployment() -> None:
    d = serving_deployment(md(), "stable", BUILD, 3, SETTINGS)
    assert d["metadata"]["name"] == "llama-8b-chat"
    assert d["metadata"]["ownerReferences"][0] == {
        "apiVersion": "polymorph.dev/v1alpha1", "kind": "ModelDeployment", "name": "llama-8b-chat",
        "uid": "uid-md", "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels["polymorph.dev/model-deployment"] == "llama-8b-chat"
    assert labels["polymorph.dev/track"] == "stable"
    assert labels["polymorph.dev/build"] == build_label(BUILD)
    assert d["spec"]["selector"]["matchLabels"] == {
        "polymorph.dev/model-deployment": "llama-8b-chat",
        "polymorph.dev/track": "stable",
    }
    assert d["spec"]["replicas"] == 3
    pod = d["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    cmd = engine["command"]
    assert cmd[:3] == ["polymorph", "engine", "serve"]
    for flag, value in (("--build", BUILD), ("--store", "s3://polymorph/store"), ("--track", "stable"),
                        ("--model-deployment", "llama-8b-chat"), ("--namespace", "inference"), ("--device", "cuda")):  # fmt: skip
        assert cmd[cmd.index(flag) + 1] == value
    assert engine["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert engine["ports"][0]["containerPort"] == 8000
    assert d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    assert engine["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod["automountServiceAccountToken"] is False
    # s3:// weights: an init container fetches them into an emptyDir, mounted read-only in the engine.
    fetch = pod["initContainers"][0]
    assert (
        fetch["command"][:3] == ["aws", "s3", "sync"]
        and "s3://models/llama-3.1-8b-instruct/" in fetch["command"]
    )
    assert cmd[cmd.index("--model") + 1] == "/models"
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in engine["volumeMounts"]
    secret_env = [e for e in engine["env"] if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]]
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in secret_env} == {"polymorph-store"}


def test_canary_deployment_and_pvc_weights() -> None:
    d = serving_deployment(md(model={"uri": "pvc://weights/llama/8b"}), "canary", BUILD, 1, SETTINGS)
    assert d["metadata"]["name"] == "llama-8b-chat-canary"
    pod = d["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod[
        "volumes"
    ]
    cmd = pod["containers"][0]["command"]
    assert cmd[cmd.index("--model") + 1] == "/models/llama/8b"
    assert cmd[cmd.index("--track") + 1] == "canary"
    assert "initContainers" not in pod


def test_plain_path_weights_pass_through() -> None:
    d = serving_deployment(
        md(model={"uri": "tiny"}, hardware={"accelerator": "cpu"}), "stable", "reference", 1, SETTINGS
    )
    pod = d["spec"]["template"]["spec"]
    cmd = pod["containers"][0]["command"]
    assert cmd[cmd.index("--model") + 1] == "tiny" and cmd[cmd.index("--device") + 1] == "cpu"
    assert "nodeSelector" not in pod and "resources" not in pod["containers"][0]


def test_service_selects_both_tracks() -> None:
    svc = serving_service(md())
    assert svc["spec"]["selector"] == {"polymorph.dev/model-deployment": "llama-8b-chat"}


def test_sandbox_job_is_hardened() -> None:
    job_cj = cj(agent={"kind": "Claude", "apiKeySecretRef": {"name": "anthropic", "key": "api-key"}})
    job = sandbox_job(job_cj, SETTINGS)
    spec = job["spec"]
    n = job_cj.spec.budget.sandboxes
    assert spec["completionMode"] == "Indexed" and spec["completions"] == n and spec["parallelism"] == n
    assert spec["activeDeadlineSeconds"] == parse_duration(job_cj.spec.budget.deadline)
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CompileJob"
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    engine = next(c for c in pod["initContainers"] if c["name"] == "engine")
    assert engine["restartPolicy"] == "Always"  # a native sidecar: the pod completes with the agent
    assert engine["command"][:3] == ["polymorph", "sandbox", "engine"]
    sc = engine["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "engine-tmp", "mountPath": "/tmp"} in engine["volumeMounts"]
    # No secret reaches the engine, in env or in volumes.
    assert all("valueFrom" not in e for e in engine["env"])
    assert not any("secret" in v for v in pod["volumes"])
    agent = pod["containers"][0]
    assert agent["command"][:3] == ["polymorph", "sandbox", "agent"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in agent["env"] if "valueFrom" in e}
    assert refs["ANTHROPIC_API_KEY"] == {"name": "anthropic", "key": "api-key"}
    assert refs["AWS_ACCESS_KEY_ID"]["name"] == "polymorph-store"
    assert {"name": "spec", "configMap": {"name": f"{job_cj.metadata.name}-spec"}} in pod["volumes"]


def test_the_sandbox_engine_benchmarks_at_the_serving_batch_when_the_job_has_a_deployment() -> None:
    def engine_command(job: dict[str, Any]) -> list[str]:
        pod = job["spec"]["template"]["spec"]
        return list(next(c for c in pod["initContainers"] if c["name"] == "engine")["command"])

    assert engine_command(sandbox_job(cj(), SETTINGS, max_batch=2))[-2:] == ["--max-batch", "2"]
    assert "--max-batch" not in engine_command(sandbox_job(cj(), SETTINGS))  # no deployment: its workload


def test_sandbox_configmap_holds_the_resolved_job() -> None:
    c = cj()
    cm = sandbox_configmap(c)
    assert cm["metadata"]["name"] == f"{c.metadata.name}-spec"
    doc = yaml.safe_load(cm["data"]["compilejob.json"])
    assert CompileJob.model_validate(doc).spec == c.spec
    assert doc["metadata"]["uid"] == "uid-cj"


def test_unresolved_job_is_refused() -> None:
    doc = yaml.safe_load((EXAMPLES / "compilejob-deploymentref.yaml").read_text())
    doc["metadata"]["uid"] = "u"
    with pytest.raises(ValueError, match="resolved CompileJob"):
        sandbox_job(CompileJob.model_validate(doc), SETTINGS)


def test_n_accelerators_of_a_pod_serve_and_compile_as_n_tensor_parallel_ranks() -> None:
    def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
        return dict(doc["spec"]["template"]["spec"])

    four = {"accelerator": "nvidia-h200", "count": 4}
    serving = pod_of(serving_deployment(md(hardware=four), "stable", BUILD, 1, SETTINGS))["containers"][0]
    i = serving["command"].index("--tensor-parallel")
    assert serving["command"][i + 1] == "4"
    assert serving["resources"]["limits"]["nvidia.com/gpu"] == "4"  # one pod holds the four ranks
    sandbox = next(
        c for c in pod_of(sandbox_job(cj(hardware=four), SETTINGS))["initContainers"] if c["name"] == "engine"
    )
    i = sandbox["command"].index("--tensor-parallel")
    assert sandbox["command"][i + 1] == "4" and sandbox["resources"]["limits"]["nvidia.com/gpu"] == "4"
    one = md(hardware={"accelerator": "nvidia-h200", "count": 1})
    assert (
        "--tensor-parallel"
        not in pod_of(serving_deployment(one, "stable", BUILD, 1, SETTINGS))["containers"][0]["command"]
    )
    assert tensor_parallel(md(hardware={"accelerator": "cpu", "count": 2}).spec.hardware) == []
