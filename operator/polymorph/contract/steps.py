"""A workload's steps through the scheduler, and the plan that samples them.

A replay (``polymorph_engine.experiment.bench.replay``) runs every request of a workload through
the engine's continuous-batching scheduler: each step prefills the requests it admits (one
token each) and decodes one token for every request that was already running. With no early
stop, the steps a workload takes depend only on its request shapes, its concurrency and, for a
trace whose requests arrive over time, on how long each step lasts. So a pass of the whole
workload can be *simulated*: given the seconds of a prefill of ``S`` prompt tokens and of a
decode step of ``B`` rows, ``simulate`` lays out every step, and from the timeline reads what a
replay reports: busy seconds, and each request's TTFT and inter-token latencies.

The sampled-steps estimate rests on that. ``plan`` picks, once per workload, the few shapes
whose timings determine the rest:

- prefill lengths: quantiles of the workload's prompt lengths (``PREFILL_QUANTILES``), so
  TTFT's tail (the longest prompts) is measured, not extrapolated far;
- decode anchors: batch occupancies (the smallest, the largest and weighted quantiles between,
  at most ``MAX_ANCHORS``), each with the mean context of the steps that run at it, so decode
  is timed at the real batch and the real context positions;
- one cache state that serves every anchor: a slot per row of the largest batch, each at a
  context position (``homes``). An anchor decodes a window of those slots whose mean context
  is its own. The state's total context is the mean of the full-batch steps', so a decode cost
  linear in the attended positions (as every attention is) averages out exactly.

A pass times each sampled shape once on the build; ``timings_model`` turns those seconds into
cost functions (piecewise linear in ``S`` and in ``B``), and ``simulate`` gives the pass's
figures. It knows nothing about torch or builds.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from polymorph.contract.workload import Workload

__all__ = [
    "HEADROOM",
    "MAX_ANCHORS",
    "PREFILL_QUANTILES",
    "Anchor",
    "DecodeCost",
    "Plan",
    "Timeline",
    "piecewise",
    "plan",
    "simulate",
]

PREFILL_QUANTILES = (0.05, 0.35, 0.7, 0.95)
"""Quantiles of the prompt lengths whose prefill each pass times."""
MAX_ANCHORS = 4
"""Batch occupancies whose decode step each pass times, at most."""
HEADROOM = 512
"""Positions a state slot keeps free, at most, for the decode steps that advance it between
refills (an eighth of a slot's positions when that is less)."""


@dataclass
class Timeline:
    """What one simulated pass of a workload gives: as ``bench.PassResult`` reports a replay."""

    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    decode_steps: list[tuple[int, int]] = field(default_factory=list)
    """(rows, summed context positions) of every step that decoded."""
    prefill_lengths: list[int] = field(default_factory=list)
    decode_contexts: list[tuple[int, ...]] = field(default_factory=list)
    """Per-row context positions of every decode step (``simulate(keep_contexts=True)`` only)."""


PrefillCost = Callable[[int], float]
DecodeCost = Callable[[int, int], float]


def simulate(
    workload: Workload,
    prefill_s: PrefillCost,
    decode_s: DecodeCost,
    slots: int | None = None,
    *,
    keep_contexts: bool = False,
) -> Timeline:
    """Lay out every step of one pass of ``workload`` as the scheduler runs it, with these costs.

    ``prefill_s(S)``: seconds of a prefill of ``S`` tokens (its first token sampled);
    ``decode_s(B, C)``: seconds of a decode step of ``B`` rows attending ``C`` positions in all.
    ``slots``: the scheduler's batch (default the workload's concurrency). Mirrors ``replay``:
    a request is admitted once the pass clock reaches its arrival, FIFO into free slots; idle
    time before the next arrival is skipped, not counted; a token's time is the end of its step.
    ``keep_contexts``: also keep each decode step's per-row context positions.
    """
    requests = workload.requests
    batch = slots or workload.concurrency
    pending = deque(sorted(range(len(requests)), key=lambda i: requests[i].arrival_s))
    waiting: deque[int] = deque()
    running: list[int] = []  # request indices, in admission order
    produced = [0] * len(requests)
    last = [0.0] * len(requests)
    out = Timeline(0.0, sum(r.input_tokens for r in requests), 0)
    now = busy = 0.0
    while pending or waiting or running:
        while pending and requests[pending[0]].arrival_s <= now:
            waiting.append(pending.popleft())
        if not waiting and not running:
            now = requests[pending[0]].arrival_s  # idle: jump to the next arrival
            continue
        previously = list(running)
        admitted: list[int] = []
        while waiting and len(running) < batch:
            admitted.append(waiting.popleft())
            running.append(admitted[-1])
        seconds = 0.0
        for i in admitted:
            seconds += prefill_s(requests[i].input_tokens)
            out.prefill_lengths.append(requests[i].input_tokens)
        if previously:
            contexts = [requests[i].input_tokens + produced[i] - 1 for i in previously]
            seconds += decode_s(len(contexts), sum(contexts))
            out.decode_steps.append((len(contexts), sum(contexts)))
            if keep_contexts:
                out.decode_contexts.append(tuple(contexts))
        now += seconds
        busy += seconds
        for i in admitted:
            out.ttft_s.append(now - requests[i].arrival_s)
        for i in previously:
            out.itl_s.append(now - last[i])
        for i in admitted + previously:
            produced[i] += 1
            last[i] = now
            out.output_tokens += 1
            if produced[i] >= requests[i].output_tokens:
                running.remove(i)
    out.duration_s = busy
    return out


def piecewise(points: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """Linear interpolation through ``points`` (x, y), extended linearly past both ends, never below
    a tenth of the nearest end's y (a cost is positive)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("piecewise needs at least one point")
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    if len(pts) == 1:
        return lambda x: ys[0]

    def f(x: float) -> float:
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        y = y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1
        floor = 0.1 * (ys[0] if x <= xs[0] else ys[-1] if x >= xs[-1] else min(y0, y1))
        return max(y, floor)

    return f


@dataclass(frozen=True)
class Anchor:
    """A decode shape each pass times: ``rows`` slots of the state, from ``first`` on (sorted by home)."""

    rows: int
    first: int
    mean_context: float
    """The mean context of the workload's steps at this occupancy (the window's is the nearest)."""


@dataclass(frozen=True)
class Plan:
    """What a sampled pass times, and the state it times decode on (see the module docstring)."""

    prefill_lengths: tuple[int, ...]
    homes: tuple[int, ...]
    """Context position of each state slot (slot ``i`` holds ``homes[i]`` tokens), ascending."""
    anchors: tuple[Anchor, ...]
    decode_steps: int
    """Decode steps in one pass of the whole workload (for the record)."""

    def describe(self) -> str:
        rows = ", ".join(str(a.rows) for a in self.anchors) or "none"
        lengths = ", ".join(str(s) for s in self.prefill_lengths)
        return (
            f"sampled steps: prefill at {lengths} tokens; decode at {rows} rows "
            f"on {len(self.homes)} slots holding {min(self.homes, default=0)}-{max(self.homes, default=0)} positions"
        )


def _nominal_prefill(tokens: int) -> float:
    return 1e-3 + 1e-5 * tokens


def _nominal_decode(rows: int, context: int) -> float:
    return 1e-2 + 1e-4 * rows + 1e-7 * context


def _quantile(values: Sequence[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def plan(workload: Workload, slots: int | None = None, max_seq_len: int | None = None) -> Plan:
    """The sampled shapes for ``workload`` served with ``slots`` (its concurrency by default);
    ``max_seq_len``: the positions a cache slot holds (default the longest request's)."""
    timeline = simulate(workload, _nominal_prefill, _nominal_decode, slots, keep_contexts=True)
    prompts = [r.input_tokens for r in workload.requests]
    lengths = tuple(sorted({_quantile(prompts, q) for q in PREFILL_QUANTILES}))
    steps = timeline.decode_steps
    if not steps:
        return Plan(lengths, (), (), 0)
    by_rows: dict[int, list[int]] = {}
    for rows, context in steps:
        by_rows.setdefault(rows, []).append(context)
    full = max(by_rows)
    # The state: the full-batch step whose contexts total nearest their mean, shifted to that mean.
    mean_total = statistics.fmean(by_rows[full])
    spread = min(
        (c for c in timeline.decode_contexts if len(c) == full), key=lambda c: abs(sum(c) - mean_total)
    )
    shift = (mean_total - sum(spread)) / full
    positions = max_seq_len or workload.max_tokens
    limit = max(1, positions - min(HEADROOM, positions // 8))
    homes = tuple(sorted(min(limit, max(1, round(c + shift))) for c in spread))
    occupancy = sorted(rows for rows, _ in steps)
    chosen = sorted({occupancy[0], occupancy[-1], *(_quantile(occupancy, q) for q in (1 / 3, 2 / 3))})
    while len(chosen) > MAX_ANCHORS:
        chosen.pop(1)
    anchors = tuple(_anchor(homes, rows, statistics.fmean(by_rows[rows]) / rows) for rows in chosen)
    return Plan(lengths, homes, anchors, len(steps))


def _anchor(homes: tuple[int, ...], rows: int, mean_context: float) -> Anchor:
    """The window of ``rows`` consecutive slots whose mean home is nearest ``mean_context``."""
    best = min(
        range(len(homes) - rows + 1),
        key=lambda first: abs(statistics.fmean(homes[first : first + rows]) - mean_context),
    )
    return Anchor(rows, best, mean_context)
