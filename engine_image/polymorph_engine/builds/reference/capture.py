"""CUDA-graph capture for the reference build's captured steps (decode_capture, the fused step,
bucketed prefill; see build.toml): the batch buckets a cache prepares, and one capture sequence.

It knows nothing about layers, caches or knobs: it captures whatever step it is handed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def batch_buckets(max_batch: int, policy: str = "pow2") -> list[int]:
    """The batch sizes to prepare, largest first (a shared graph pool is reused downwards):
    ``pow2`` (1, 2, 4, ... and ``max_batch``) or ``max`` (``max_batch`` alone)."""
    if policy == "max":
        return [max_batch]
    sizes, b = {max_batch}, 1
    while b < max_batch:
        sizes.add(b)
        b *= 2
    return sorted(sizes, reverse=True)


def capture(step: Callable[[], T], device: torch.device, pool: Any = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Two warm-up runs of ``step`` on a side stream (compile, JIT and warm the allocator outside
    the graph), then ``step`` captured into a CUDA graph in ``pool``: the graph and the captured
    run's output, which each replay rewrites."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step()
    return graph, out
