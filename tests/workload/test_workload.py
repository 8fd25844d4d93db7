"""Workloads: seeded sampling from profiles, trace parsing, workload files and device scaling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polymorph.contract.api import Histogram, WorkloadProfile
from polymorph.contract.errors import UsageError
from polymorph.contract.workload import (
    DEFAULT_WORKLOAD,
    SERVING_MAX_BATCH,
    RequestShape,
    Workload,
    fit_workload,
    load_workload,
    parse_trace,
    sample_requests,
    serving_max_batch,
    workload_from_profile,
)

PROFILE = WorkloadProfile(
    inputTokens=Histogram(bounds=[10, 100], counts=[1, 3]),
    outputTokens=Histogram(bounds=[5], counts=[1]),
    concurrency=3,
)


def test_sampling_is_seeded_and_stays_inside_the_buckets() -> None:
    a, b, c = (sample_requests(PROFILE, 400, seed=s) for s in (1, 1, 2))
    assert a == b and a != c
    assert all(1 <= r.input_tokens <= 100 and 1 <= r.output_tokens <= 5 for r in a)
    long = sum(r.input_tokens > 10 for r in a) / len(a)
    assert 0.65 < long < 0.85  # counts [1, 3]: three quarters land in (10, 100]


def test_a_profile_workload_is_closed_loop_with_the_profile_concurrency() -> None:
    workload = workload_from_profile(DEFAULT_WORKLOAD, n=16)
    assert len(workload.requests) == 16 and workload.concurrency == DEFAULT_WORKLOAD.concurrency
    assert all(r.arrival_s == 0 for r in workload.requests)
    assert workload.digest == DEFAULT_WORKLOAD.digest()


def test_a_trace_replays_in_arrival_order_with_the_spellings_it_accepts() -> None:
    lines = [
        json.dumps({"inputTokens": 7, "outputTokens": 2, "arrivalS": 0.5}),
        "",
        json.dumps({"inputTokens": 3, "outputTokens": 4, "offsetS": 0.25}),
        json.dumps({"inputTokens": 9, "outputTokens": 1}),
    ]
    workload = parse_trace(lines, concurrency=2)
    assert workload.requests == (RequestShape(9, 1, 0.0), RequestShape(3, 4, 0.25), RequestShape(7, 2, 0.5))
    assert workload.concurrency == 2 and workload.digest.startswith("sha256:")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 1 is not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"inputTokens": 0, "outputTokens": 1}', "inputTokens must be an integer from 1 to 1048576"),
        ('{"inputTokens": 3, "outputTokens": 1.5}', "outputTokens must be an integer from 1 to 1048576"),
        (
            '{"inputTokens": 3, "outputTokens": 1, "arrivalS": -1}',
            "arrivalS must be a number of seconds >= 0",
        ),
        ('{"inputTokens": 3, "outputTokens": 1, "prompt": "hi"}', "unknown field 'prompt'"),
    ],
)
def test_bad_trace_lines_are_named(line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_trace([line], source="t.jsonl")


def test_workload_files_profile_wrapped_profile_and_trace(tmp_path: Path) -> None:
    doc = PROFILE.model_dump(mode="json")
    (tmp_path / "p.yaml").write_text(json.dumps(doc))
    (tmp_path / "w.yaml").write_text(json.dumps({"profile": doc}))
    (tmp_path / "t.jsonl").write_text('{"inputTokens": 4, "outputTokens": 2, "arrivalS": 0}\n')
    a, b = load_workload(tmp_path / "p.yaml", n=8), load_workload(tmp_path / "w.yaml", n=8)
    assert a == b and len(a.requests) == 8 and a.concurrency == 3
    assert load_workload(tmp_path / "t.jsonl").requests == (RequestShape(4, 2, 0.0),)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("inputTokens: {bounds: [1], counts: [1]}\nconcurrency: 2\n", "outputTokens: is required"),
        ("- 1\n- 2\n", "must hold a profile"),
        (
            "{inputTokens: {bounds: [2, 1], counts: [1, 1]}, outputTokens: {bounds: [1], counts: [1]}}",
            "strictly increasing",
        ),
        ("a: [", "invalid YAML at line"),
    ],
)
def test_bad_workload_files_get_one_sentence(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        load_workload(path)


def test_a_missing_workload_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"workload file .*absent\.yaml: file not found"):
        load_workload(tmp_path / "absent.yaml")


def test_fitting_keeps_the_shape_and_is_deterministic() -> None:
    workload = Workload(
        (
            RequestShape(100, 40, 0.0),
            RequestShape(50, 10, 2.0),
            RequestShape(1, 1, 4.0),
            RequestShape(80, 20, 6.0),
        ),
        concurrency=16,
        digest="sha256:x",
    )
    fitted = fit_workload(
        workload, max_requests=3, max_input=10, max_output=8, max_concurrency=4, time_scale=0.5
    )
    assert fitted == fit_workload(
        workload, max_requests=3, max_input=10, max_output=8, max_concurrency=4, time_scale=0.5
    )
    assert fitted.requests == (RequestShape(10, 8, 0.0), RequestShape(5, 2, 1.0), RequestShape(1, 1, 2.0))
    assert fitted.concurrency == 4 and fitted.digest == "sha256:x" and fitted.max_tokens == 18
    assert fit_workload(workload) == workload


def test_the_serving_batch_is_the_engine_args_last_max_batch_else_the_engines_default() -> None:
    assert serving_max_batch([]) == SERVING_MAX_BATCH == 8
    assert serving_max_batch(["--max-batch", "2"]) == 2
    assert serving_max_batch(["--max-batch=4", "--max-queue", "9", "--max-batch", "16"]) == 16
    # A value the engine would refuse at start-up is not a serving batch: the default stands.
    assert serving_max_batch(["--max-batch", "0"]) == serving_max_batch(["--max-batch"]) == 8
    assert serving_max_batch(["--max-batch", "two"]) == serving_max_batch(["--max-batch=99999"]) == 8


def test_a_long_trace_is_sampled_over_its_whole_length_and_a_short_one_runs_at_most_its_size() -> None:
    lines = [
        f'{{"inputTokens": {1 + (i // 1000) % 500}, "outputTokens": {1 + i % 70}, "arrivalS": {i * 0.01}}}'
        for i in range(200_000)
    ]
    trace = parse_trace(lines)
    fitted = fit_workload(trace, max_requests=16)
    arrivals = [r.arrival_s for r in fitted.requests]
    assert len(arrivals) == 16 and arrivals[0] == 0.0 and arrivals[-1] > 0.9 * trace.requests[-1].arrival_s
    assert len({r.input_tokens for r in fitted.requests}) > 8  # not the first 16 lines' 1..16
    assert parse_trace(['{"inputTokens": 5, "outputTokens": 3}']).concurrency == 1
    assert parse_trace(['{"inputTokens": 5, "outputTokens": 3}'] * 20).concurrency == 8
