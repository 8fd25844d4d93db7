#!/usr/bin/env python
"""Batch-1 MoE down projection: one program per output block summing a row's K pairs (the row
kernel, what ``fused_moe`` ran at one row until this measurement) against one program per
(pair, output block) and a sum over the K pairs (``_down_kernel``, then ``sum``: what it runs
now).

At one row the row kernel has H / BLOCK_N programs, each reading K experts' tiles in turn; the
pair kernel has K times as many, each reading one. The batch-1 profile of qwen3-30b-a3b on an
H100 put the row kernel at about 56% of copy bandwidth, and gate/up (one program per pair and
block) at about 92% (``bench/results/decode-qwen3-30b-a3b-h100-2026-12-06.json``). This times
both on qwen3-30b-a3b's expert shapes (tiles tuned as the build tunes them, each kernel
replayed in a CUDA graph over several layers' stacks so its reads miss L2, as in a captured
step; ``gemv.graph_time``, the best of five windows), with gate/up beside them, and checks that
both give the same output. The row kernel is kept here, beside the measurement that retired it.

Run on the GPU from the source tree: ``PYTHONPATH=operator:engine_image python bench/moe_down.py
--out bench/results/moe-down-<device>-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

import triton
import triton.language as tl

from gemv import graph_time  # a script beside this one in bench/: its CUDA-graph timer
from polymorph_engine.builds.reference import moe_kernels as mk
from polymorph_engine.builds.reference.gemv_kernels import bench_tile, compiling_ahead, fitting_configs

EXPERTS, HIDDEN, WIDTH, TOP_K = 128, 2048, 768, 8  # qwen3-30b-a3b
_weighted_down = mk._weighted_down  # a jitted helper the row kernel calls (a global of this module)


@triton.jit
def _down_rows_kernel(
    y_ptr,  # [T * K, I]: row r's pairs at r * K ... r * K + K - 1
    w2_ptr,  # [E, H, I]
    experts_ptr,  # [T * K] int64
    weights_ptr,  # [T * K]: each pair's routing weight
    out_ptr,  # [T, H]
    H,
    W,
    K,
    BUCKET,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One row's BLOCK_N outputs: the sum over its K pairs of weight * down(y), in float32."""
    row = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    dtype = out_ptr.dtype.element_ty
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(0, K):
        total += _weighted_down(
            y_ptr, w2_ptr, experts_ptr, weights_ptr, row * K + j, n, H, W, BLOCK_N, BLOCK_K
        )
    tl.store(out_ptr + row * H + n, total.to(dtype), mask=n < H)


_down_rows_tuned = triton.autotune(
    configs=mk.moe_configs(),
    key=["BUCKET", "H", "W", "K"],
    prune_configs_by={"early_config_prune": compiling_ahead(_down_rows_kernel, fitting_configs("W"))},
    do_bench=bench_tile,
    cache_results=True,
)(_down_rows_kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--layers", type=int, default=8, help="expert stacks cycled through (L2-cold reads)")
    args = parser.parse_args()
    if args.layers < 1:
        raise SystemExit(f"--layers must be a positive integer; got {args.layers}")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/moe_down.py needs a CUDA device (it times Triton kernels on one).")
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    w13 = [torch.randn(EXPERTS, 2 * WIDTH, HIDDEN, device=dev, dtype=dt) * 0.02 for _ in range(args.layers)]
    w2 = [torch.randn(EXPERTS, HIDDEN, WIDTH, device=dev, dtype=dt) * 0.02 for _ in range(args.layers)]
    x = torch.randn(1, HIDDEN, device=dev, dtype=dt)
    experts = torch.randperm(EXPERTS, device=dev)[:TOP_K].to(torch.int64)
    weights = torch.softmax(torch.randn(TOP_K, device=dev), 0).to(dt)
    y = torch.randn(TOP_K, WIDTH, device=dev, dtype=dt)
    bucket = triton.next_power_of_2(TOP_K)
    layer = [0]

    def next_layer() -> int:
        layer[0] = (layer[0] + 1) % args.layers
        return layer[0]

    def gate_up() -> torch.Tensor:
        out = torch.empty(TOP_K, WIDTH, device=dev, dtype=dt)
        grid = lambda meta: (TOP_K, triton.cdiv(WIDTH, meta["BLOCK_N"]))  # noqa: E731
        mk._gate_up_tuned[grid](
            x, w13[next_layer()], experts, experts, out, HIDDEN, WIDTH, TOP_K, bucket, SORTED=False
        )
        return out

    def down_rows() -> torch.Tensor:
        out = torch.empty(1, HIDDEN, device=dev, dtype=dt)
        grid = lambda meta: (1, triton.cdiv(HIDDEN, meta["BLOCK_N"]))  # noqa: E731
        _down_rows_tuned[grid](y, w2[next_layer()], experts, weights, out, HIDDEN, WIDTH, TOP_K, bucket)
        return out

    def down_pairs() -> torch.Tensor:
        pairs = torch.empty(TOP_K, HIDDEN, device=dev, dtype=dt)
        grid = lambda meta: (TOP_K, triton.cdiv(HIDDEN, meta["BLOCK_N"]))  # noqa: E731
        mk._down_tuned[grid](y, w2[next_layer()], experts, weights, pairs, HIDDEN, WIDTH, bucket)
        return pairs.sum(0, keepdim=True)  # in float32, rounded once

    layer[0] = -1
    a = down_rows()
    layer[0] = -1
    b = down_pairs()
    disagreement = (a.float() - b.float()).abs().max().item()
    gbytes = {"gate_up": TOP_K * 2 * WIDTH * HIDDEN * 2 / 1e9, "down": TOP_K * HIDDEN * WIDTH * 2 / 1e9}
    rows: dict[str, dict[str, float]] = {}
    for name, fn, size in (
        ("gate_up", gate_up, gbytes["gate_up"]),
        ("down_rows", down_rows, gbytes["down"]),
        ("down_pairs_summed", down_pairs, gbytes["down"]),
    ):
        us = graph_time(fn, args.layers, replays=50) * 1e6  # a graph of one call per layer's stacks
        rows[name] = {"us": round(us, 2), "gbPerS": round(size / (us / 1e6), 1)}
        print(f"{name:20s} {us:7.2f} us  {size / (us / 1e6):7.1f} GB/s", file=sys.stderr)
    result = {
        "benchmark": "moe-down",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        },
        "shape": {"experts": EXPERTS, "hidden": HIDDEN, "width": WIDTH, "topK": TOP_K, "rows": 1},
        "kernels": rows,
        "maxAbsDifference": disagreement,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
