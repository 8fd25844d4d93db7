"""Decoder layer pieces of the reference build: weights prepared once, then pure tensor functions.

``prepare_layers`` turns the model's HF-named weights into per-layer records, optionally fusing
q/k/v and gate/up projections into one matrix each (``fused_qkv``, ``fused_gate_up`` knobs): one
large matmul instead of several small ones. Fused matrices are new tensors owned by the hot path;
unfused ones are views of the model's weights (no copy). A sparse (MoE) layer gets a ``moe.Moe``
instead of gate/up/down matrices, and each layer's ``ffn`` is chosen here, once: ``mlp`` for a
dense layer, ``moe_ffn`` for a sparse one, so the dense step has no per-step MoE branch.

The functions know nothing about caches, slots or scheduling. Shapes: B = batch rows, T = new
positions per row, L = attended positions, H = hidden size, D = head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from polymorph_engine.runtime.config import ModelConfig

from .moe import Moe


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    mlp_norm: torch.Tensor  # [H]
    o_proj: torch.Tensor  # [H, nh*D]
    o_bias: torch.Tensor | None
    down_proj: torch.Tensor | None  # [H, I]; None in a sparse layer
    ffn: Callable[[LayerWeights, torch.Tensor], torch.Tensor]  # mlp, or moe_ffn in a sparse layer
    # Either the three/two separate matrices or the fused one is set.
    q_proj: torch.Tensor | None = None  # [nh*D, H]
    k_proj: torch.Tensor | None = None  # [nkv*D, H]
    v_proj: torch.Tensor | None = None  # [nkv*D, H]
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    qkv_proj: torch.Tensor | None = None  # [(nh+2*nkv)*D, H]
    qkv_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # [D] (Qwen3)
    k_norm: torch.Tensor | None = None  # [D] (Qwen3)
    gate_proj: torch.Tensor | None = None  # [I, H]
    up_proj: torch.Tensor | None = None  # [I, H]
    gate_up_proj: torch.Tensor | None = None  # [2*I, H]
    moe: Moe | None = None  # a sparse layer's router and experts


def prepare_layers(
    weights: dict[str, torch.Tensor],
    num_layers: int,
    fused_qkv: bool,
    fused_gate_up: bool,
    *,
    config: ModelConfig | None = None,
    moe_routing: str = "plain",
    moe_experts: str = "loop",
    triton_ok: bool = False,
) -> list[LayerWeights]:
    """Per-layer records; a layer ``config.moe_layer`` names gets a ``Moe`` built with the
    ``moe_routing`` / ``moe_experts`` knobs (``triton_ok``: whether its Triton kernels can run)."""
    layers = []
    for i in range(num_layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        sparse = config is not None and config.moe_layer(i)
        lw = LayerWeights(
            attn_norm=weights[f"{p}.input_layernorm.weight"],
            mlp_norm=weights[f"{p}.post_attention_layernorm.weight"],
            o_proj=weights[f"{a}.o_proj.weight"],
            o_bias=weights.get(f"{a}.o_proj.bias"),
            down_proj=None if sparse else weights[f"{p}.mlp.down_proj.weight"],
            q_norm=weights.get(f"{a}.q_norm.weight"),
            k_norm=weights.get(f"{a}.k_norm.weight"),
            ffn=moe_ffn if sparse else mlp,
        )
        q, k, v = (weights[f"{a}.{n}_proj.weight"] for n in "qkv")
        qb, kb, vb = (weights.get(f"{a}.{n}_proj.bias") for n in "qkv")
        if fused_qkv:
            lw.qkv_proj = torch.cat([q, k, v], dim=0)
            if qb is not None and kb is not None and vb is not None:
                lw.qkv_bias = torch.cat([qb, kb, vb], dim=0)
        else:
            lw.q_proj, lw.k_proj, lw.v_proj = q, k, v
            lw.q_bias, lw.k_bias, lw.v_bias = qb, kb, vb
        if sparse:
            assert config is not None
            lw.moe = Moe(weights, config, i, routing=moe_routing, experts=moe_experts, triton_ok=triton_ok)
            layers.append(lw)
            continue
        gate, up = weights[f"{p}.mlp.gate_proj.weight"], weights[f"{p}.mlp.up_proj.weight"]
        if fused_gate_up:
            lw.gate_up_proj = torch.cat([gate, up], dim=0)
        else:
            lw.gate_proj, lw.up_proj = gate, up
        layers.append(lw)
    return layers


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 and cast back before the weight (as HF does)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def project_qkv(
    lw: LayerWeights, h: torch.Tensor, nh: int, nkv: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [B, T, H] -> q [B, T, nh, D], k [B, T, nkv, D], v [B, T, nkv, D]."""
    b, t, _ = h.shape
    if lw.qkv_proj is not None:
        qkv = F.linear(h, lw.qkv_proj, lw.qkv_bias)  # [B, T, (nh+2*nkv)*D]
        q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    else:
        assert lw.q_proj is not None and lw.k_proj is not None and lw.v_proj is not None
        q = F.linear(h, lw.q_proj, lw.q_bias)
        k = F.linear(h, lw.k_proj, lw.k_bias)
        v = F.linear(h, lw.v_proj, lw.v_bias)
    return q.reshape(b, t, nh, d), k.reshape(b, t, nkv, d), v.reshape(b, t, nkv, d)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos, sin [B, 1, T, D]."""
    return x * cos + rotate_half(x) * sin


def attention_manual(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Explicit softmax attention. q [B, nh, T, D]; k, v [B, nkv, L, D]; mask bool [B|1, 1, T, L]
    (True = attend) or None for causal with T == L. Returns [B, nh, T, D]."""
    nh, nkv, d = q.shape[1], k.shape[1], q.shape[-1]
    k = k.repeat_interleave(nh // nkv, dim=1)  # [B, nh, L, D]
    v = v.repeat_interleave(nh // nkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # [B, nh, T, L]
    if mask is None:
        t = q.shape[2]
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return probs @ v


def attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as ``attention_manual`` through ``F.scaled_dot_product_attention``."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def mlp(lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    """SwiGLU: down(silu(gate(h)) * up(h)); h [B, T, H] -> [B, T, H]."""
    if lw.gate_up_proj is not None:
        gate, up = F.linear(h, lw.gate_up_proj).chunk(2, dim=-1)
    else:
        assert lw.gate_proj is not None and lw.up_proj is not None
        gate, up = F.linear(h, lw.gate_proj), F.linear(h, lw.up_proj)
    assert lw.down_proj is not None
    return F.linear(F.silu(gate) * up, lw.down_proj)


def moe_ffn(lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    """A sparse layer's MoE block (moe.py): h [B, T, H] -> [B, T, H]."""
    assert lw.moe is not None
    return lw.moe(h)
