#!/usr/bin/env python
"""Batch-1 GEMV bandwidth on the decode step's shapes: cuBLAS against Triton tile configurations,
and what programmatic dependent launch (PDL) saves between back-to-back kernels.

The decode step at batch 1 is a chain of matrix-vector products, each bound by reading its weight
once. This measures, for each projection shape of llama-8b and llama-1b (q/k/v fused, o,
gate/up fused, down, the head):
- ``cublas``: ``F.linear`` of one row (what ``gemv = "cublas"`` runs);
- ``triton``: the reference build's Triton GEMV kernel structure (``kernels._gemv_kernel``
  without a prologue) over a grid of (BLOCK_N, BLOCK_K, num_warps, num_stages), the best kept;
- ``pdl``: a chain of square GEMVs, each reading the previous one's output, launched plain and
  with PDL (``launch_pdl=True``; each program waits on ``griddepcontrol.wait`` after it has
  issued its first weight loads, so the next kernel's launch and weight reads overlap the
  previous kernel's tail).

Every timing is a CUDA graph of ``--chain`` launches replayed ``--replays`` times (CUDA events),
so launch overhead from the host is excluded and what is left is device time plus the gaps a
graph still has. A chain cycles through distinct copies of the weight, more than the 50 MB L2
holds, so every GEMV reads its weight from HBM, as in a decode step. Bandwidth = weight bytes / time per GEMV. The copy bandwidth of a 1 GiB
device-to-device copy is measured in the same run for scale.

Run on the GPU from the source tree: ``PYTHONPATH=operator:engine_image python bench/gemv.py
--json --out bench/results/gemv-h200-<date>.json``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

SHAPES = {  # (N, K) of each batch-1 projection
    "llama-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336), "head": (128256, 4096)},
    "llama-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192), "head": (128256, 2048)},
}  # fmt: skip


@triton.jit
def gemv_kernel(
    x_ptr, w_ptr, out_ptr, N, K,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        w = tl.load(
            w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0
        )
        xv = tl.load(x_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * xv[None, :]
    tl.store(out_ptr + offs_n, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=mask_n)


L2_SPAN = 256 << 20
"""Bytes of distinct weights a timed chain cycles through: several times the H200's 50 MB L2."""


class Rotation:
    """A call that takes the next of ``items`` each time (a chain of GEMVs over distinct weights)."""

    def __init__(self, fn: Callable[[Any], None], items: list[Any]) -> None:
        self.fn, self.items, self.i = fn, items, 0

    def __call__(self) -> None:
        self.fn(self.items[self.i % len(self.items)])
        self.i += 1


def launch(
    kernel: Any,
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    cfg: tuple[int, int, int, int],
    pdl: bool = False,
) -> None:
    """One GEMV ``out = x @ w.T`` with the tile configuration ``cfg`` = (BLOCK_N, BLOCK_K, warps, stages)."""
    block_n, block_k, warps, stages = cfg
    n, k = w.shape
    grid = ((n + block_n - 1) // block_n,)
    kernel[grid](x, w, out, n, k, BLOCK_N=block_n, BLOCK_K=block_k, NUM_STAGES=stages, PDL=pdl, num_warps=warps,
                 **({"launch_pdl": True} if pdl else {}))  # fmt: skip


def launch_chain(
    kernel: Any, ws: list[torch.Tensor], bufs: list[torch.Tensor], cfg: tuple[int, int, int, int], pdl: bool
) -> None:
    """GEMVs in a chain: the i-th reads ``bufs[i]`` (the previous one's output) and writes ``bufs[i + 1]``."""
    for i, w in enumerate(ws):
        launch(kernel, bufs[i], w, bufs[i + 1], cfg, pdl)


def graph_time(fn: Callable[[], None], chain: int, replays: int) -> float:
    """Seconds per call of ``fn``: a CUDA graph of ``chain`` calls, replayed ``replays`` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(chain):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / (replays * chain))
    return best


def copy_bandwidth() -> float:
    """Bytes per second moved (read + written) by a 1 GiB device-to-device copy, as
    ``hot_vs_cold.copy_bandwidth`` counts them, after a second of copies to raise the clocks."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    until = time.monotonic() + 1.0
    while time.monotonic() < until:
        b.copy_(a)
        torch.cuda.synchronize()
    seconds = graph_time(lambda: b.copy_(a), 4, 10)
    return 2 * a.numel() / seconds


def configs() -> list[tuple[int, int, int, int]]:
    out = []
    for block_n, tile, warps, stages in itertools.product(
        (1, 2, 4, 8, 16, 32), (2048, 4096, 8192, 16384), (4, 8), (1, 2, 3)
    ):
        block_k = tile // block_n
        if 64 <= block_k <= 4096:
            out.append((block_n, block_k, warps, stages))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-8b,llama-1b")
    parser.add_argument("--chain", type=int, default=8)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--out", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/gemv.py needs a CUDA device.", file=sys.stderr)
        return 2
    started = time.monotonic()
    kernel = gemv_kernel
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    for model in args.models.split(","):
        for name, (n, k) in SHAPES[model].items():
            # Distinct copies of the weight, cycled through, so that a chain reads more than L2 holds
            # (50 MB on an H200): each GEMV reads its weight from HBM, as in a decode step.
            copies = max(1, -(-L2_SPAN // (n * k * 2)))
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
            w = ws[0]
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, w).float()
            nbytes = w.numel() * w.element_size()
            chain = max(args.chain, copies)
            t = graph_time(
                Rotation(lambda w, x=x, out=out: torch.mm(x, w.t(), out=out), ws), chain, args.replays
            )
            rows.append(
                {
                    "model": model,
                    "shape": name,
                    "N": n,
                    "K": k,
                    "engine": "cublas",
                    "us": t * 1e6,
                    "TBps": nbytes / t / 1e12,
                }
            )
            tried = []
            for block_n, block_k, warps, stages in configs():
                if time.monotonic() - started > args.budget_s:
                    break

                call = functools.partial(launch, kernel, x, out=out, cfg=(block_n, block_k, warps, stages))

                try:
                    call(w=w)
                    err = (out.float() - ref).abs().max().item()
                    t = graph_time(Rotation(lambda w, call=call: call(w=w), ws), chain, args.replays)
                except Exception as e:  # a config that does not compile or fit
                    tried.append({"config": [block_n, block_k, warps, stages], "error": str(e)[:120]})
                    continue
                tried.append({"config": [block_n, block_k, warps, stages], "us": t * 1e6, "err": err})
            ok = [r for r in tried if "us" in r]
            ok.sort(key=lambda r: r["us"])
            if ok:
                best = ok[0]
                rows.append({"model": model, "shape": name, "N": n, "K": k, "engine": "triton", "us": best["us"],
                             "TBps": nbytes / best["us"] * 1e-6, "config": best["config"], "max_abs_err": best["err"],
                             "top5": ok[:5], "tried": len(tried)})  # fmt: skip
            for r in rows[-2:]:
                print(json.dumps({k2: v for k2, v in r.items() if k2 != "top5"}), flush=True)
    # PDL: a chain of square GEMVs, each reading the previous output (o-proj shapes).
    pdl_rows = []
    for model in args.models.split(","):
        n, k = SHAPES[model]["o"]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(8)]
        bufs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(9)]
        best_cfg = next(
            (
                r["config"]
                for r in rows
                if r["model"] == model and r["shape"] == "o" and r["engine"] == "triton"
            ),
            [4, 1024, 4, 2],
        )
        bn, bk, nw, ns = best_cfg
        for pdl in (False, True):
            chain = functools.partial(launch_chain, kernel, ws, bufs, (bn, bk, nw, ns), pdl)

            try:
                t = graph_time(chain, 2, args.replays) / len(ws)
                pdl_rows.append(
                    {
                        "model": model,
                        "pdl": pdl,
                        "us_per_gemv": t * 1e6,
                        "TBps": ws[0].numel() * 2 / t / 1e12,
                        "config": best_cfg,
                    }
                )
            except Exception as e:
                pdl_rows.append({"model": model, "pdl": pdl, "error": str(e)[:300]})
            print(json.dumps(pdl_rows[-1]), flush=True)
    doc = {
        "benchmark": "gemv",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        },
        "copy_bandwidth_TBps": bandwidth / 1e12,
        "rows": rows,
        "pdl": pdl_rows,
        "seconds": time.monotonic() - started,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
