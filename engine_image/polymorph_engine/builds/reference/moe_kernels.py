"""Triton kernels of the MoE block (``moe_experts = "triton"``; see moe.py).

``fused_moe``: the (row, expert) pairs sorted by expert, then one launch for every expert's
gate/up projection with SiLU-and-multiply fused in (``_gate_up_kernel``), one launch for every
expert's down projection with the pair's routing weight fused in (``_down_kernel``), and the
combine as one ``index_add_``. Each program computes one pair's BLOCK_N outputs, reading its
expert's weight tile by tile: at decode a GEMV over the selected experts, one launch for all of
them; sorting the pairs by expert keeps the programs that share an expert adjacent, so a weight
tile several rows chose is read from L2. (vLLM's fused_moe also pads each expert's pairs to a
block of rows and runs them as one tiled GEMM, which wins on prompts; this kernel is the
decode-shaped half of that.)

On CUDA, at decode sizes (at most ``TUNED_MAX_PAIRS`` pairs), each kernel's tile is tuned per
signature (``triton.autotune`` over ``moe_configs``, timed with L2 flushed as the dense GEMV's is:
``gemv_kernels.bench_tile``), keyed on the pairs' power-of-two bucket, so a captured step tunes in the
warm-up runs before its capture. On an H200 the fixed 32 x 64 tile read batch-1 qwen3-30b-a3b's
experts at about 1.3 TB/s (``bench/results/decode-qwen3-30b-a3b-h200-2026-12-06.json``); the
candidates include it, so tuning can only keep it or find faster. Larger calls (prompts) and the
interpreter use ``FIXED_BLOCKS``.

Rounding follows the reference: the projections accumulate in float32 and are rounded to the
activation dtype where the reference rounds them. Triton is an optional extra of this build:
this module is imported only when the knob selects it. On CPU it runs only under the triton
interpreter (tests). Shapes: T = rows, P = T * K pairs, H = hidden, I = expert width, E = experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemv_kernels import bench_tile, compiling_ahead, fitting_configs, gemv_configs

FIXED_BLOCKS = (32, 64)
"""(BLOCK_N, BLOCK_K) where no tuning runs: prompts, and the interpreter."""
TUNED_MAX_PAIRS = 256
"""Calls of at most this many (row, expert) pairs (decode: 32 rows at top-8) run a tuned tile."""
MOE_BLOCK_N = (8, 16, 32, 64)


def moe_configs() -> list[triton.Config]:
    """The tiles tuning chooses from: the dense GEMV's (``gemv_configs``) at ``MOE_BLOCK_N`` rows,
    and ``FIXED_BLOCKS`` (4 warps, Triton's default stages)."""
    fixed = triton.Config({"BLOCK_N": FIXED_BLOCKS[0], "BLOCK_K": FIXED_BLOCKS[1]}, num_warps=4)
    return [fixed, *gemv_configs(MOE_BLOCK_N)]


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [T, H]
    w13_ptr,  # [E, 2I, H]
    rows_ptr,  # [P] int64: each sorted pair's row
    experts_ptr,  # [P] int64: each sorted pair's expert
    y_ptr,  # [P, I]: silu(gate) * up
    H,
    W,  # the expert width (I)
    BUCKET,  # the pairs' power-of-two bucket: the tuning key only
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.load(rows_ptr + pair)
    expert = tl.load(experts_ptr + pair)
    w_base = w13_ptr + expert * 2 * W * H
    gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * H + k, mask=k < H, other=0.0).to(tl.float32)
        mask = (n[:, None] < W) & (k[None, :] < H)
        wg = tl.load(w_base + n[:, None] * H + k[None, :], mask=mask, other=0.0).to(tl.float32)
        wu = tl.load(w_base + (W + n[:, None]) * H + k[None, :], mask=mask, other=0.0).to(tl.float32)
        gate += tl.sum(wg * x[None, :], axis=1)
        up += tl.sum(wu * x[None, :], axis=1)
    dtype = y_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)  # rounded where the reference rounds its projections
    up = up.to(dtype).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(y_ptr + pair * W + n, (act * up).to(dtype), mask=n < W)


@triton.jit
def _down_kernel(
    y_ptr,  # [P, I]
    w2_ptr,  # [E, H, I]
    experts_ptr,  # [P] int64
    weights_ptr,  # [P]: each sorted pair's routing weight
    out_ptr,  # [P, H]
    H,
    W,
    BUCKET,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    expert = tl.load(experts_ptr + pair)
    w_base = w2_ptr + expert * H * W
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, W, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        y = tl.load(y_ptr + pair * W + k, mask=k < W, other=0.0).to(tl.float32)
        mask = (n[:, None] < H) & (k[None, :] < W)
        w = tl.load(w_base + n[:, None] * W + k[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(w * y[None, :], axis=1)
    dtype = out_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + pair).to(tl.float32)
    tl.store(out_ptr + pair * H + n, (acc.to(dtype).to(tl.float32) * weight).to(dtype), mask=n < H)


_gate_up_tuned = triton.autotune(
    configs=moe_configs(),
    key=["BUCKET", "H", "W"],
    prune_configs_by={"early_config_prune": compiling_ahead(_gate_up_kernel, fitting_configs("H"))},
    do_bench=bench_tile,
    cache_results=True,  # on disk with Triton's cache, as the dense GEMV's tiles
)(_gate_up_kernel)
_down_tuned = triton.autotune(
    configs=moe_configs(),
    key=["BUCKET", "H", "W"],
    prune_configs_by={"early_config_prune": compiling_ahead(_down_kernel, fitting_configs("W"))},
    do_bench=bench_tile,
    cache_results=True,
)(_down_kernel)


def fused_moe(
    flat: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    chosen: torch.Tensor,
    *,
    blocks: tuple[int, int] | None = None,
) -> torch.Tensor:
    """flat [T, H], w13 [E, 2I, H], w2 [E, H, I], routing weights and chosen experts [T, K] ->
    [T, H]: sum over each row's K experts of weight * down(silu(gate(x)) * up(x)).

    ``blocks``: a fixed (BLOCK_N, BLOCK_K) for both kernels instead (4 warps, untuned)."""
    t, h = flat.shape
    k = chosen.shape[1]
    width = w2.shape[2]
    experts = chosen.reshape(-1)
    order = experts.argsort(stable=True)
    rows, sorted_experts = order // k, experts[order].contiguous()
    pair_weights = weights.reshape(-1)[order].contiguous()
    pairs = t * k
    bucket = triton.next_power_of_2(pairs)
    x, a, b = flat.contiguous(), w13.contiguous(), w2.contiguous()
    y = flat.new_empty(pairs, width)
    out_pairs = flat.new_empty(pairs, h)
    up_args = (x, a, rows, sorted_experts, y, h, width, bucket)
    down_args = (y, b, sorted_experts, pair_weights, out_pairs, h, width, bucket)
    if blocks is None and flat.device.type == "cuda" and pairs <= TUNED_MAX_PAIRS:
        _gate_up_tuned[lambda meta: (pairs, triton.cdiv(width, meta["BLOCK_N"]))](*up_args)
        _down_tuned[lambda meta: (pairs, triton.cdiv(h, meta["BLOCK_N"]))](*down_args)
    else:
        block_n, block_k = blocks or FIXED_BLOCKS
        _gate_up_kernel[(pairs, triton.cdiv(width, block_n))](*up_args, BLOCK_N=block_n, BLOCK_K=block_k)
        _down_kernel[(pairs, triton.cdiv(h, block_n))](*down_args, BLOCK_N=block_n, BLOCK_K=block_k)
    return torch.zeros_like(flat).index_add_(0, rows, out_pairs)
