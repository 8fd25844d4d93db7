"""Benchmark figures: exact under a fake clock that only the hot path advances, sane on the real one."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from engine_support.builds import sensitive_model
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.workload import RequestShape, Workload
from polymorph_engine.experiment.bench import ReusedCache, benchmark, make_prompts, percentile, replay
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel

PREFILL_S, DECODE_S = 0.005, 0.010


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedHotPath:
    """The real reference hot path, but each prefill costs 5 ms and each decode step 10 ms of fake time."""

    def __init__(self, inner: HotPath, clock: FakeClock) -> None:
        self.inner, self.clock = inner, clock
        self.decode_batches: list[int] = []

    def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
        return self.inner.new_cache(max_batch, max_seq_len)

    def prefill(self, cache: Any, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        self.clock.now += PREFILL_S
        return self.inner.prefill(cache, slot, tokens)

    def decode(self, cache: Any, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.clock.now += DECODE_S
        self.decode_batches.append(int(slots.shape[0]))
        return self.inner.decode(cache, slots, tokens)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return self.inner.sample(logits)

    def free(self, cache: Any, slot: int) -> None:
        self.inner.free(cache, slot)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return sensitive_model()


@pytest.fixture
def reference(model: LoadedModel) -> Iterator[HotPath]:
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD)
    yield hotpath
    hotpath.close()


def test_percentile_interpolates() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(i) for i in range(101)], 95) == 95.0


def test_prompts_are_seeded_random_ids_of_the_requested_lengths(model: LoadedModel) -> None:
    workload = Workload((RequestShape(3, 1), RequestShape(7, 2)), concurrency=2)
    a = make_prompts(workload, model.config.vocab_size, seed=5)
    assert a == make_prompts(workload, model.config.vocab_size, seed=5) != make_prompts(workload, 512, seed=6)
    assert [len(p) for p in a] == [3, 7] and all(0 <= t < 512 for p in a for t in p)


def test_closed_loop_figures_are_exact_under_a_fake_clock(reference: HotPath) -> None:
    clock = FakeClock()
    timed = TimedHotPath(reference, clock)
    # Two slots, three requests: the third joins when the first leaves.
    workload = Workload((RequestShape(4, 3), RequestShape(6, 2), RequestShape(5, 2)), concurrency=2)
    prompts = make_prompts(workload, 512)
    result = replay(timed, workload, prompts, clock=clock)
    # step 1 (t=10ms): prefill r0, r1            -> first tokens of r0, r1
    # step 2 (t=20ms): decode [r0, r1]           -> r1 done (2 tokens)
    # step 3 (t=35ms): prefill r2, decode [r0]   -> r0 done (3 tokens), r2's first token
    # step 4 (t=45ms): decode [r2]               -> r2 done
    assert timed.decode_batches == [2, 1, 1]
    assert result.output_tokens == 7 and result.input_tokens == 15
    assert result.duration_s == pytest.approx(0.045)
    assert sorted(result.ttft_s) == pytest.approx([0.010, 0.010, 0.035])  # all three arrived at 0
    assert sorted(result.itl_s) == pytest.approx([0.010, 0.010, 0.010, 0.015])


def test_trace_arrivals_are_honoured_and_idle_time_is_skipped(reference: HotPath) -> None:
    clock = FakeClock()
    timed = TimedHotPath(reference, clock)
    workload = Workload((RequestShape(4, 2, 0.0), RequestShape(4, 2, 100.0)), concurrency=4)
    result = replay(timed, workload, make_prompts(workload, 512), clock=clock)
    # Each request alone: prefill 5 ms, one decode 10 ms; the 100 s gap is idle and not measured.
    assert result.ttft_s == pytest.approx([0.005, 0.005])
    assert result.itl_s == pytest.approx([0.010, 0.010])
    assert result.duration_s == pytest.approx(0.030)


def test_benchmark_reports_medians_spread_and_excludes_warmup(reference: HotPath) -> None:
    clock = FakeClock()
    timed = TimedHotPath(reference, clock)
    workload = Workload((RequestShape(4, 3), RequestShape(6, 2), RequestShape(5, 2)), concurrency=2)
    figures = benchmark(timed, workload, repeats=3, warmup=2, vocab_size=512, clock=clock)
    assert len(timed.decode_batches) == 5 * 3  # 2 warm-up passes + 3 measured, 3 decode steps each
    assert figures.repeats == pytest.approx([7 / 0.045] * 3)
    assert figures.outputTokensPerSecond == pytest.approx(7 / 0.045)
    assert figures.totalTokensPerSecond == pytest.approx(22 / 0.045)
    assert figures.noise == pytest.approx(0.0, abs=1e-9)
    assert figures.ttftP50Ms == pytest.approx(10.0) and figures.ttftP95Ms == pytest.approx(35.0)
    assert figures.itlP50Ms == pytest.approx(10.0) and figures.itlP95Ms == pytest.approx(15.0)


def test_real_clock_figures_are_sane(model: LoadedModel, reference: HotPath) -> None:
    workload = Workload(tuple(RequestShape(8, 6) for _ in range(6)), concurrency=3)
    figures = benchmark(reference, workload, repeats=2, warmup=1, vocab_size=model.config.vocab_size)
    assert figures.outputTokensPerSecond > 0 and len(figures.repeats) == 2
    assert figures.totalTokensPerSecond > figures.outputTokensPerSecond
    assert 0 < figures.ttftP50Ms <= figures.ttftP95Ms and 0 < figures.itlP50Ms <= figures.itlP95Ms
    # Two passes: the median's distribution-free interval is min..max; noise is its relative half-width.
    assert figures.ciLow == min(figures.repeats) and figures.ciHigh == max(figures.repeats)
    assert figures.noise == pytest.approx(
        (max(figures.repeats) - min(figures.repeats)) / 2 / figures.outputTokensPerSecond
    )
    assert len(figures.ttftP95Repeats) == len(figures.itlP95Repeats) == 2 and figures.warmupPasses == 1


def test_bad_settings_are_refused(reference: HotPath) -> None:
    workload = Workload((RequestShape(2, 1),), concurrency=1)
    with pytest.raises(ValueError, match="repeats"):
        benchmark(reference, workload, repeats=0, vocab_size=512)
    with pytest.raises(ValueError, match="warmup"):
        benchmark(reference, workload, warmup=-1, vocab_size=512)


def test_reused_cache_prepares_once_and_replays_identically(reference: HotPath) -> None:
    made: list[tuple[int, int]] = []

    class Counting(ReusedCache):
        def new_cache(self, max_batch: int, max_seq_len: int) -> object:
            if (max_batch, max_seq_len) not in self._caches:
                made.append((max_batch, max_seq_len))
            return super().new_cache(max_batch, max_seq_len)

    workload = Workload((RequestShape(4, 3), RequestShape(6, 2), RequestShape(5, 2)), concurrency=2)
    prompts = make_prompts(workload, 512)
    reused = Counting(reference)
    first, second = (replay(reused, workload, prompts) for _ in range(2))
    assert made == [(2, workload.max_tokens)], "one cache for both passes"
    assert first.output_tokens == second.output_tokens == 7
    reused.release()
    replay(reused, workload, prompts)
    assert len(made) == 2


def test_the_collector_is_off_during_a_pass_and_restored_after(reference: HotPath) -> None:
    seen: list[bool] = []

    class Watching(ReusedCache):
        def decode(self, cache: Any, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            seen.append(gc.isenabled())
            return super().decode(cache, slots, tokens)

    workload = Workload((RequestShape(4, 3),), concurrency=1)
    assert gc.isenabled()
    replay(Watching(reference), workload, make_prompts(workload, 512))
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:  # a caller that runs with the collector off keeps it off
        replay(Watching(reference), workload, make_prompts(workload, 512))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_shaped_reused_cache_serves_every_request_that_fits(reference: HotPath) -> None:
    made: list[tuple[int, int]] = []

    class Recording:
        def __init__(self, inner: HotPath) -> None:
            self.inner = inner

        def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
            made.append((max_batch, max_seq_len))
            return self.inner.new_cache(max_batch, max_seq_len)

    reused = ReusedCache(Recording(reference), shape=(4, 64))  # type: ignore[arg-type]
    first = reused.new_cache(4, 36)  # verification's request: served by the benchmark's shape
    assert reused.new_cache(4, 64) is first and reused.new_cache(1, 8) is first
    bigger = reused.new_cache(8, 64)  # does not fit: a cache of its own
    assert bigger is not first and made == [(4, 64), (8, 64)]


def test_a_replay_allocates_its_caches_at_the_serving_length(reference: HotPath) -> None:
    made: list[tuple[int, int]] = []

    class Recording(TimedHotPath):
        def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
            made.append((max_batch, max_seq_len))
            return super().new_cache(max_batch, max_seq_len)

    workload = Workload((RequestShape(12, 4),), concurrency=2)
    prompts = make_prompts(workload, 512)
    hotpath = Recording(reference, FakeClock())
    replay(hotpath, workload, prompts)  # type: ignore[arg-type]
    replay(hotpath, workload, prompts, cache_len=1024)  # type: ignore[arg-type]
    replay(hotpath, workload, prompts, cache_len=8)  # type: ignore[arg-type]  # never under the longest request
    assert made == [(2, 16), (2, 1024), (2, 16)]
    assert BenchSettings(cache_slots=8, cache_len=1024).cache_shape(workload) == (8, 1024)
    assert (
        BenchSettings(cache_slots=1, cache_len=8).cache_shape(workload)
        == BenchSettings().cache_shape(workload)
        == (2, 16)
    )
