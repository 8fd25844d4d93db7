"""The per-object gauges: what ``handlers.gauges`` mirrors from a status (and its patch) into /metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from polymorph.contract.api import CompileJobStatus, ModelDeploymentSpec, ModelDeploymentStatus
from polymorph.handlers import gauges
from polymorph.handlers.bodies import lenient, serving_deployment, status_after
from polymorph.handlers.observability import OperatorMetrics

SPEC = {
    "model": {"uri": "/models/tiny"},
    "hardware": {"accelerator": "cpu"},
    "replicas": 3,
    "recompile": {"driftThreshold": 0.3},
    "rollout": {
        "steps": [{"weight": 33, "pause": "30s"}, {"weight": 66, "pause": "2m"}],
        "analysis": {"interval": "1m"},
    },
}


def samples(metrics: OperatorMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def md_body(rollout: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "inference", "name": "chat"},
        "spec": SPEC,
        "status": {"rollout": rollout} if rollout is not None else {},
    }


class Index(dict[tuple[str, str], list[Any]]):
    """The kopf index shape: key -> values (the serving Deployments, as the indexer parses them)."""


KEY = ("inference", "chat")


def observe_md(m: OperatorMetrics, body: dict[str, Any], patch: dict[str, Any], deployments: Index) -> None:
    """What the registry does after a tick: the status after its patch, with the parsed spec."""
    status = status_after(ModelDeploymentStatus, body, patch)
    gauges.observe_modeldeployment(m, KEY, ModelDeploymentSpec.model_validate(SPEC), status, deployments)  # type: ignore[arg-type]


def observe_cj(m: OperatorMetrics, body: dict[str, Any], patch: dict[str, Any]) -> None:
    before, after = lenient(CompileJobStatus, body.get("status")), status_after(CompileJobStatus, body, patch)
    gauges.observe_compilejob(m, ("inference", body["metadata"]["name"]), "chat", before, after)


def test_rollout_in_progress_is_mirrored_from_status_and_this_ticks_patch() -> None:
    m = OperatorMetrics()
    body = md_body({"phase": "Progressing", "step": 0, "weight": 33, "startedAt": "2026-01-01T00:00:00Z"})
    patch = {"rollout": {"step": 1, "weight": 66, "actualWeight": 66.7,
                         "analysis": [{"name": "throughput", "value": 1.01}, {"name": "itl-p95"}]}}  # fmt: skip
    deployments = Index({("inference", "chat"): [serving_deployment({"spec": {"replicas": 1}, "status": {"readyReplicas": 1}})],
                         ("inference", "chat-canary"): [serving_deployment({"spec": {"replicas": 2}, "status": {"readyReplicas": 1}})]})  # fmt: skip
    observe_md(m, body, patch, deployments)
    key = (("model_deployment", "chat"), ("namespace", "inference"))
    phases = samples(m, "polymorph_operator_rollout_phase")
    assert phases[(*key[:1], ("namespace", "inference"), ("phase", "Progressing"))] == 1
    assert sum(phases.values()) == 1 and len(phases) == 8
    assert samples(m, "polymorph_operator_rollout_step") == {key: 2}
    assert samples(m, "polymorph_operator_rollout_steps") == {key: 2}
    assert samples(m, "polymorph_operator_rollout_weight_percent") == {key: 66}
    assert samples(m, "polymorph_operator_rollout_actual_weight_percent") == {key: 66.7}
    assert samples(m, "polymorph_operator_rollout_started_timestamp_seconds") == {key: 1767225600.0}
    assert samples(m, "polymorph_operator_rollout_expected_seconds") == {key: 60 + 120}
    assert samples(m, "polymorph_operator_drift_threshold") == {key: 0.3}
    nodata = samples(m, "polymorph_operator_analysis_nodata")
    assert nodata == {(("metric", "itl-p95"), *key): 1, (("metric", "throughput"), *key): 0}
    replicas = samples(m, "polymorph_operator_serving_replicas")
    assert (
        replicas[
            (
                ("model_deployment", "chat"),
                ("namespace", "inference"),
                ("state", "ready"),
                ("track", "canary"),
            )
        ]
        == 1
    )
    assert (
        replicas[
            (
                ("model_deployment", "chat"),
                ("namespace", "inference"),
                ("state", "desired"),
                ("track", "canary"),
            )
        ]
        == 2
    )

    # The rollout ends: step, weight and start go, the no-data series go, the phase moves.
    observe_md(m, body, {"rollout": {"phase": "Succeeded", "analysis": None}}, deployments)
    assert samples(m, "polymorph_operator_rollout_step") == {key: 0}
    assert samples(m, "polymorph_operator_rollout_weight_percent") == {key: 0}
    assert samples(m, "polymorph_operator_rollout_started_timestamp_seconds") == {}
    assert samples(m, "polymorph_operator_analysis_nodata") == {}
    assert samples(m, "polymorph_operator_rollout_phase")[(*key, ("phase", "Succeeded"))] == 1

    gauges.forget_modeldeployment(m, "inference", "chat")
    for gauge in ("rollout_phase", "rollout_step", "drift_threshold", "serving_replicas"):
        assert samples(m, f"polymorph_operator_{gauge}") == {}, gauge


def test_expected_rollout_time_is_each_steps_pause_or_interval() -> None:
    spec = ModelDeploymentSpec.model_validate(SPEC)
    assert gauges.expected_rollout_seconds(spec) == 180
    default = ModelDeploymentSpec.model_validate({"model": SPEC["model"], "hardware": SPEC["hardware"]})
    assert gauges.expected_rollout_seconds(default) == 1200  # 25% then 50%, 10m each


def test_compilejob_counts_experiments_best_speedup_and_one_finish() -> None:
    m = OperatorMetrics()
    body = {"metadata": {"namespace": "inference", "name": "chat-1a2b3c4d", "labels": {}},
            "spec": {"deploymentRef": {"name": "chat"}}, "status": {"phase": "Running"}}  # fmt: skip
    finished = {
        "phase": "Failed",
        "experiments": {"total": 7, "passed": 5, "failed": 2},
        "best": {"speedup": 1.25},
    }
    observe_cj(m, body, {"experiments": {"total": 3, "passed": 3}})
    totals = samples(m, "polymorph_operator_compilejobs_finished_total")
    assert totals == {
        (("namespace", "inference"), ("phase", p)): 0 for p in ("Succeeded", "Failed", "Cancelled")
    }
    assert samples(m, "polymorph_operator_compilejob_best_speedup") == {}
    observe_cj(m, body, finished)
    observe_cj(m, {**body, "status": finished}, {})  # a later tick of a finished job counts nothing
    totals = samples(m, "polymorph_operator_compilejobs_finished_total")
    assert totals[(("namespace", "inference"), ("phase", "Failed"))] == 1 and sum(totals.values()) == 1
    key = (("compilejob", "chat-1a2b3c4d"), ("model_deployment", "chat"), ("namespace", "inference"))
    assert samples(m, "polymorph_operator_compilejob_best_speedup") == {key: 1.25}
    experiments = samples(m, "polymorph_operator_compilejob_experiments")
    assert experiments[(*key, ("outcome", "total"))] == 7 and experiments[(*key, ("outcome", "failed"))] == 2
    assert samples(m, "polymorph_operator_compilejob_phase")[(*key, ("phase", "Failed"))] == 1
    gauges.forget_compilejob(m, ("inference", body["metadata"]["name"]))
    assert samples(m, "polymorph_operator_compilejob_experiments") == {}
