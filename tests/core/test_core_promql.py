"""PromQL builders and result parsing: a fixed number of fleet-wide queries, results become profiles/samples."""

from __future__ import annotations

import math

import pytest

from polymorph.core.promql import (
    analysis_queries,
    parse_analysis,
    parse_profiles,
    profile_queries,
    scalar,
    substitute,
)


def test_query_counts_do_not_depend_on_the_fleet() -> None:
    assert len(profile_queries("30m")) == 3
    assert len(analysis_queries("1m")) == 4
    for q in [*profile_queries("30m").values(), *analysis_queries("1m").values()]:
        assert "model_deployment" in q and "namespace" in q


def test_latency_samples_come_from_pods_that_served_an_interval_before_the_window() -> None:
    q = analysis_queries("45s")
    serving = (
        "and on (namespace, model_deployment, track, instance) group by (namespace, model_deployment, "
        'track, instance) (polymorph_requests_in_flight{model_deployment!=""} offset 90s)'
    )
    for name in ("itlMean", "itlP95", "ttftP95"):
        assert q[name].endswith(serving) and "[45s]" in q[name], q[name]
    assert "offset" not in q["requests"]  # errors count from every pod
    assert (
        "offset 2m)" in analysis_queries("1m")["itlMean"]
        and "offset 1000ms)" in analysis_queries("500ms")["itlMean"]
    )


def test_profile_queries_use_the_window_and_engine_metric_names() -> None:
    q = profile_queries("10m")
    assert q["prompt"] == (
        'sum by (namespace, model_deployment, le) (increase(polymorph_prompt_tokens_bucket{model_deployment!=""}[10m]))'
    )
    assert "polymorph_generation_tokens_bucket" in q["generation"]
    assert "polymorph_requests_in_flight" in q["concurrency"]


def bucket(ns: str, md: str, le: str, value: float) -> tuple[dict[str, str], float]:
    return {"namespace": ns, "model_deployment": md, "le": le}, value


def test_parse_profiles_from_cumulative_buckets() -> None:
    results = {
        "prompt": [
            bucket("a", "m", "128.0", 10.2),
            bucket("a", "m", "512.0", 30.0),
            bucket("a", "m", "2048.0", 30.0),
            bucket("a", "m", "+Inf", 40.0),
        ],
        "generation": [bucket("a", "m", "64.0", 20), bucket("a", "m", "+Inf", 40)],
        "concurrency": [({"namespace": "a", "model_deployment": "m"}, 3.6)],
    }
    live = parse_profiles(results)[("a", "m")]
    assert live.requests == 40
    assert live.profile.inputTokens.bounds == [128, 512, 2048, 4096]
    assert live.profile.inputTokens.counts == [10, 20, 0, 10]
    assert live.profile.outputTokens.bounds == [64, 128]
    assert live.profile.concurrency == 4


def test_parse_profiles_skips_deployments_without_traffic() -> None:
    results = {
        "prompt": [
            bucket("a", "idle", "128.0", 0.0),
            bucket("a", "idle", "+Inf", 0.0),
            bucket("a", "x", "1", math.nan),
        ],
        "generation": [bucket("a", "idle", "+Inf", 0.0)],
        "concurrency": [],
    }
    assert parse_profiles(results) == {}


def pod(md: str, track: str, instance: str, **extra: str) -> dict[str, str]:
    return {"namespace": "ns", "model_deployment": md, "track": track, "instance": instance, **extra}


def test_parse_analysis_groups_by_track_and_pod() -> None:
    results = {
        "itlMean": [
            (pod("m", "stable", "a"), 0.02),
            (pod("m", "stable", "b"), 0.021),
            (pod("m", "canary", "c"), 0.01),
        ],
        "itlP95": [(pod("m", "canary", "c"), math.nan)],
        "ttftP95": [],
        "requests": [
            (pod("m", "canary", "c", status="ok"), 90.0),
            (pod("m", "canary", "c", status="error"), 10.0),
            (pod("m", "canary", "c", status="cancelled"), 5.0),
        ],
    }
    tracks = parse_analysis(results)[("ns", "m")]
    assert tracks["stable"].itl_mean_s == [0.02, 0.021]
    assert tracks["canary"].itl_p95_s == []
    assert tracks["canary"].requests == 100 and tracks["canary"].errors == 10


@pytest.mark.parametrize(
    ("result", "expected"),
    [([], None), ([({}, 2.5)], 2.5), ([({}, 1.0), ({}, 2.0)], None), ([({}, math.nan)], None)],
)
def test_scalar(result: list[tuple[dict[str, str], float]], expected: float | None) -> None:
    assert scalar(result) == expected


def test_substitute() -> None:
    q = 'sum(rate(x{model_deployment="{{name}}",namespace="{{namespace}}"}[{{interval}}]))'
    assert (
        substitute(q, name="m", namespace="ns", interval="1m")
        == 'sum(rate(x{model_deployment="m",namespace="ns"}[1m]))'
    )
