"""The chart's Grafana dashboard and PrometheusRule: off by default; the dashboard in a ConfigMap
for Grafana's sidecar, querying only series the engine and the operator export; every alert
checked by the real ``promtool check rules`` and unit-tested by ``promtool test rules``, firing
and not firing. (e2e/dashboard.py runs the dashboard's queries against the e2e's Prometheus.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHART, FULLNAME, NAMESPACE, VALUE_SETS, of_kind, one, render

from polymorph.handlers.observability import OperatorMetrics
from polymorph_engine.serving.metrics import ServerMetrics
from support import yamls

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
DASHBOARD = CHART / "dashboards" / "polymorph-fleet.json"
ON = {"monitoring": {"dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}


def exported_series() -> set[str]:
    """Every sample name the engine and the operator expose (counters' _total, histograms' _bucket...)."""
    families = [*ServerMetrics("b", "md").families(), *OperatorMetrics().registry.collect()]
    names: set[str] = set()
    for fam in families:
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(fam.type, ("",))
        names |= {fam.name + s for s in suffixes}
    return names


def metric_names(expr: str) -> set[str]:
    """The polymorph_* series an expression reads."""
    return set(re.findall(r"\b(polymorph_[a-z_]+)\b", expr))


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_and_rules_are_off_by_default() -> None:
    docs = render({})
    assert [d["metadata"]["name"] for d in of_kind(docs, "ConfigMap")] == [FULLNAME]
    assert of_kind(docs, "PrometheusRule") == []


def test_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard() -> None:
    cm = one(render(ON), "ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in cm["metadata"]
    assert json.loads(cm["data"]["polymorph-fleet.json"]) == json.loads(DASHBOARD.read_text())
    placed = one(render(VALUE_SETS["service-monitors"]), "ConfigMap", f"{FULLNAME}-dashboard")
    assert placed["metadata"]["namespace"] == "grafana"
    assert placed["metadata"]["annotations"] == {"grafana_folder": "Polymorph"}
    # Helm merges maps: a label adds to the default; null removes it (for a sidecar with another label).
    own = {"dashboards": "polymorph", "grafana_dashboard": None}
    relabelled = render({"monitoring": {"dashboard": {"enabled": True, "labels": own}}})
    labels = one(relabelled, "ConfigMap", f"{FULLNAME}-dashboard")["metadata"]["labels"]
    assert labels["dashboards"] == "polymorph" and "grafana_dashboard" not in labels


def test_dashboard_reads_only_exported_series_and_covers_the_issue() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_series()
    exprs = expressions(dashboard)
    used = set().union(*(metric_names(e) for e in exprs))
    assert used and used <= exported, sorted(used - exported)
    for var in dashboard["templating"]["list"][1:]:
        assert metric_names(var["query"]["query"]) <= exported
    titles = {p["title"] for p in dashboard["panels"] if p["type"] != "row"}
    assert {
        "Output tokens/s",
        "Inter-token latency p50 / p95",
        "Errors per second",
        "Drift score against its threshold",
        "CompileJob experiments",
        "CompileJob best speedup",
        "Rollout phase",
        "Rollout step and canary weight",
    } <= titles
    serving = [e for e in exprs if "polymorph_operator_" not in e]
    assert all("track" in e and "$model_deployment" in e for e in serving), "stable against canary"
    assert any("histogram_quantile(0.5," in e for e in exprs) and any(
        "histogram_quantile(0.95," in e for e in exprs
    )
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel.get("datasource", {"uid": "${datasource}"})["uid"] == "${datasource}"


def rules_file(values: dict[str, Any], folder: Path) -> Path:
    rule = one(render(values), "PrometheusRule")
    assert rule["metadata"]["namespace"] == NAMESPACE
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert Path(PROMTOOL).exists(), f"no promtool at {PROMTOOL}: install Debian's prometheus package"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def test_rules_read_only_exported_series_and_pass_promtool_check(tmp_path: Path) -> None:
    path = rules_file(ON, tmp_path)
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout
    rules = yamls.load(path.read_text())["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [
        "PolymorphRolloutStuck",
        "PolymorphAnalysisNoData",
        "PolymorphCompileJobFailed",
        "PolymorphEngineNotReady",
        "PolymorphOperatorDown",
    ]
    used = set().union(*(metric_names(r["expr"]) for r in rules))
    assert used <= exported_series(), sorted(used - exported_series())
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        path.read_text().replace(
            "(polymorph_operator_analysis_nodata)", "(polymorph_operator_analysis_nodata"
        )
    )
    assert promtool("check", "rules", str(broken)).returncode != 0  # the check can fail


def test_rule_labels_and_operator_job() -> None:
    rule = one(render(VALUE_SETS["service-monitors"]), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert all(r["labels"]["team"] == "ml-platform" for r in rules.values())
    assert rules["PolymorphOperatorDown"]["expr"] == f'absent(up{{job="{FULLNAME}-metrics"}} == 1)'
    own = {"monitoring": {"prometheusRule": {"enabled": True, "operatorJob": "polymorph"}}}
    (group,) = one(render(own), "PrometheusRule")["spec"]["groups"]
    assert group["rules"][-1]["expr"] == 'absent(up{job="polymorph"} == 1)'


MD = 'namespace="inference", model_deployment="{md}"'


def _md(md: str) -> str:
    return MD.format(md=md)


def _alert(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}


def stuck(md: str, value: str) -> dict[str, Any]:
    return _alert(
        {"severity": "warning", "namespace": "inference", "model_deployment": md},
        f"Rollout of inference/{md} is past its expected time",
        f"The rollout has run for {value}, more than 2x its expected time (each step's max(pause, analysis "
        "interval)) plus 900s. Its canary pods may not get ready, or its analysis stays Inconclusive: see "
        "the ModelDeployment's status.rollout and Events.",
    )


def nodata(md: str, metric: str) -> dict[str, Any]:
    return _alert(
        {"severity": "warning", "namespace": "inference", "model_deployment": md, "metric": metric},
        f"Canary analysis of inference/{md} has no data for {metric}",
        f"The rollout's latest analysis found no samples for metric {metric} (no series for a track, or a "
        "query that returns nothing), so the step cannot be judged on it. Check that Prometheus scrapes "
        "both tracks' engines with the labels docs/install.md lists.",
    )


def failed(namespace: str, count: int) -> dict[str, Any]:
    return _alert(
        {"severity": "warning", "namespace": namespace},
        f"CompileJobs failed in namespace {namespace}",
        f"{count} CompileJob(s) reached phase Failed in the last 1h. `kubectl get cj.polymorph.dev -n {namespace}` shows "
        "them; each one's status.message says why.",
    )


def not_ready(md: str, track: str, count: int) -> dict[str, Any]:
    return _alert(
        {"severity": "warning", "namespace": "inference", "model_deployment": md, "track": track},
        f"{count} {track} engine(s) of inference/{md} not ready",
        f"The {track} Deployment has had fewer ready serving replicas than desired for 10m: pods that cannot "
        "be scheduled, fetch their weights or load the build. See the pods' Events and engine logs.",
    )


OPERATOR_DOWN = _alert(
    {"severity": "critical"},
    "The Polymorph operator is down",
    f"No replica of the operator (scrape job {NAMESPACE}/{FULLNAME}-operator) has answered on /metrics for "
    "5m: no drift checks, CompileJobs or rollouts progress.",
)


def _phase(md: str, phase: str, values: str) -> dict[str, str]:
    return {"series": f'polymorph_operator_rollout_phase{{{_md(md)}, phase="{phase}"}}', "values": values}


def _gauge(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


# Each test case: series over time (1m apart), then alerts expected at given times, both firing
# (exp_alerts) and not firing (an empty list).
UNIT_TESTS: list[dict[str, Any]] = [
    {  # A 10m rollout (expected 600 s) is stuck after 2 x 600 + 900 s = 35m; a 60m one is not,
        # and neither is a paused one (it waits for a person, not for time).
        "interval": "1m",
        "input_series": [
            _gauge("polymorph_operator_rollout_started_timestamp_seconds", _md("chat"), "0x60"),
            _gauge("polymorph_operator_rollout_expected_seconds", _md("chat"), "600x60"),
            _phase("chat", "Progressing", "1x60"),
            _phase("chat", "Paused", "0x60"),
            _gauge("polymorph_operator_rollout_started_timestamp_seconds", _md("slow"), "0x60"),
            _gauge("polymorph_operator_rollout_expected_seconds", _md("slow"), "3600x60"),
            _phase("slow", "Progressing", "1x60"),
            _gauge("polymorph_operator_rollout_started_timestamp_seconds", _md("held"), "0x60"),
            _gauge("polymorph_operator_rollout_expected_seconds", _md("held"), "60x60"),
            _phase("held", "Progressing", "0x60"),
            _phase("held", "Paused", "1x60"),
        ],
        "alert_rule_test": [
            {"eval_time": "30m", "alertname": "PolymorphRolloutStuck", "exp_alerts": []},
            {
                "eval_time": "40m",
                "alertname": "PolymorphRolloutStuck",
                "exp_alerts": [stuck("chat", "40m 0s")],
            },
        ],
    },
    {  # A metric without data for 5m fires; one that got data back in time does not.
        "interval": "1m",
        "input_series": [
            _gauge("polymorph_operator_analysis_nodata", _md("chat") + ', metric="itl-p95"', "1x20"),
            _gauge("polymorph_operator_analysis_nodata", _md("chat") + ', metric="throughput"', "0x20"),
            _gauge("polymorph_operator_analysis_nodata", _md("back") + ', metric="throughput"', "1 1 1 0x20"),
        ],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "PolymorphAnalysisNoData", "exp_alerts": []},
            {
                "eval_time": "6m",
                "alertname": "PolymorphAnalysisNoData",
                "exp_alerts": [nodata("chat", "itl-p95")],
            },
        ],
    },
    {  # One failed CompileJob at 3m fires for an hour; successes and other namespaces' zeros do not.
        "interval": "1m",
        "input_series": [
            _gauge(
                "polymorph_operator_compilejobs_finished_total",
                'namespace="inference", phase="Failed"',
                "0 0 0 1x120",
            ),
            _gauge(
                "polymorph_operator_compilejobs_finished_total",
                'namespace="inference", phase="Succeeded"',
                "0 1 2 3x120",
            ),
            _gauge(
                "polymorph_operator_compilejobs_finished_total", 'namespace="team-b", phase="Failed"', "0x120"
            ),
        ],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "PolymorphCompileJobFailed", "exp_alerts": []},
            {
                "eval_time": "10m",
                "alertname": "PolymorphCompileJobFailed",
                "exp_alerts": [failed("inference", 1)],
            },
            {"eval_time": "90m", "alertname": "PolymorphCompileJobFailed", "exp_alerts": []},
        ],
    },
    {  # A canary short of a ready replica for 10m fires; a full stable track and a brief gap do not.
        "interval": "1m",
        "input_series": [
            _gauge(
                "polymorph_operator_serving_replicas",
                _md("chat") + ', track="canary", state="desired"',
                "2x20",
            ),
            _gauge(
                "polymorph_operator_serving_replicas", _md("chat") + ', track="canary", state="ready"', "1x20"
            ),
            _gauge(
                "polymorph_operator_serving_replicas",
                _md("chat") + ', track="stable", state="desired"',
                "3x20",
            ),
            _gauge(
                "polymorph_operator_serving_replicas", _md("chat") + ', track="stable", state="ready"', "3x20"
            ),
            _gauge(
                "polymorph_operator_serving_replicas",
                _md("blip") + ', track="stable", state="desired"',
                "1x20",
            ),
            _gauge(
                "polymorph_operator_serving_replicas",
                _md("blip") + ', track="stable", state="ready"',
                "0 0 1x20",
            ),
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "PolymorphEngineNotReady", "exp_alerts": []},
            {
                "eval_time": "12m",
                "alertname": "PolymorphEngineNotReady",
                "exp_alerts": [not_ready("chat", "canary", 1)],
            },
        ],
    },
    {  # The operator stops answering at 6m: the alert fires 5m later; another job's failures do not count.
        "interval": "1m",
        "input_series": [
            _gauge("up", f'job="{NAMESPACE}/{FULLNAME}-operator", instance="a"', "1x5 0x20"),
            _gauge("up", 'job="inference/engines", instance="b"', "0x25"),
        ],
        "alert_rule_test": [
            {"eval_time": "8m", "alertname": "PolymorphOperatorDown", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "PolymorphOperatorDown", "exp_alerts": [OPERATOR_DOWN]},
        ],
    },
    {  # No operator series at all (never scraped) is down too; a standby replica up is not.
        "interval": "1m",
        "input_series": [
            _gauge("up", f'job="{NAMESPACE}/{FULLNAME}-operator", instance="standby"', "_x3 1x20"),
            _gauge("up", f'job="{NAMESPACE}/{FULLNAME}-operator", instance="active"', "0x25"),
        ],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "PolymorphOperatorDown", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "PolymorphOperatorDown", "exp_alerts": []},
        ],
    },
]


def test_every_alert_fires_and_holds_in_promtool_unit_tests(tmp_path: Path) -> None:
    path = rules_file(ON, tmp_path)
    spec = tmp_path / "tests.yaml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [path.name], "evaluation_interval": "1m", "tests": UNIT_TESTS})
    )
    done = promtool("test", "rules", str(spec))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    tested = {t["alertname"] for case in UNIT_TESTS for t in case["alert_rule_test"]}
    rules = yamls.load(path.read_text())["groups"][0]["rules"]
    assert tested == {r["alert"] for r in rules}
    for alert in tested:  # each alert is seen firing and seen quiet
        outcomes = {
            bool(t["exp_alerts"]) for c in UNIT_TESTS for t in c["alert_rule_test"] if t["alertname"] == alert
        }
        assert outcomes == {True, False}, alert


@pytest.mark.parametrize("alert", ["PolymorphEngineNotReady", "PolymorphOperatorDown"])
def test_promtool_unit_tests_can_fail(alert: str, tmp_path: Path) -> None:
    """A rule that never fires fails its unit test: the tests above check something."""
    path = rules_file(ON, tmp_path)
    groups = yamls.load(path.read_text())["groups"]
    for rule in groups[0]["rules"]:
        if rule["alert"] == alert:
            rule["expr"] = "vector(1) == 0"
    path.write_text(yaml.safe_dump({"groups": groups}))
    spec = tmp_path / "tests.yaml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [path.name], "evaluation_interval": "1m", "tests": UNIT_TESTS})
    )
    done = promtool("test", "rules", str(spec))
    assert done.returncode != 0 and f"alertname: {alert}" in done.stdout + done.stderr
