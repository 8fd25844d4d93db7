"""The Triton GEMV of the fused decode step (``kernels = "triton"``, ``gemv = "triton"``).

``gemv``: ``out[b] = act(x[b]) @ W.T (+ bias) (+ res[b])`` (batch-1 decode is a matrix-vector
product, bound by reading W once). ``act`` is the identity, an RMSNorm of x (the layer's input
norm fused in: each program recomputes the row's norm, x is tiny and sits in L2), or SwiGLU's
``silu(gate) * up`` over x = [gate | up]. A program computes BLOCK_N outputs of one row; the
fused step uses it for one row only (``fused_ops.GEMV_MAX_ROWS``).

The tile is tuned per signature on CUDA (``triton.autotune`` over ``gemv_configs``, timed with L2
flushed: each candidate reads its weight from HBM, as in a decode step); under the interpreter
``gemv_blocks`` picks it. Its pure-PyTorch twins are ``TorchOps``'s projections in
``fused_ops.py``; ``tests/engine_builds/test_fast_knobs.py`` compares them. Shapes: B = rows,
N = output features, K = input features.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import torch
import triton
import triton.language as tl
import triton.testing
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .kernels import launch_options, sm_count

PROLOGUE_NONE, PROLOGUE_RMSNORM, PROLOGUE_SILU_MUL = 0, 1, 2
TILE_ELEMENTS = 4096  # BLOCK_N * BLOCK_K: 8 KB of bf16 weights per program and loop iteration


@triton.jit
def _gemv_act(x_row, nw_ptr, offs_k, mask_k, K, rstd, PROLOGUE: tl.constexpr):
    """The prologue applied to x[offs_k]: identity, RMSNorm (given rstd) or silu(gate) * up, in float32."""
    act_ty = x_row.dtype.element_ty
    if PROLOGUE == 2:
        g = tl.load(x_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        u = tl.load(x_row + K + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(act_ty).to(tl.float32)  # silu, rounded as F.silu
        xv = (s * u).to(act_ty).to(tl.float32)
    elif PROLOGUE == 1:
        xv = tl.load(x_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        xv = ((xv * rstd).to(act_ty).to(tl.float32) * nw).to(act_ty).to(tl.float32)
    else:
        xv = tl.load(x_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    return xv


@triton.jit(do_not_specialize=["B"])
def _gemv_kernel(
    x_ptr,  # [B, K] (or [B, 2K]: gate | up for SILU_MUL)
    w_ptr,  # [N, K] row-major
    out_ptr,  # [B, N]
    bias_ptr,  # [N] or unused
    res_ptr,  # [B, N] or unused
    nw_ptr,  # [K] norm weight or unused
    B,  # rows: part of the tuning key only (the grid's second axis)
    N,
    K,
    stride_xb,
    stride_ob,
    stride_rb,
    eps,
    PROLOGUE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    act_ty = x_ptr.dtype.element_ty
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    mask_n = offs_n < N
    x_row = x_ptr + b * stride_xb
    # The first weight tile does not depend on the kernels before this one: with PDL it is read
    # while they finish, and only then does the program wait for their outputs (x, res).
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    w_mask = mask_n[:, None] & mask_k[None, :]
    if PDL:
        gdc_launch_dependents()
    w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=w_mask, other=0.0)
    if PDL:
        gdc_wait()
    rstd = 1.0
    if PROLOGUE == 1:
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xo = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_row + xo, mask=xo < K, other=0.0).to(tl.float32)
            ss += xv * xv
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    acc = w.to(tl.float32) * _gemv_act(x_row, nw_ptr, offs_k, mask_k, K, rstd, PROLOGUE)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K]
        mask_k = offs_k < K
        xv = _gemv_act(x_row, nw_ptr, offs_k, mask_k, K, rstd, PROLOGUE)
        w = tl.load(
            w_ptr + offs_n[:, None] * K + offs_k[None, :],
            mask=mask_n[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_K]
        acc += w.to(tl.float32) * xv[None, :]
    out = tl.sum(acc, axis=1)  # [BLOCK_N] float32
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    if HAS_RES:
        # The reference rounds the projection before the residual add.
        out = out.to(act_ty).to(tl.float32)
        out += tl.load(res_ptr + b * stride_rb + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(out_ptr + b * stride_ob + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


# The tiles ``prepare`` chooses from for each GEMV signature (rows, N, K, prologue, bias, residual,
# dtypes): (weight elements per program and iteration, warps, pipeline stages), each at BLOCK_N 2, 4,
# 8 and 16. A sweep of the decode shapes of llama-1b and llama-8b on an H200 (bench/gemv.py) found
# a different best tile for nearly every shape, all of them in this set.
GEMV_TILES = ((2048, 4, 3), (4096, 4, 1), (8192, 4, 1), (16384, 8, 3))
GEMV_BLOCK_N = (2, 4, 8, 16)


def gemv_configs(block_ns: tuple[int, ...] = GEMV_BLOCK_N) -> list[triton.Config]:
    """Every (BLOCK_N, BLOCK_K, warps, stages) of ``GEMV_TILES`` x ``block_ns`` (the MoE kernels
    tune over the same tiles at their own BLOCK_N)."""
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": tile // bn}, num_warps=warps, num_stages=stages)
        for tile, warps, stages in GEMV_TILES
        for bn in block_ns
    ]


def fitting_configs(reduced: str) -> Callable[..., list[triton.Config]]:
    """An ``early_config_prune`` dropping tiles wider than the kernel's reduced dimension (its
    argument named ``reduced``): they would only load masked zeros."""

    def fitting(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
        k = int(named_args[reduced])
        fit = [c for c in configs if c.kwargs["BLOCK_K"] <= max(64, triton.next_power_of_2(k))]
        return fit or configs[:1]

    return fitting


Prune = Callable[..., list[triton.Config]]


@cache
def _compilers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1), thread_name_prefix="triton-compile")


def compiling_ahead(kernel: triton.JITFunction, prune: Prune) -> Prune:
    """``prune`` (an ``early_config_prune``), then every tile it kept compiled at once on a thread
    pool (Triton's ``AsyncCompileMode``), before the autotuner times them one by one: timing a
    tile takes milliseconds, compiling it a quarter of a second, mostly outside the interpreter
    lock. The autotuner then finds each one compiled. Without ``AsyncCompileMode`` (an older
    Triton) the tiles compile one by one as they are timed."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # pragma: no cover - Triton before 3.4
        return prune

    def pruned(configs: list[triton.Config], named_args: dict, **call: object) -> list[triton.Config]:
        kept = prune(configs, named_args, **call)
        if len(kept) > 1:
            launch = {k: v for k, v in call.items() if k != "warmup"}
            with AsyncCompileMode(_compilers()):
                for config in kept:
                    kernel.run(*named_args.values(), warmup=True, **launch, **config.all_kwargs())
        return kept

    return pruned


GEMV_BENCH_MS = (5, 25)
"""(warm-up, measured) milliseconds of ``triton.testing.do_bench`` per candidate tile: it flushes
L2 before every run, so each candidate reads its weight from HBM, as in a decode step."""


def bench_tile(fn: object, quantiles: object) -> object:
    return triton.testing.do_bench(fn, warmup=GEMV_BENCH_MS[0], rep=GEMV_BENCH_MS[1], quantiles=quantiles)


_gemv_tuned = triton.autotune(
    configs=gemv_configs(),
    key=["B", "N", "K", "PROLOGUE", "HAS_BIAS", "HAS_RES"],
    prune_configs_by={"early_config_prune": compiling_ahead(_gemv_kernel, fitting_configs("K"))},
    do_bench=bench_tile,
    # Kept on disk (Triton's cache, keyed by the kernel's source, the device and the signature):
    # a worker restarted after a timeout, or the next campaign on this cache, reads the tile
    # instead of timing every candidate again (18 s of a campaign's screen on llama-8b, H200).
    cache_results=True,
)(_gemv_kernel)


def gemv_blocks(n: int, k: int, rows: int, sms: int, tile: int = TILE_ELEMENTS) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) where no tuning runs (the interpreter): ``tile`` weight elements per
    program and iteration, the fewest rows per program that still leave >= 4 programs per
    multiprocessor (more loads in flight), at most 16."""
    block_n = 16
    while block_n > 1 and triton.cdiv(n, block_n) * rows < 4 * sms:
        block_n //= 2
    block_k = min(tile // block_n, triton.next_power_of_2(k))
    return block_n, max(block_k, 16)


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    res: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    silu_mul: bool = False,
    pdl: bool = False,
    blocks: tuple[int, int] | None = None,
) -> torch.Tensor:
    """out [B, N] = act(x) @ w.T (+ bias) (+ res). x [B, K] ([B, 2K] with ``silu_mul``), w [N, K].

    On CUDA the tile is tuned per signature at its first call (``_gemv_tuned``; the fused step
    makes that call in prepare, outside its graph) and kept for the process; under the
    interpreter it comes from ``gemv_blocks``. ``blocks``: a fixed (BLOCK_N, BLOCK_K) instead, untuned
    (4 warps). ``pdl``: launched as a programmatic dependent."""
    n, k = w.shape
    rows = x.shape[0]
    assert w.is_contiguous() and x.stride(-1) == 1 and out.stride(-1) == 1
    assert x.shape[1] == (2 * k if silu_mul else k), (x.shape, w.shape)
    prologue = PROLOGUE_SILU_MUL if silu_mul else (PROLOGUE_RMSNORM if norm_weight is not None else 0)
    args = (
        x,
        w,
        out,
        bias if bias is not None else w,
        res if res is not None else w,
        norm_weight if norm_weight is not None else w,
        rows,
        n,
        k,
        x.stride(0),
        out.stride(0),
        res.stride(0) if res is not None else 0,
        eps,
    )
    flags = {
        "PROLOGUE": prologue,
        "HAS_BIAS": bias is not None,
        "HAS_RES": res is not None,
        "PDL": pdl,
        **launch_options(pdl),
    }
    if blocks is not None or x.device.type != "cuda":
        block_n, block_k = blocks or gemv_blocks(n, k, rows, sm_count(x.device))
        _gemv_kernel[(triton.cdiv(n, block_n), rows)](*args, **flags, BLOCK_N=block_n, BLOCK_K=block_k)
        return out
    _gemv_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), rows)](*args, **flags)
    return out
