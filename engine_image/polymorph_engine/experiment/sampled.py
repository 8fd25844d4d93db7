"""The sampled-steps pass: a workload's figures from a few timed steps, at its real shape.

A full replay of a workload at its true lengths and concurrency takes seconds to minutes on a
large model; an experiment has a second or two. ``SampledPass`` times, on one build, the shapes
``polymorph.contract.steps.plan`` picked for the workload (prefills at quantiles of its prompt
lengths, decode steps at its batch occupancies and context positions, on a cache of the shape
serving allocates), fits cost functions to them, and lays out every step of the whole workload
with those costs (``steps.simulate``). The result is a ``bench.PassResult`` like a replay's: its
busy seconds, token counts, each request's TTFT and every inter-token gap. So the measurement
protocol (warm-up, adaptive passes, ABBA pairing) runs on it unchanged.

What it keeps between passes: the cache (the build prepares it once, as a server does) and the
decode state on it: slot ``i`` holds ``plan.homes[i]`` positions, refilled (untimed) when the
decode steps of a measurement have advanced it by more than ``drift`` (a tenth of its home). A prefill sample goes into
a spare slot when the cache has one, else into the state's shortest slot, which is then refilled.
Timed work ends with the token read back to the host, as the scheduler's steps do.

It knows nothing about verification, pairing or processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from polymorph.contract.steps import DecodeCost, Plan, piecewise, simulate
from polymorph.contract.workload import Workload
from polymorph_engine.experiment.bench import PassResult
from polymorph_engine.runtime.hotpath import HotPath

__all__ = ["DECODE_STEPS", "SampledPass"]

DECODE_STEPS = 2
"""Decode steps timed at each anchor in one pass (their mean is the anchor's step time)."""


MARGIN = 16
"""Positions one pass may advance a state slot, at most: one step per anchor holding it and a probe."""


def drift(home: int, positions: int) -> int:
    """Positions a state slot may advance past its home before it is refilled: a tenth of it (the
    one-row probes correct the decode cost for the positions it moved), within its cache slot.
    Refilling is a prefill of the whole home, untimed but not free: at 4k positions and 32 slots,
    a refill every few passes was most of a measurement."""
    return max(0, min(max(4, home // 10), positions - MARGIN - home))


class SampledPass:
    """One build's sampled passes of ``workload`` (see the module docstring); call it for a pass."""

    def __init__(
        self,
        hotpath: HotPath,
        workload: Workload,
        plan: Plan,
        shape: tuple[int, int],
        *,
        vocab_size: int,
        device: torch.device | str = "cpu",
        clock: Callable[[], float] = time.perf_counter,
        seed: int = 0,
    ) -> None:
        self.hotpath = hotpath
        self.workload = workload
        self.plan = plan
        self.shape = shape
        self.device = torch.device(device)
        self.clock = clock
        self.rng = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.cache: Any = None
        self.lengths = [0] * shape[0]
        self.last = [0] * shape[0]
        self.spare = len(plan.homes) if len(plan.homes) < shape[0] else None
        self.fill_s = 0.0
        """Wall seconds spent refilling the decode state so far (untimed work of the passes)."""
        self.layout_s = 0.0
        """Wall seconds spent laying out the workload with the timed costs so far (host work)."""

    def _prompt(self, n: int) -> torch.Tensor:
        return torch.randint(self.vocab_size, (n,), generator=self.rng, dtype=torch.int64)

    def _prefill(self, slot: int, n: int) -> float:
        """Fill ``slot`` with a prompt of ``n`` tokens; the seconds it took, first token read back."""
        if self.lengths[slot]:
            self.hotpath.free(self.cache, slot)
            self.lengths[slot] = 0
        prompt = self._prompt(n)
        started = self.clock()
        prompt = prompt.to(self.device)
        logits = self.hotpath.prefill(self.cache, slot, prompt)
        token = int(self.hotpath.sample(logits.unsqueeze(0))[0].item())
        seconds = self.clock() - started
        self.lengths[slot], self.last[slot] = n, token
        return seconds

    def _settle(self) -> None:
        """Refill every state slot that is empty or has drifted off its home (untimed, counted in ``fill_s``)."""
        for slot, home in enumerate(self.plan.homes):
            if not home <= self.lengths[slot] <= home + drift(home, self.shape[1]):
                started = time.perf_counter()
                self._prefill(slot, home)
                self.fill_s += time.perf_counter() - started

    def _decode(self, chosen: list[int], steps: int = DECODE_STEPS) -> tuple[float, float]:
        """Mean seconds of ``steps`` decode steps over ``chosen`` slots, and their mean context then.

        Each step builds its slot and token tensors from host lists, as the scheduler's does."""
        context = sum(self.lengths[s] for s in chosen) / len(chosen)
        started = self.clock()
        for _ in range(steps):
            slots = torch.tensor(chosen, dtype=torch.int64)
            tokens = torch.tensor([self.last[s] for s in chosen], dtype=torch.int64, device=self.device)
            logits = self.hotpath.decode(self.cache, slots, tokens)
            values: list[int] = self.hotpath.sample(logits).tolist()  # one device sync per step
            for s, token in zip(chosen, values, strict=True):
                self.lengths[s] += 1
                self.last[s] = int(token)
        return (self.clock() - started) / steps, context + (steps - 1) / 2

    def __call__(self) -> PassResult:
        wall = time.perf_counter()
        if self.cache is None:
            self.cache = self.hotpath.new_cache(*self.shape)
        self._settle()
        prefills: list[tuple[float, float]] = []
        probes: list[tuple[float, float]] = []  # (context, seconds) of one-row decode steps
        for n in self.plan.prefill_lengths:
            slot = self.spare if self.spare is not None else 0
            prefills.append((n, self._prefill(slot, n)))
        if self.plan.prefill_lengths:  # the sample slot holds the longest prompt: a context probe
            seconds, context = self._decode([slot], 1)
            probes.append((context, seconds))
            if self.spare is not None:
                self.hotpath.free(self.cache, slot)
                self.lengths[slot] = 0
        self._settle()
        homes = self.plan.homes
        for slot in sorted({0, len(homes) - 1}) if homes else ():
            seconds, context = self._decode([slot], 1)
            probes.append((context, seconds))
        anchors = [(a.rows, *self._decode(list(range(a.first, a.first + a.rows)))) for a in self.plan.anchors]
        started = time.perf_counter()
        timeline = simulate(self.workload, piecewise(prefills), _decode_cost(anchors, probes))
        self.layout_s += time.perf_counter() - started
        return PassResult(
            duration_s=timeline.duration_s,
            input_tokens=timeline.input_tokens,
            output_tokens=timeline.output_tokens,
            ttft_s=timeline.ttft_s,
            itl_s=timeline.itl_s,
            wall_s=time.perf_counter() - wall,
        )

    def release(self) -> None:
        """Empty every slot this pass filled (the cache itself belongs to the hot path's owner)."""
        if self.cache is not None:
            for slot, length in enumerate(self.lengths):
                if length:
                    self.hotpath.free(self.cache, slot)
            self.lengths = [0] * self.shape[0]


def _decode_cost(anchors: list[tuple[int, float, float]], probes: list[tuple[float, float]]) -> DecodeCost:
    """Seconds of a decode step of ``rows`` rows attending ``context`` positions in all: the anchors'
    (rows, seconds, mean context) at this occupancy, corrected for the context its rows attend
    beyond (or short of) the anchors' by the one-row probes' (context, seconds) cost per position.
    A workload that never decodes (every output one token) has no anchors and no decode cost."""
    if not anchors:
        return lambda _rows, _context: 0.0
    row_s = piecewise(probes) if probes else (lambda _context: 0.0)
    occupancy_s = piecewise([(rows, seconds) for rows, seconds, _ in anchors])
    at_context = piecewise([(rows, context) for rows, _, context in anchors])

    def decode_s(rows: int, context: int) -> float:
        return max(0.0, occupancy_s(rows) + rows * (row_s(context / rows) - row_s(at_context(rows))))

    return decode_s
