"""The traffic trace: Bernoulli sampling, a bounded buffer, the key layout, and flushing to both
stores in the format the workload module replays; plus the sandbox admin flush call."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from polymorph.contract.api import ExperimentRecord
from polymorph.contract.store import Store
from polymorph.contract.workload import parse_trace
from polymorph_engine.sandbox.admin import serve_admin
from polymorph_engine.serving.metrics import HistogramData
from polymorph_engine.serving.trace import TraceSampler, encode_trace, flush_trace, trace_key


def test_sample_rate_keeps_about_that_fraction() -> None:
    sampler = TraceSampler(0.25, seed=1)
    kept = sum(sampler.record(10, 5, float(i)) for i in range(4000))
    assert 800 < kept < 1200
    assert sampler.seen == 4000 and sampler.kept == kept == len(sampler)
    assert TraceSampler(0.0).record(1, 1, 0.0) is False
    assert all(TraceSampler(1.0).record(1, 1, float(i)) for i in range(10))


def test_buffer_is_bounded_and_drain_rebases_arrivals() -> None:
    sampler = TraceSampler(1.0, max_records=3)
    for i, t in enumerate([105.0, 101.0, 103.5, 102.0, 104.0]):
        sampler.record(i + 1, 1, t)
    assert sampler.dropped == 2
    records = sampler.drain()
    assert [(r.inputTokens, r.arrivalS) for r in records] == [(4, 0.0), (3, 1.5), (5, 2.0)]
    assert sampler.drain() == []


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_bad_sample_rate_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        TraceSampler(rate)


def test_key_layout() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert (
        trace_key("inference", "chat", when) == "workloads/inference/chat/trace-20260102T030405.123456Z.jsonl"
    )


def test_flush_writes_a_replayable_trace_to_the_store(store: Store) -> None:
    sampler = TraceSampler(1.0)
    for shape in [(12, 30, 50.0), (7, 2, 50.25), (300, 64, 51.0)]:
        sampler.record(*shape)
    key = flush_trace(sampler, store, "inference", "chat")
    assert key is not None and store.list("workloads/inference/chat/") == [key]
    workload = parse_trace(store.get_bytes(key).decode().splitlines())
    assert [(r.input_tokens, r.output_tokens, r.arrival_s) for r in workload.requests] == [
        (12, 30, 0.0),
        (7, 2, 0.25),
        (300, 64, 1.0),
    ]
    assert flush_trace(sampler, store, "inference", "chat") is None  # nothing new: no empty object


def test_encode_is_one_object_per_line() -> None:
    sampler = TraceSampler(1.0)
    sampler.record(1, 2, 0.0)
    assert encode_trace(sampler.drain()) == b'{"inputTokens": 1, "outputTokens": 2, "arrivalS": 0.0}\n'


def test_histogram_buckets_are_cumulative_with_le_semantics() -> None:
    h = HistogramData((1.0, 4.0))
    for value in (0.5, 1.0, 2.0, 4.0, 9.0):
        h.observe(value)
    assert h.cumulative() == [("1.0", 2.0), ("4.0", 4.0), ("+Inf", 5.0)]
    assert h.count == 5 and h.total == 16.5


class _NoRunner:
    def run(self, build_dir: Path, *, description: str = "") -> ExperimentRecord:
        raise AssertionError("not used")


def test_admin_flush_call_writes_the_trace(store: Store, tmp_path: Path) -> None:
    sampler = TraceSampler(1.0)
    sampler.record(4, 4, 1.0)
    server = serve_admin(
        _NoRunner(),
        "127.0.0.1",
        0,
        workdir=tmp_path,
        flush_trace=lambda: flush_trace(sampler, store, "ns", "md"),
    )
    server.start()
    try:
        key = httpx.post(f"{server.url}/admin/trace/flush", content=b"").json()["key"]
        assert key is not None and key.startswith("workloads/ns/md/trace-")
        assert store.get_bytes(key).startswith(b'{"inputTokens": 4')
        assert httpx.post(f"{server.url}/admin/trace/flush", content=b"").json() == {"key": None}
    finally:
        server.close()
