"""Triton decode attention of the fused decode step (``decode_step = "fused"``, ``kernels = "triton"``).

- ``decode_attention``: split-KV (flash-decoding) attention of one query per row over the
  positions 0..lengths[slot], read on the device, so a captured graph attends only over the live
  length. Pass one writes per-split partial maxima, sums and outputs; pass two combines them.
- ``attention_splits``: how many splits keep every multiprocessor busy for a batch.

Its pure-PyTorch twin is ``TorchOps.attend`` in ``fused_ops.py``; ``tests/engine_builds/test_fast_knobs.py``
compares them on fresh random inputs. Triton is an optional extra of this build: this module is
imported only when the knob selects it. It knows nothing about layers or scheduling.
Shapes: B = rows, NH = query heads, NKV = kv heads, D = head dim, S = cache slots, L = cache positions.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .kernels import launch_options, pdl_enter

ATTN_BLOCK_L = 64  # cache positions per attention tile


@triton.jit
def _attn_split_kernel(
    q_ptr,  # [B, NH, D]
    k_cache_ptr,  # [S, NKV, L, D]
    v_cache_ptr,
    slots_ptr,  # [B]
    lengths_ptr,  # [S]: the new token's position; attended positions are 0..lengths[slot]
    m_ptr,  # [B, NH, SPLITS] float32
    l_ptr,  # [B, NH, SPLITS] float32
    acc_ptr,  # [B, NH, SPLITS, D] float32
    stride_cs,
    stride_ch,
    stride_cl,
    max_pos,
    scale,
    NKV: tl.constexpr,
    G: tl.constexpr,  # query heads per kv head
    BLOCK_G: tl.constexpr,  # G padded to >= 16 for tl.dot
    D: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_L: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // NKV
    kvh = bh % NKV
    nh = NKV * G
    slot = tl.load(slots_ptr + b)
    length = tl.minimum(tl.load(lengths_ptr + slot), max_pos) + 1
    per_split = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_L) * BLOCK_L
    start = split * per_split
    end = tl.minimum(start + per_split, length)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    mask_g = offs_g < G
    heads = kvh * G + offs_g  # [BLOCK_G]
    q = tl.load(q_ptr + (b * nh + heads)[:, None] * D + offs_d[None, :], mask=mask_g[:, None], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, D], dtype=tl.float32)
    base = slot * stride_cs + kvh * stride_ch
    for l0 in range(start, end, BLOCK_L):
        offs_l = l0 + tl.arange(0, BLOCK_L)  # [BLOCK_L]
        mask_l = offs_l < end
        kv_off = base + offs_l[:, None] * stride_cl + offs_d[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=mask_l[:, None], other=0.0)  # [BLOCK_L, D]
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [BLOCK_G, BLOCK_L]
        s = tl.where(mask_l[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off, mask=mask_l[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    row = (b * nh + heads) * SPLITS + split  # [BLOCK_G]
    tl.store(m_ptr + row, m_i, mask=mask_g)
    tl.store(l_ptr + row, l_i, mask=mask_g)
    tl.store(acc_ptr + row[:, None] * D + offs_d[None, :], acc, mask=mask_g[:, None])


@triton.jit
def _attn_combine_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    D: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0)  # b * NH + h
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    mask_s = offs_s < SPLITS
    m = tl.load(m_ptr + row * SPLITS + offs_s, mask=mask_s, other=float("-inf"))
    l_ = tl.load(l_ptr + row * SPLITS + offs_s, mask=mask_s, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.where(m > float("-inf"), tl.exp(m - m_max), 0.0)  # empty splits weigh nothing
    acc = tl.load(
        acc_ptr + (row * SPLITS + offs_s)[:, None] * D + offs_d[None, :], mask=mask_s[:, None], other=0.0
    )
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_ * w, axis=0)
    tl.store(out_ptr + row * D + offs_d, out.to(out_ptr.dtype.element_ty))


def attention_splits(max_seq_len: int, rows: int, kv_heads: int, sms: int) -> int:
    """Splits of the cache per (row, kv head): enough programs to cover the chip, no split
    shorter than one tile."""
    splits = 1
    while splits < 64 and rows * kv_heads * splits < 2 * sms and (splits * 2) * ATTN_BLOCK_L <= max_seq_len:
        splits *= 2
    return splits


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    out: torch.Tensor,
    scratch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    pdl: bool = False,
) -> torch.Tensor:
    """q [B, nh, D]; attends positions 0..lengths[slots[b]] of the caches [S, nkv, L, D];
    writes out [B, nh*D]. ``scratch`` = (m, l, acc) float32 [B, nh, splits] / [..., D]."""
    b, nh, d = q.shape
    nkv = k_cache.shape[1]
    m, l_, acc = scratch
    splits = m.shape[-1]
    g = nh // nkv
    _attn_split_kernel[(b * nkv, splits)](
        q,
        k_cache,
        v_cache,
        slots,
        lengths,
        m,
        l_,
        acc,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[2] - 1,
        1.0 / math.sqrt(d),
        NKV=nkv,
        G=g,
        BLOCK_G=max(16, triton.next_power_of_2(g)),
        D=d,
        SPLITS=splits,
        BLOCK_L=ATTN_BLOCK_L,
        PDL=pdl,
        num_warps=4,
        **launch_options(pdl),
    )
    _attn_combine_kernel[(b * nh,)](
        m,
        l_,
        acc,
        out,
        D=d,
        SPLITS=splits,
        BLOCK_S=max(2, triton.next_power_of_2(splits)),
        PDL=pdl,
        num_warps=1,
        **launch_options(pdl),
    )
    return out
