"""The resource models: contract defaults, ranges, enums and every cross-field rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from polymorph.contract.api import (
    AgentSpec,
    CompileJob,
    CompileJobSpec,
    Histogram,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    ThresholdRange,
    parse_duration,
)
from polymorph.contract.api.rules import FieldError

MINIMAL_MD: dict[str, Any] = {
    "apiVersion": "polymorph.dev/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "m"},
    "spec": {"model": {"uri": "s3://models/m/"}, "hardware": {"accelerator": "nvidia-h200"}},
}
PROFILE = {
    "inputTokens": {"bounds": [128, 512], "counts": [3, 1]},
    "outputTokens": {"bounds": [64], "counts": [4]},
}


def md_with(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(MINIMAL_MD)
    doc["spec"].update(spec)
    return doc


def test_modeldeployment_defaults_follow_the_contract() -> None:
    md = ModelDeployment.model_validate(MINIMAL_MD)
    spec = md.spec
    assert spec.replicas == 1
    assert spec.model.dtype == "bfloat16" and spec.model.maxSeqLen == 8192 and spec.model.architecture is None
    assert spec.hardware.count == 1 and spec.hardware.nodeSelector == {} and spec.hardware.tolerations == []
    assert spec.build.policy == "Auto" and spec.build.pinned is None
    r = spec.recompile
    assert (r.enabled, r.driftThreshold, r.window, r.minRequests, r.cooldown) == (
        True,
        0.25,
        "30m",
        200,
        "6h",
    )
    assert r.compile.agent.kind == "Search"
    assert (r.compile.budget.maxExperiments, r.compile.budget.deadline, r.compile.budget.sandboxes) == (
        200,
        "24h",
        2,
    )
    assert r.compile.objective.metric == "outputTokensPerSecond"
    assert (r.compile.gates.tokenAgreement, r.compile.gates.minSpeedup) == (0.98, 1.05)
    ro = spec.rollout
    assert [(s.weight, s.pause) for s in ro.steps] == [(25, "10m"), (50, "10m")]
    assert (ro.analysis.interval, ro.analysis.failureLimit, ro.analysis.noDataPolicy) == (
        "1m",
        2,
        "Inconclusive",
    )
    assert [m.name for m in ro.analysis.metrics] == ["throughput", "itl-p95"]
    assert ro.onFailure == "Rollback"
    assert md.status is None


def test_compilejob_defaults_follow_the_contract() -> None:
    spec = CompileJobSpec.model_validate({"deploymentRef": {"name": "m"}})
    assert spec.baseBuild == "reference" and spec.workload is None
    assert spec.agent.kind == "Search" and spec.objective.metric == "outputTokensPerSecond"
    assert (spec.gates.tokenAgreement, spec.gates.logitTolerance, spec.gates.minSpeedup) == (0.98, 0.05, 1.05)
    b = spec.budget
    assert (b.maxExperiments, b.deadline, b.sandboxes, b.experimentTimeout) == (200, "24h", 2, "10m")


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("10m", 600), ("6h", 21600), ("1d", 86400), ("90m", 5400)]
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "10", "1w", "1.5h", "-1m", "m", "10 m", "01m", ""])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
    with pytest.raises(ValidationError):
        ModelDeployment.model_validate(md_with(recompile={"window": text}))


@pytest.mark.parametrize(
    "build",
    ["reference", "sha256:" + "0" * 64, "sha256:" + "ab12" * 16],
)
def test_build_ids_accepted(build: str) -> None:
    assert ModelDeployment.model_validate(md_with(build={"pinned": build})).spec.build.pinned == build


@pytest.mark.parametrize(
    "build",
    ["latest", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "sha1:" + "0" * 40, "Reference", "sha256:"],
)
def test_bad_build_ids_rejected(build: str) -> None:
    with pytest.raises(ValidationError):
        ModelDeployment.model_validate(md_with(build={"pinned": build}))


def test_rollout_weights_must_strictly_increase() -> None:
    ok = md_with(rollout={"steps": [{"weight": 1}, {"weight": 50}, {"weight": 100}]})
    assert [s.weight for s in ModelDeployment.model_validate(ok).spec.rollout.steps] == [1, 50, 100]
    for steps in ([50, 50], [50, 25], [0], [101], [10, 20, 15]):
        with pytest.raises(ValidationError):
            ModelDeployment.model_validate(md_with(rollout={"steps": [{"weight": w} for w in steps]}))


def test_increasing_rule_points_at_the_steps() -> None:
    with pytest.raises(ValidationError) as info:
        ModelDeployment.model_validate(
            md_with(rollout={"steps": [{"weight": 10}, {"weight": 30}, {"weight": 20}]})
        )
    (error,) = info.value.errors()
    cause = error["ctx"]["error"]
    assert error["loc"] == ("spec", "rollout")
    assert isinstance(cause, FieldError) and cause.loc == ("steps",)
    assert str(cause) == "step weights must be strictly increasing, each step above the one before"


def test_metric_needs_exactly_one_of_builtin_or_query() -> None:
    base = {"name": "x", "thresholdRange": {"max": 1}}
    for extra in ({}, {"builtin": "errorRate", "query": "up"}):
        with pytest.raises(ValidationError, match="exactly one of builtin or query"):
            ModelDeployment.model_validate(md_with(rollout={"analysis": {"metrics": [{**base, **extra}]}}))
    for extra in ({"builtin": "errorRate"}, {"query": "sum(up)"}):
        ModelDeployment.model_validate(md_with(rollout={"analysis": {"metrics": [{**base, **extra}]}}))


def test_threshold_range() -> None:
    assert ThresholdRange(min=1, max=1).contains(1.0)
    assert not ThresholdRange(max=0).contains(0.5)
    assert ThresholdRange(min=0.98).contains(5)
    with pytest.raises(ValidationError, match="min"):
        ThresholdRange(min=2, max=1)
    with pytest.raises(ValidationError, match="min, max or both"):
        ThresholdRange()


def test_metric_names_unique() -> None:
    metric = {"name": "x", "builtin": "errorRate", "thresholdRange": {"max": 1}}
    with pytest.raises(ValidationError, match="unique"):
        ModelDeployment.model_validate(md_with(rollout={"analysis": {"metrics": [metric, metric]}}))


def test_compilejob_target_is_deployment_or_model_plus_hardware() -> None:
    model = {"uri": "/models/tiny"}
    hardware = {"accelerator": "cpu"}
    workload = {"profile": PROFILE}
    CompileJobSpec.model_validate({"deploymentRef": {"name": "m"}})
    CompileJobSpec.model_validate({"model": model, "hardware": hardware, "workload": workload})
    bad: list[dict[str, Any]] = [
        {},
        {"deploymentRef": {"name": "m"}, "model": model, "hardware": hardware},
        {"deploymentRef": {"name": "m"}, "model": model},
        {"model": model, "workload": workload},
        {"hardware": hardware, "workload": workload},
        {"model": model, "hardware": hardware},  # standalone without a workload has no live profile
    ]
    for spec in bad:
        with pytest.raises(ValidationError):
            CompileJobSpec.model_validate(spec)


def test_workload_needs_exactly_one_of_profile_or_trace() -> None:
    ref = {"name": "m"}
    CompileJobSpec.model_validate({"deploymentRef": ref, "workload": {"traceUri": "s3://traces/a.jsonl"}})
    for workload in ({}, {"profile": PROFILE, "traceUri": "s3://traces/a.jsonl"}):
        with pytest.raises(ValidationError, match="exactly one of profile or traceUri"):
            CompileJobSpec.model_validate({"deploymentRef": ref, "workload": workload})


def test_histogram_rules() -> None:
    assert Histogram(bounds=[1, 2], counts=[1, 3]).mean() == pytest.approx(1.75)
    for bounds, counts in (([1, 2], [1]), ([2, 1], [1, 1]), ([1, 1], [1, 1]), ([], []), ([1], [0])):
        with pytest.raises(ValidationError):
            Histogram(bounds=bounds, counts=counts)


def test_claude_agent_requires_api_key_secret() -> None:
    with pytest.raises(ValidationError, match="apiKeySecretRef"):
        AgentSpec(kind="Claude")
    agent = AgentSpec.model_validate(
        {"kind": "Claude", "apiKeySecretRef": {"name": "anthropic", "key": "api-key"}}
    )
    assert agent.apiKeySecretRef is not None and agent.apiKeySecretRef.key == "api-key"


@pytest.mark.parametrize(
    "spec",
    [
        {"replicas": -1},
        {"replcas": 2},
        {"model": {"uri": "s3://m/", "dtype": "int8"}},
        {"model": {"uri": "http://example.com/m"}},
        {"model": {"uri": "s3://m/", "maxSeqLen": 0}},
        {"hardware": {"accelerator": "tpu-v5"}},
        {"hardware": {"accelerator": "cpu", "count": 0}},
        {"build": {"policy": "Sometimes"}},
        {"recompile": {"driftThreshold": 0}},
        {"recompile": {"driftThreshold": 1.5}},
        {"recompile": {"minRequests": -5}},
        {"rollout": {"onFailure": "Ignore"}},
        {"rollout": {"steps": []}},
        {"rollout": {"analysis": {"noDataPolicy": "Skip"}}},
        {"rollout": {"analysis": {"failureLimit": -1}}},
        {"engine": {"resources": {"limits": {"cpu": "two"}}}},
        {"engine": {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}},
        {"recompile": {"compile": {"budget": {"sandboxes": 0}}}},
        {"recompile": {"compile": {"gates": {"minSpeedup": 0.9}}}},
    ],
)
def test_invalid_specs_are_rejected(spec: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ModelDeployment.model_validate(md_with(**spec))


def test_quantities_accept_ints_and_strings() -> None:
    doc = md_with(engine={"resources": {"requests": {"cpu": 2, "memory": "16Gi"}, "limits": {"cpu": "500m"}}})
    resources = ModelDeployment.model_validate(doc).spec.engine.resources
    assert resources.requests == {"cpu": "2", "memory": "16Gi"} and resources.limits == {"cpu": "500m"}


def test_hardware_resource_name() -> None:
    spec = ModelDeploymentSpec.model_validate(
        {"model": {"uri": "/m"}, "hardware": {"accelerator": "amd-mi355x"}}
    )
    assert spec.hardware.resource_name() == "amd.com/gpu"
    spec = ModelDeploymentSpec.model_validate({"model": {"uri": "/m"}, "hardware": {"accelerator": "cpu"}})
    assert spec.hardware.resource_name() is None


def test_name_must_fit_a_service_and_its_canary() -> None:
    ModelDeployment.model_validate({**MINIMAL_MD, "metadata": {"name": "a" * 56}})
    for name in ("a" * 57, "Llama", "llama.chat", "9llama"):
        with pytest.raises(ValidationError):
            ModelDeployment.model_validate({**MINIMAL_MD, "metadata": {"name": name}})


def test_status_is_optional_typed_and_tolerant() -> None:
    status = ModelDeploymentStatus.model_validate(
        {
            "phase": "RollingOut",
            "drift": {"score": 0.4, "checkedAt": "2025-01-01T00:00:00Z", "reasons": ["inputTokens p95 4x"]},
            "rollout": {
                "phase": "Progressing",
                "step": 1,
                "actualWeight": 50,
                "analysis": [{"name": "throughput", "value": 0.97, "min": 0.98, "verdict": "Fail"}],
            },
            "someFutureField": {"x": 1},
        }
    )
    assert status.drift is not None and status.drift.score == 0.4
    assert status.rollout is not None and status.rollout.analysis[0].verdict == "Fail"
    with pytest.raises(ValidationError):
        ModelDeploymentStatus.model_validate({"phase": "Sleeping"})
    assert ModelDeploymentStatus().model_dump(exclude_none=True) == {"conditions": [], "history": []}


def test_manifest_round_trips() -> None:
    md = ModelDeployment.model_validate(md_with(replicas=3))
    manifest = md.manifest()
    assert manifest["metadata"] == {"name": "m"}
    assert ModelDeployment.model_validate(manifest) == md
    cj = CompileJob.model_validate(
        {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"deploymentRef": {"name": "m"}}}
    )
    assert cj.apiVersion == "polymorph.dev/v1alpha1" and cj.kind == "CompileJob"
    assert CompileJob.model_validate(cj.manifest()) == cj


def test_compilejob_status() -> None:
    cj = CompileJob.model_validate(
        {
            "metadata": {"name": "c"},
            "spec": {"deploymentRef": {"name": "m"}},
            "status": {
                "phase": "Running",
                "sandboxes": [{"index": 0, "phase": "Running", "experiments": 3}],
                "experiments": {"total": 3, "passed": 2, "crashed": 1},
                "baseline": {"build": "reference", "value": 100.0, "speedup": 1.0},
                "best": {
                    "build": "sha256:" + "1" * 64,
                    "uri": "s3://b/x.tar.gz",
                    "value": 130.0,
                    "speedup": 1.3,
                },
                "ledgerUri": "s3://store/compilejobs/ns/c-uid/",
            },
        }
    )
    assert cj.status is not None and cj.status.best is not None and cj.status.best.speedup == 1.3
    with pytest.raises(ValidationError):
        CompileJob.model_validate(
            {"metadata": {"name": "c"}, "spec": {"deploymentRef": {"name": "m"}}, "status": {"phase": "Done"}}
        )


def test_public_api_is_complete() -> None:
    import polymorph.contract.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    for name in (
        "ModelDeployment",
        "CompileJob",
        "ModelDeploymentSpec",
        "CompileJobSpec",
        "WorkloadProfile",
        "Gates",
    ):
        assert name in api.__all__
