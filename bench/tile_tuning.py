#!/usr/bin/env python
"""What the first call of the reference build's tuned Triton GEMV costs, with its tiles compiled
one by one and all at once (``gemv_kernels.compiling_ahead``).

A campaign pays this once per Triton cache: the first experiment that selects ``gemv = "triton"``
tunes every decode signature of the model (each candidate tile compiled, then timed). This
times that first call for llama-8b's batch-1 signatures (the fused step's projections: q/k/v
with the RMSNorm prologue, o with the residual, gate/up with the RMSNorm, down with SwiGLU and
the residual, the head with the RMSNorm), each mode in a fresh process on an empty Triton cache,
and checks each call's output against ``torch`` in float32.

Run on the GPU from the source tree: ``PYTHONPATH=operator:engine_image python bench/tile_tuning.py
--out bench/results/tile-tuning-h200-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MODES = ("one-by-one", "ahead")
HIDDEN, INTER, QKV, VOCAB = 4096, 14336, 6144, 128256  # llama-8b


def _child(mode: str) -> dict[str, Any]:
    """Tune every signature once in this (fresh) process; seconds per signature and the errors."""
    import torch

    from polymorph_engine.builds.reference import gemv_kernels as g

    if mode == "one-by-one":
        g._gemv_tuned.early_config_prune = g.fitting_configs("K")
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dt) * 0.02

    norm = torch.ones(HIDDEN, device=dev, dtype=dt)
    x, res = rand(1, HIDDEN), rand(1, HIDDEN)
    signatures = {
        "qkv+norm": (x, rand(QKV, HIDDEN), {"norm_weight": norm}),
        "o+residual": (x, rand(HIDDEN, HIDDEN), {"res": res}),
        "gate_up+norm": (x, rand(2 * INTER, HIDDEN), {"norm_weight": norm}),
        "down+silu+residual": (rand(1, 2 * INTER), rand(HIDDEN, INTER), {"silu_mul": True, "res": res}),
        "head+norm": (x, rand(VOCAB, HIDDEN), {"norm_weight": norm}),
    }
    seconds: dict[str, float] = {}
    errors: dict[str, float] = {}
    for name, (inp, w, kw) in signatures.items():
        out = torch.empty(1, w.shape[0], device=dev, dtype=dt)
        torch.cuda.synchronize()
        started = time.perf_counter()
        g.gemv(inp, w, out, **kw)
        torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - started
        a = inp.float()
        if kw.get("silu_mul"):
            a = torch.nn.functional.silu(a[:, :INTER]) * a[:, INTER:]
        if "norm_weight" in kw:
            a = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.float()
        want = a @ w.float().T + (res.float() if "res" in kw else 0.0)
        errors[name] = float((out.float() - want).abs().max())
    return {"seconds": seconds, "total": sum(seconds.values()), "maxAbsError": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    import torch
    import triton

    if not torch.cuda.is_available():
        raise SystemExit("bench/tile_tuning.py needs a CUDA device (it tunes Triton kernels on one).")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise SystemExit(f"--out {args.out}: its directory does not exist")
    results: dict[str, Any] = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix="tile-tuning-") as cache:
            env = os.environ | {"TRITON_CACHE_DIR": cache}
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise SystemExit(f"bench/tile_tuning.py: the {mode} run failed: {last}")
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{mode}: {results[mode]['total']:.1f} s", file=sys.stderr)
    doc = {
        "benchmark": "tile-tuning",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "device": torch.cuda.get_device_name(0),
        "cpus": os.cpu_count(),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        },
        "model": "llama-8b",
        "modes": results,
        "speedup": results["one-by-one"]["total"] / results["ahead"]["total"],
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
