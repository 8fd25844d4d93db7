"""Triton kernels of the MoE block (``moe_experts = "triton"``; see moe.py).

``fused_moe``: the (row, expert) pairs sorted by expert, then one launch for every expert's
gate/up projection with SiLU-and-multiply fused in (``_gate_up_kernel``), one launch for every
expert's down projection with the pair's routing weight fused in (``_down_kernel``), and the
combine as one ``index_add_``. Each program computes one pair's BLOCK_N outputs, reading its
expert's weight tile by tile: at decode a GEMV over the selected experts, one launch for all of
them; sorting the pairs by expert keeps the programs that share an expert adjacent, so a weight
tile several rows chose is read from L2. (vLLM's fused_moe also pads each expert's pairs to a
block of rows and runs them as one tiled GEMM, which wins on prompts; this kernel is the
decode-shaped half of that, and ``moe.Moe`` runs prompts as ``grouped`` where it can.) One row
(batch-1 decode) has K distinct experts and nothing to share: its pairs stay in row order and
their K outputs are summed, so the step sorts and gathers nothing (on an H200 the routing, the
sort, the gathers and the ``index_add_`` took about 1.5 ms of batch-1 qwen3-30b-a3b's 5.9 ms
step, as small kernels). A kernel summing each row's pairs in its programs (one launch fewer)
had a program per output block alone, too few to read at copy bandwidth: 15.9 us a layer on an
H100 against 13.0 for the pair kernel and the sum (``bench/moe_down.py``).
``route`` (``moe_routing = "fused"``): the top k of the router's logits and their weights in one
launch.

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

from typing import Any

import torch
import triton
import triton.language as tl

from .gemv_kernels import bench_tile, compiling_ahead, fitting_configs, gemv_configs
from .model import pairs_by_expert

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
    rows_ptr,  # [P] int64: each sorted pair's row (unused when the pairs are in row order)
    experts_ptr,  # [P] int64: each pair's expert
    y_ptr,  # [P, I]: silu(gate) * up
    H,
    W,  # the expert width (I)
    K,  # experts per row
    BUCKET,  # the pairs' power-of-two bucket: the tuning key only
    SORTED: tl.constexpr,  # pairs sorted by expert (rows_ptr), or in row order (pair // K)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if SORTED:
        row = tl.load(rows_ptr + pair)
    else:
        row = pair // K
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
def _weighted_down(
    y_ptr,
    w2_ptr,
    experts_ptr,
    weights_ptr,
    pair,
    n,
    H,
    W,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Pair ``pair``'s routing weight times its expert's down projection of y, outputs ``n``,
    each rounded to y's dtype where the reference rounds them (returned in float32)."""
    dtype = y_ptr.dtype.element_ty
    w_base = w2_ptr + tl.load(experts_ptr + pair) * H * W
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, W, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        y = tl.load(y_ptr + pair * W + k, mask=k < W, other=0.0).to(tl.float32)
        mask = (n[:, None] < H) & (k[None, :] < W)
        w = tl.load(w_base + n[:, None] * W + k[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(w * y[None, :], axis=1)
    weight = tl.load(weights_ptr + pair).to(tl.float32)
    return (acc.to(dtype).to(tl.float32) * weight).to(dtype).to(tl.float32)


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
    dtype = out_ptr.dtype.element_ty
    weighted = _weighted_down(y_ptr, w2_ptr, experts_ptr, weights_ptr, pair, n, H, W, BLOCK_N, BLOCK_K)
    tl.store(out_ptr + pair * H + n, weighted.to(dtype), mask=n < H)


@triton.jit
def _route_kernel(
    logits_ptr,  # [T, E] router logits (any float dtype)
    weights_ptr,  # [T, K] out: routing weights (activation dtype)
    chosen_ptr,  # [T, K] out: int64 experts, by descending logit
    E,
    K: tl.constexpr,
    RENORMALISE: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """One row's routing: the top K of its E logits and their weights, the softmax over all E
    restricted to the K (renormalised to sum to 1 when asked), in float32."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + row * E + offs, mask=offs < E, other=float("-inf")).to(tl.float32)
    top = tl.max(logits, axis=0)
    total = tl.sum(tl.where(offs < E, tl.exp(logits - top), 0.0), axis=0)
    left = logits
    picked = tl.zeros([BLOCK_E], dtype=tl.float32)  # exp(logit - top) where chosen, else 0
    rank = tl.full([BLOCK_E], -1, dtype=tl.int32)  # the order each expert was chosen in, else -1
    for j in tl.static_range(K):
        best = tl.max(left, axis=0)
        index = tl.min(tl.where(left == best, offs, BLOCK_E), axis=0)  # the first of a tie
        tl.store(chosen_ptr + row * K + j, index.to(tl.int64))
        picked = tl.where(offs == index, tl.exp(best - top), picked)
        rank = tl.where(offs == index, j, rank)
        left = tl.where(offs == index, float("-inf"), left)
    if RENORMALISE:
        norm = tl.sum(picked, axis=0)
    else:
        norm = total
    for j in tl.static_range(K):
        value = tl.sum(tl.where(rank == j, picked, 0.0), axis=0) / norm
        tl.store(weights_ptr + row * K + j, value.to(weights_ptr.dtype.element_ty))


def route(
    logits: torch.Tensor, k: int, renormalise: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> routing weights [T, K] (``dtype``) and chosen experts [T, K]
    (int64), as ``model.route`` computes them from the logits, in one launch."""
    t, e = logits.shape
    weights = torch.empty(t, k, device=logits.device, dtype=dtype)
    chosen = torch.empty(t, k, device=logits.device, dtype=torch.int64)
    _route_kernel[(t,)](
        logits.contiguous(),
        weights,
        chosen,
        e,
        K=k,
        RENORMALISE=renormalise,
        BLOCK_E=triton.next_power_of_2(e),
    )
    return weights, chosen


_gate_up_tuned = triton.autotune(
    configs=moe_configs(),
    key=["BUCKET", "H", "W", "SORTED"],
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

    One row (batch-1 decode) chooses K distinct experts: its pairs stay in row order and their
    outputs are summed: no sort, no gathers. More rows sort their pairs by expert, so the
    programs of rows that share an expert read its tiles from L2, and combine by ``index_add_``.
    ``blocks``: a fixed (BLOCK_N, BLOCK_K) for both kernels instead (4 warps, untuned)."""
    t, h = flat.shape
    k = chosen.shape[1]
    width = w2.shape[2]
    pairs = t * k
    bucket = triton.next_power_of_2(pairs)
    x, a, b = flat.contiguous(), w13.contiguous(), w2.contiguous()
    y = flat.new_empty(pairs, width)
    tuned = blocks is None and flat.device.type == "cuda" and pairs <= TUNED_MAX_PAIRS
    block_n, block_k = blocks or FIXED_BLOCKS

    def launch(
        kernel: Any, autotuned: Any, programs: int, outputs: int, *args: object, **flags: object
    ) -> None:
        """``programs`` x (``outputs`` / BLOCK_N) programs of ``kernel``, its tile tuned or fixed."""
        if tuned:
            autotuned[lambda meta: (programs, triton.cdiv(outputs, meta["BLOCK_N"]))](*args, **flags)
        else:
            kernel[(programs, triton.cdiv(outputs, block_n))](
                *args, **flags, BLOCK_N=block_n, BLOCK_K=block_k
            )

    in_row_order = t == 1
    if in_row_order:
        experts, pair_weights = chosen.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
        rows = experts  # unread: a pair's row is pair // K
    else:
        rows, pair_weights, experts = pairs_by_expert(weights, chosen)
    launch(
        _gate_up_kernel,
        _gate_up_tuned,
        pairs,
        width,
        x,
        a,
        rows,
        experts,
        y,
        h,
        width,
        k,
        bucket,
        SORTED=not in_row_order,
    )
    out_pairs = flat.new_empty(pairs, h)
    launch(_down_kernel, _down_tuned, pairs, h, y, b, experts, pair_weights, out_pairs, h, width, bucket)
    if in_row_order:
        return out_pairs.sum(dim=0, keepdim=True)  # in float32, rounded once
    return torch.zeros_like(flat).index_add_(0, rows, out_pairs)
