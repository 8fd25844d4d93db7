"""How each experiment benchmarks: ``BenchSettings``.

The parent of a supervised worker (``supervisor.Supervisor``) builds them and sends them to the
worker; nothing here imports torch, so a process that only supervises (``polymorph compile``,
the sandbox's engine) never loads it. ``run.measure_policy`` and ``run.timed_by_cpu`` apply them
to a device, in the worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from polymorph.contract.workload import Workload

__all__ = ["BenchSettings"]


@dataclass(frozen=True)
class BenchSettings:
    """How each experiment benchmarks (see ``measure``; ``run.measure_policy`` and
    ``run.timed_by_cpu`` read it for a device): warm-up, repeats, the CI target and the prompt seed.

    ``repeats`` and ``warmup`` are minimums: warm-up continues until two passes agree within
    ``warmup_tolerance`` (at most ``max_warmup`` passes), and measuring until the CI half-width
    reaches ``target_half_width`` (None: 2% on an accelerator, 4% on a CPU), at most
    ``max_repeats`` passes (pairs) and no new one after ``time_cap_s`` seconds of measuring
    (None: 2 s on a CPU, 10 s on an accelerator).
    ``max_repeats == repeats`` gives a fixed number of passes (two pairs at least when paired:
    ``measure.MIN_PAIRS``).

    ``clock``: what times a pass. ``auto`` is the worker process's CPU time on a CPU device and
    wall time (every step ends with a device sync) on an accelerator. On a shared CPU, wall time
    charges a build for other tenants' time slices: under a load of 4 on 2 cores, wall-clock
    pair ratios of two fixed builds spread over 0.65-1.80 (p10-p90), CPU-time ratios over
    0.94-1.28. CPU time counts every thread of the process, so parallelism cannot fake a win; a
    candidate that waits instead of computing is judged by wall time (``measure.waits_more``).

    ``cache_slots`` and ``cache_len``: the shape every KV cache of the benchmark is allocated at,
    the one the build will serve at (a deployment's engine ``--max-batch`` and its
    ``model.maxSeqLen``); never less than the workload's concurrency and longest request, which
    None gives. A build whose step costs by its cache's shape is measured as it will serve: one
    that attends a static cache under a mask pays for its length, and one that pads every decode
    to the cache's batch (``capture_buckets = max``) pays for its slots. (A build measured
    1.19x [1.07, 1.33] at one slot decoded at 0.83-1.06x of the stable build when served with two.)

    ``method``: what a pass is. ``replay`` runs every request of the workload through the
    scheduler; ``sampled`` times the few steps ``polymorph.contract.steps.plan`` picks from the
    whole workload and lays out the rest with their costs (``experiment.sampled``), so a pass
    costs about a replay of the toy shape whatever the workload's size. ``auto``: sampled on an
    accelerator, where the workload is measured at its true lengths and concurrency, replay on a
    CPU, where it is scaled down (``scaled`` says how, for the record).
    """

    repeats: int = 5
    warmup: int = 1
    seed: int = 0
    target_half_width: float | None = None
    max_repeats: int = 40
    time_cap_s: float | None = None
    max_warmup: int = 6
    warmup_tolerance: float = 0.05
    clock: Literal["auto", "wall", "cpu"] = "auto"
    cache_slots: int | None = None
    cache_len: int | None = None
    method: Literal["auto", "replay", "sampled"] = "auto"
    scaled: str = ""

    def sampled_on(self, device_type: str) -> bool:
        """Whether passes are sampled steps (``auto``: on accelerators) rather than full replays."""
        return self.method == "sampled" or (self.method == "auto" and device_type != "cpu")

    def cache_shape(self, workload: Workload) -> tuple[int, int]:
        """(slots, sequence length) of every cache a benchmark of ``workload`` allocates."""
        return (
            max(self.cache_slots or 0, workload.concurrency),
            max(self.cache_len or 0, workload.max_tokens),
        )
