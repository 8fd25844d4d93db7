"""Benchmark: replay a workload through the scheduler and report ``polymorph.contract.api.Figures``.

Owns: turning request shapes into prompts (random token ids from a seed: content never
matters), the replay loop, timing, and the statistics.

Protocol, identical for every build so figures compare:
- ``warmup`` full unmeasured passes, then ``repeats`` measured passes, each with a fresh
  ``Scheduler`` (and so a fresh KV cache) whose batch size is the workload's concurrency.
  (``benchmark`` is the fixed-count protocol; campaigns use ``experiment.measure``, which warms
  up to a steady state, adds passes until the confidence interval is narrow enough, and pairs
  a candidate with its baseline. Both replay passes with ``replay``.)
- Requests are admitted when the pass clock reaches their arrival offset (all at 0 for
  profile workloads, so at most ``concurrency`` run at once). When nothing runs and the next
  arrival is in the future, the clock skips ahead instead of sleeping: idle time is not
  measured. No request stops early (no EOS), so every pass generates the same tokens.
- A token's time is the end of the scheduler step that produced it (each step ends with a
  device sync: the sampled tokens are read back). TTFT = first token time - arrival;
  ITL = gaps between a request's consecutive tokens.
- The garbage collector is off during a pass (as ``timeit`` does): a collection with torch
  loaded costs tens of milliseconds, which on a GPU pass of 0.1-0.3 s is noise of 10% or more
  landing on whichever build happened to allocate past the threshold. Garbage from a pass is
  collected after it, outside the timing.
- outputTokensPerSecond = generated tokens / pass duration; totalTokensPerSecond counts
  prompt tokens too. Both are the median over repeats; ``repeats`` lists the per-pass
  output tok/s, ``ciLow``/``ciHigh`` bound their median (``polymorph.contract.stats.median_ci``, 95%)
  and ``noise`` is that interval's relative half-width (never the range). TTFT and ITL
  percentiles pool every measured pass; ``ttftP95Repeats``/``itlP95Repeats`` give each pass's
  own p95, so latency objectives can be paired pass by pass too.

It knows nothing about builds, verification or processes.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from polymorph.contract.api import Figures, MeasuredShape
from polymorph.contract.stats import median_ci
from polymorph.contract.workload import Workload
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.scheduler import Request, Scheduler

__all__ = [
    "PassResult",
    "ReusedCache",
    "benchmark",
    "figures_of",
    "make_prompts",
    "percentile",
    "replay",
    "throughput",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def make_prompts(workload: Workload, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """One prompt of random token ids per request; the same seed gives the same prompts."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(r.input_tokens)] for r in workload.requests]


@dataclass
class PassResult:
    """One replay of a workload."""

    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    """Wall seconds of the pass whatever ``clock`` timed it (equal to ``duration_s`` for a wall clock)."""


def replay(
    hotpath: HotPath,
    workload: Workload,
    prompts: list[list[int]],
    *,
    device: torch.device | str = "cpu",
    clock: Callable[[], float] = time.perf_counter,
    cache_len: int | None = None,
) -> PassResult:
    """Run every request of ``workload`` once through a fresh scheduler and time it.

    ``cache_len``: the sequence length its caches are allocated for (None: the longest request's)."""
    max_seq_len = max(cache_len or 0, workload.max_tokens)
    scheduler = Scheduler(hotpath, workload.concurrency, max_seq_len, eos_id=None, device=device)
    pending = deque(sorted(zip(workload.requests, prompts, strict=True), key=lambda rp: rp[0].arrival_s))
    arrival: dict[Request, float] = {}
    last: dict[Request, float] = {}
    result = PassResult(0.0, sum(len(p) for p in prompts), 0)
    skipped = 0.0
    collecting = gc.isenabled()
    gc.disable()
    wall_start = time.perf_counter()
    start = clock()
    try:
        while pending or scheduler.has_work():
            now = clock() - start + skipped
            while pending and pending[0][0].arrival_s <= now:
                shape, prompt = pending.popleft()
                request = Request(prompt=prompt, max_new_tokens=shape.output_tokens, stop_at_eos=False)
                arrival[request] = shape.arrival_s
                scheduler.add(request)
            if not scheduler.has_work():
                skipped += pending[0][0].arrival_s - now  # idle until the next arrival: jump there
                continue
            events = scheduler.step()
            now = clock() - start + skipped
            for request, _token in events:
                if request in last:
                    result.itl_s.append(now - last[request])
                else:
                    result.ttft_s.append(now - arrival[request])
                last[request] = now
                result.output_tokens += 1
        result.duration_s = clock() - start  # busy time only: idle gaps were jumped, not slept
        result.wall_s = time.perf_counter() - wall_start
    finally:
        scheduler.close()
        if collecting:
            gc.enable()
    return result


def benchmark(
    hotpath: HotPath,
    workload: Workload,
    repeats: int = 3,
    warmup: int = 1,
    *,
    vocab_size: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> Figures:
    """Figures for ``hotpath`` on ``workload`` (see the module docstring for the protocol)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    prompts = make_prompts(workload, vocab_size, seed)
    warm = [throughput(replay(hotpath, workload, prompts, device=device, clock=clock)) for _ in range(warmup)]
    passes = [replay(hotpath, workload, prompts, device=device, clock=clock) for _ in range(repeats)]
    return figures_of(passes, warm)


class ReusedCache:
    """A ``HotPath`` that hands every scheduler the same KV cache (per shape), for repeated passes.

    Each replay builds a fresh ``Scheduler``, which asks for a new cache; a build that captures
    CUDA graphs or warms compiled steps per batch bucket in ``new_cache`` would pay that once per
    pass, inside the timed pass. A server keeps one cache for its lifetime, so a benchmark that
    reuses one cache per experiment measures what serving sees. A pass ends with every slot freed
    (no request stops early), so the next pass finds the cache empty. Drop the wrapper (or call
    ``release``) to free the cache; ``close`` is not forwarded: the hot path belongs to its owner.

    With ``shape`` (max_batch, max_seq_len), every request that fits within it gets the one cache
    of that shape: an experiment verifies through the wrapper and then benchmarks through it,
    so a build captures its graphs once, for the benchmark's cache, and the first measured-side
    pass is already steady. Verification frees every slot it used, as a pass does.
    """

    def __init__(self, hotpath: HotPath, shape: tuple[int, int] | None = None) -> None:
        self.hotpath = hotpath
        self.shape = shape
        self._caches: dict[tuple[int, int], Any] = {}
        self.prepare_s = 0.0
        """Seconds spent in the build's ``new_cache`` (graph captures, compiled warm-ups)."""

    def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
        key = (max_batch, max_seq_len)
        if self.shape is not None and max_batch <= self.shape[0] and max_seq_len <= self.shape[1]:
            key = self.shape
        if key not in self._caches:
            started = time.perf_counter()
            self._caches[key] = self.hotpath.new_cache(*key)
            self.prepare_s += time.perf_counter() - started
        return self._caches[key]

    def prefill(self, cache: Any, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        return self.hotpath.prefill(cache, slot, tokens)

    def decode(self, cache: Any, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.hotpath.decode(cache, slots, tokens)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return self.hotpath.sample(logits)

    def free(self, cache: Any, slot: int) -> None:
        self.hotpath.free(cache, slot)

    def close(self) -> None:
        self.release()

    def release(self) -> None:
        """Drop the caches (the wrapped hot path stays open)."""
        self._caches.clear()


def throughput(result: PassResult) -> float:
    """Output tokens per second of one pass."""
    return result.output_tokens / max(result.duration_s, 1e-9)


def figures_of(
    passes: Sequence[PassResult], warmup: Sequence[float] = (), shape: MeasuredShape | None = None
) -> Figures:
    """Aggregate measured passes into ``Figures`` (``warmup``: the throughputs of the passes that ran
    unmeasured before; ``shape``: what they measured)."""
    if not passes:
        raise ValueError("figures_of needs at least one measured pass")
    output_tps = [throughput(p) for p in passes]
    total_tps = [(p.input_tokens + p.output_tokens) / max(p.duration_s, 1e-9) for p in passes]
    median = statistics.median(output_tps)
    ci = median_ci(output_tps) if median > 0 else None
    ttft = [t for p in passes for t in p.ttft_s]
    itl = [t for p in passes for t in p.itl_s]
    return Figures(
        outputTokensPerSecond=median,
        totalTokensPerSecond=statistics.median(total_tps),
        ttftP50Ms=percentile(ttft, 50) * 1e3,
        ttftP95Ms=percentile(ttft, 95) * 1e3,
        itlP50Ms=percentile(itl, 50) * 1e3,
        itlP95Ms=percentile(itl, 95) * 1e3,
        noise=ci.half_width if ci is not None else 0.0,
        repeats=output_tps,
        ciLow=ci.lo if ci is not None else 0.0,
        ciHigh=ci.hi if ci is not None else 0.0,
        ttftP95Repeats=[percentile(p.ttft_s, 95) * 1e3 for p in passes],
        itlP95Repeats=[percentile(p.itl_s, 95) * 1e3 for p in passes],
        warmupPasses=len(warmup),
        warmupRepeats=list(warmup),
        shape=shape,
    )
