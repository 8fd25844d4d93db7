"""The layer variants of the reference build, layered on model.py's plain functions.

``prepare_layers`` builds per-layer records with model.py's field names (so ``model.Transformer``
runs them), fusing q/k/v and gate/up into one matrix each where ``fused_qkv`` / ``fused_gate_up``
ask (new tensors owned by the hot path; unfused ones are views of the model's weights), and gives
a sparse layer a ``moe.Moe``. Each layer's ``ffn`` is chosen here, once: model.py's ``mlp``,
``mlp_fused``, or ``moe_ffn``. ``project_qkv_fused`` and ``attention_sdpa`` replace model.py's
``project_qkv`` and ``attention``; the fused step (fused.py) uses these records too.

The functions know nothing about caches, slots or scheduling. Shapes: B = batch rows, T = new
positions per row, L = attended positions, H = hidden size, D = head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from polymorph_engine.runtime.config import ModelConfig

from .model import apply_rope, mlp, rms_norm, rotate_half
from .model import attention as attention_manual
from .moe import Moe

__all__ = [
    "LayerWeights",
    "apply_rope",
    "attention_manual",
    "attention_sdpa",
    "mlp",
    "mlp_fused",
    "moe_ffn",
    "prepare_layers",
    "project_qkv_fused",
    "rms_norm",
    "rotate_half",
]


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
            ffn=moe_ffn if sparse else (mlp_fused if fused_gate_up else mlp),
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


def project_qkv_fused(
    lw: LayerWeights, h: torch.Tensor, nh: int, nkv: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """model.project_qkv as one matmul against the concatenated q/k/v weights."""
    b, t, _ = h.shape
    assert lw.qkv_proj is not None
    qkv = F.linear(h, lw.qkv_proj, lw.qkv_bias)  # [B, T, (nh+2*nkv)*D]
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    return q.reshape(b, t, nh, d), k.reshape(b, t, nkv, d), v.reshape(b, t, nkv, d)


def attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as model.py\'s ``attention`` through ``F.scaled_dot_product_attention``."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def mlp_fused(lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    """model.mlp with one matmul against the concatenated gate/up weights."""
    assert lw.gate_up_proj is not None and lw.down_proj is not None
    gate, up = F.linear(h, lw.gate_up_proj).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, lw.down_proj)


def moe_ffn(lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    """A sparse layer's MoE block (moe.py): h [B, T, H] -> [B, T, H]."""
    assert lw.moe is not None
    return lw.moe(h)
