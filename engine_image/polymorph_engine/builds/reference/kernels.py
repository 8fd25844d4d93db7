"""Triton kernels of the fused decode step (``decode_step = "fused"``, ``kernels = "triton"``).

Each kernel has a typed wrapper here and a pure-PyTorch twin in ``fused_ops.py`` (``TorchOps``)
that computes the same function; ``tests/engine_builds/test_fast_knobs.py`` compares them on
fresh random inputs (on CPU through ``TRITON_INTERPRET=1`` when triton is installed).

- ``pdl_enter`` and ``launch_options``: programmatic dependent launch (knob ``pdl``), shared by
  every kernel of the step: each one lets the next launch early and waits for its inputs.
- ``gemv`` (in ``gemv_kernels.py``): the projections with norm, SwiGLU and residual fused in.
- ``rope_store``: RoPE on q and k of every head (optionally the Qwen3 per-head q/k norm first),
  q to a buffer, k and v written into the static cache at (slot, position): one launch.
- ``rms_norm``, ``add_rms_norm`` (the residual add, then the norm) and ``silu_mul``: one launch
  each, for the cuBLAS projections.
- ``decode_attention`` (in ``attention_kernels.py``): split-KV attention over the live length.

Rounding follows the reference where it is cheap (intermediates rounded to the activation dtype
where the reference rounds them), so the fused step stays close to the golden logits in bf16.
Triton is an optional extra of this build: this module is imported only when the knob selects
it. It knows nothing about layers, caches beyond their tensor layout, or scheduling.
Shapes: B = rows, K = features, D = head dim, L = cache positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """With PDL, let the next kernel launch now and wait for the previous kernels' outputs; every
    kernel of the step calls this before it reads anything an earlier kernel wrote."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def launch_options(pdl: bool) -> dict[str, bool]:
    """Launch keywords: programmatic dependent launch (Hopper and later) when ``pdl``."""
    return {"launch_pdl": True} if pdl else {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (what grids are sized against)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 4  # the interpreter: any grid works


@triton.jit
def _rope_store_kernel(
    qkv_ptr,  # [B, (NH + 2*NKV) * D]
    q_out_ptr,  # [B, NH, D]
    k_cache_ptr,  # [S, NKV, L, D]
    v_cache_ptr,  # [S, NKV, L, D]
    slots_ptr,  # [B] int64
    lengths_ptr,  # [S] int64: position of the new token = lengths[slot]
    inv_freq_ptr,  # [D/2] float32
    qn_ptr,  # [D] q norm weight or unused
    kn_ptr,  # [D] k norm weight or unused
    stride_qkv_b,
    stride_cs,
    stride_ch,
    stride_cl,
    max_pos,
    eps,
    NH: tl.constexpr,
    NKV: tl.constexpr,
    HALF: tl.constexpr,  # D / 2
    QK_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)  # 0..NH-1: q heads, NH..NH+NKV-1: k heads (v copied alongside)
    ty = q_out_ptr.dtype.element_ty
    d = 2 * HALF
    slot = tl.load(slots_ptr + b)
    pos = tl.minimum(tl.load(lengths_ptr + slot), max_pos)  # padded rows never write out of bounds
    offs = tl.arange(0, HALF)
    base = qkv_ptr + b * stride_qkv_b + h * d
    x1 = tl.load(base + offs).to(tl.float32)
    x2 = tl.load(base + HALF + offs).to(tl.float32)
    if QK_NORM:
        ms = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / d
        rstd = 1.0 / tl.sqrt(ms + eps)
        is_q = h < NH
        w1 = tl.where(is_q, tl.load(qn_ptr + offs), tl.load(kn_ptr + offs)).to(tl.float32)
        w2 = tl.where(is_q, tl.load(qn_ptr + HALF + offs), tl.load(kn_ptr + HALF + offs)).to(tl.float32)
        x1 = ((x1 * rstd).to(ty).to(tl.float32) * w1).to(ty).to(tl.float32)
        x2 = ((x2 * rstd).to(ty).to(tl.float32) * w2).to(ty).to(tl.float32)
    freq = pos.to(tl.float32) * tl.load(inv_freq_ptr + offs)  # [HALF]
    c = tl.cos(freq).to(ty).to(tl.float32)
    s = tl.sin(freq).to(ty).to(tl.float32)
    # x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1]; each product rounded.
    o1 = ((x1 * c).to(ty).to(tl.float32) + (-x2 * s).to(ty).to(tl.float32)).to(ty)
    o2 = ((x2 * c).to(ty).to(tl.float32) + (x1 * s).to(ty).to(tl.float32)).to(ty)
    if h < NH:
        q_base = q_out_ptr + (b * NH + h) * d
        tl.store(q_base + offs, o1)
        tl.store(q_base + HALF + offs, o2)
    else:
        kvh = h - NH
        dst = slot * stride_cs + kvh * stride_ch + pos * stride_cl
        tl.store(k_cache_ptr + dst + offs, o1)
        tl.store(k_cache_ptr + dst + HALF + offs, o2)
        v_base = qkv_ptr + b * stride_qkv_b + (NH + NKV + kvh) * d
        tl.store(v_cache_ptr + dst + offs, tl.load(v_base + offs))
        tl.store(v_cache_ptr + dst + HALF + offs, tl.load(v_base + HALF + offs))


def rope_store(
    qkv: torch.Tensor,
    q_out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    inv_freq: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    pdl: bool = False,
) -> None:
    """qkv [B, (nh+2nkv)*D] -> q_out [B, nh, D] rotated; k (rotated), v into the caches at
    [slots[b], :, lengths[slots[b]]]. Caches [S, nkv, L, D], contiguous in D."""
    b, nh, d = q_out.shape
    nkv = k_cache.shape[1]
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and qkv.stride(-1) == 1
    _rope_store_kernel[(b, nh + nkv)](
        qkv,
        q_out,
        k_cache,
        v_cache,
        slots,
        lengths,
        inv_freq,
        q_norm if q_norm is not None else inv_freq,
        k_norm if k_norm is not None else inv_freq,
        qkv.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[2] - 1,
        eps,
        NH=nh,
        NKV=nkv,
        HALF=d // 2,
        QK_NORM=q_norm is not None,
        PDL=pdl,
        num_warps=1,
        **launch_options(pdl),
    )


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, K, stride_xb, stride_ob, eps, BLOCK_K: tl.constexpr, PDL: tl.constexpr
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    ty = out_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + b * stride_xb + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = ((x * rstd).to(ty).to(tl.float32) * w).to(ty)  # rounded where the reference rounds
    tl.store(out_ptr + b * stride_ob + offs, y, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False) -> torch.Tensor:
    """x [B, K] -> weight * (x / rms(x)), one launch (the reference's ``rms_norm``)."""
    rows, k = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(k)
    _rms_norm_kernel[(rows,)](
        x,
        weight,
        out,
        k,
        x.stride(0),
        out.stride(0),
        eps,
        BLOCK_K=block,
        PDL=pdl,
        num_warps=max(1, min(16, block // 512)),
        **launch_options(pdl),
    )
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, INTER, stride_b, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTER
    ty = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + b * stride_b + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + b * stride_b + INTER + offs, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
    tl.store(out_ptr + b * INTER + offs, (s * u).to(ty), mask=mask)


def silu_mul(gu: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """gu [B, 2I] = [gate | up] -> silu(gate) * up [B, I], one launch."""
    rows, two_i = gu.shape
    inter = two_i // 2
    out = gu.new_empty(rows, inter)
    block = 1024
    _silu_mul_kernel[(triton.cdiv(inter, block), rows)](
        gu, out, inter, gu.stride(0), BLOCK=block, PDL=pdl, num_warps=4, **launch_options(pdl)
    )
    return out


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    x_out_ptr,
    h_ptr,
    K,
    stride_x,
    stride_y,
    eps,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    ty = x_out_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + b * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + b * stride_y + offs, mask=mask, other=0.0).to(tl.float32)
    xn = (x + y).to(ty)  # the residual add, rounded as the reference's bf16 add
    tl.store(x_out_ptr + b * K + offs, xn, mask=mask)
    xf = xn.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / K + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + b * K + offs, ((xf * rstd).to(ty).to(tl.float32) * w).to(ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [B, K] -> (x + y, rms_norm(x + y)) in one launch."""
    rows, k = x.shape
    x_out, h = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(k)
    _add_rms_norm_kernel[(rows,)](
        x,
        y,
        weight,
        x_out,
        h,
        k,
        x.stride(0),
        y.stride(0),
        eps,
        BLOCK_K=block,
        PDL=pdl,
        num_warps=max(1, min(16, block // 512)),
        **launch_options(pdl),
    )
    return x_out, h
