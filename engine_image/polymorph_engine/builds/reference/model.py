"""The reference model: a Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral decoder in plain PyTorch.

This file is the model. Every step is the obvious one: RMSNorm in float32, separate q/k/v
projections, RoPE, explicit softmax attention under a boolean mask, a SwiGLU MLP, and in a sparse
layer HF's MoE block (a float32 softmax over the router logits, the top k, renormalised where the
config asks, each selected expert over the rows that chose it). ``Transformer.forward`` over a KV
cache is the reference build's default path, so it computes the golden outputs every build is
verified against; ``forward`` runs it over one whole sequence with no cache.

The faster variants are layered on it, chosen once at load (hotpath.py): they swap
``Transformer``'s ``project``, ``attend`` or a layer's ``ffn`` for another function computing the
same thing (layers.py, moe.py), or replace the decode step (fused.py). build.toml describes them.
It knows nothing about caches, slots, knobs or sampling: ``forward`` is handed a ``kv`` function
that stores this step's keys and values and returns the ones to attend over.

Shapes: B = batch rows, T = new positions per row, L = attended positions, H = hidden size,
D = head dim, E = experts, K = experts per token, V = vocab size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from polymorph_engine.runtime.config import ModelConfig
from polymorph_engine.runtime.model import LoadedModel, moe_names, rope_cos_sin, rope_inv_freq

Kv = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(layer, k, v [B, nkv, T, D]) -> the keys and values to attend over [B, nkv, L, D]."""


@dataclass
class Layer:
    """One decoder layer's weights: views of the model's, nothing copied."""

    attn_norm: torch.Tensor  # [H]
    mlp_norm: torch.Tensor  # [H]
    q_proj: torch.Tensor  # [nh*D, H]
    k_proj: torch.Tensor  # [nkv*D, H]
    v_proj: torch.Tensor  # [nkv*D, H]
    o_proj: torch.Tensor  # [H, nh*D]
    q_bias: torch.Tensor | None  # Qwen2
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None
    gate_proj: torch.Tensor | None  # [I, H]; None in a sparse layer
    up_proj: torch.Tensor | None
    down_proj: torch.Tensor | None  # [H, I]
    router: torch.Tensor | None  # [E, H]; a sparse layer's
    experts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per expert: gate, up, down
    ffn: Callable[[Any, torch.Tensor], torch.Tensor]  # mlp, or moe in a sparse layer
    top_k: int = 0  # a sparse layer's experts per token
    renormalise: bool = False  # whether its top k weights are renormalised to sum to 1


def layer(weights: dict[str, torch.Tensor], config: ModelConfig, i: int) -> Layer:
    """Layer ``i``'s weights, by their HF names."""
    p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
    w, get = weights, weights.get
    sparse = config.moe_layer(i)
    names = moe_names(config, i) if sparse else None
    return Layer(
        attn_norm=w[f"{p}.input_layernorm.weight"],
        mlp_norm=w[f"{p}.post_attention_layernorm.weight"],
        q_proj=w[f"{a}.q_proj.weight"],
        k_proj=w[f"{a}.k_proj.weight"],
        v_proj=w[f"{a}.v_proj.weight"],
        o_proj=w[f"{a}.o_proj.weight"],
        q_bias=get(f"{a}.q_proj.bias"),
        k_bias=get(f"{a}.k_proj.bias"),
        v_bias=get(f"{a}.v_proj.bias"),
        o_bias=get(f"{a}.o_proj.bias"),
        q_norm=get(f"{a}.q_norm.weight"),
        k_norm=get(f"{a}.k_norm.weight"),
        gate_proj=None if sparse else w[f"{p}.mlp.gate_proj.weight"],
        up_proj=None if sparse else w[f"{p}.mlp.up_proj.weight"],
        down_proj=None if sparse else w[f"{p}.mlp.down_proj.weight"],
        router=w[names.router] if names else None,
        experts=[(w[g], w[u], w[d]) for g, u, d in zip(names.gate, names.up, names.down, strict=True)]
        if names
        else [],
        ffn=moe if sparse else mlp,
        top_k=config.num_experts_per_tok,
        renormalise=config.norm_topk_prob,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 and cast back before the weight (as HF does)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D]; cos, sin [B, 1, T, D]."""
    return x * cos + rotate_half(x) * sin


def project_qkv(
    lw: Any, h: torch.Tensor, nh: int, nkv: int, d: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [B, T, H] -> q [B, T, nh, D], k [B, T, nkv, D], v [B, T, nkv, D]."""
    b, t, _ = h.shape
    q = F.linear(h, lw.q_proj, lw.q_bias)
    k = F.linear(h, lw.k_proj, lw.k_bias)
    v = F.linear(h, lw.v_proj, lw.v_bias)
    return q.reshape(b, t, nh, d), k.reshape(b, t, nkv, d), v.reshape(b, t, nkv, d)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
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


def mlp(lw: Any, h: torch.Tensor) -> torch.Tensor:
    """SwiGLU: down(silu(gate(h)) * up(h)); h [B, T, H] -> [B, T, H]."""
    assert lw.gate_proj is not None and lw.up_proj is not None and lw.down_proj is not None
    return F.linear(F.silu(F.linear(h, lw.gate_proj)) * F.linear(h, lw.up_proj), lw.down_proj)


def route(
    flat: torch.Tensor, router: torch.Tensor, k: int, renormalise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """flat [T, H] -> routing weights [T, K] (activation dtype) and chosen experts [T, K]: a
    float32 softmax over every router logit, the top k, renormalised to sum to 1 if asked."""
    probs = torch.softmax(F.linear(flat, router).float(), dim=-1)  # [T, E]
    top, chosen = probs.topk(k, dim=-1)
    if renormalise:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(flat.dtype), chosen


def expert(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU: x [T, H] -> [T, H]."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def pairs_by_expert(
    weights: torch.Tensor, chosen: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The T*K (row, expert) pairs of routing weights and chosen experts [T, K], sorted by expert
    (stable, so each expert's rows stay in order): their rows, weights and experts, each [T*K]."""
    experts = chosen.flatten()  # row-major: pair i is row i // K
    order = experts.argsort(stable=True)
    return order // chosen.shape[1], weights.flatten()[order], experts[order]


def experts_loop(
    flat: torch.Tensor,
    weights: torch.Tensor,
    chosen: torch.Tensor,
    experts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """Each selected expert in turn over the rows that chose it, weighted and summed: [T, H].

    The (row, expert) pairs are sorted by expert (stable, so each expert's rows stay in order)
    and the host reads how many each expert has: one sync per layer, not one per expert."""
    out = torch.zeros_like(flat)
    rows, w, by_expert = pairs_by_expert(weights, chosen)
    counts = torch.bincount(by_expert, minlength=len(experts)).tolist()  # the host reads the selected set
    rows, w = rows.split(counts), w.split(counts)
    for e, n in enumerate(counts):
        if n:
            out.index_add_(0, rows[e], expert(flat[rows[e]], *experts[e]) * w[e][:, None])
    return out


def moe(lw: Layer, h: torch.Tensor) -> torch.Tensor:
    """The sparse MoE block, as HF computes it: h [..., H] -> [..., H]."""
    assert lw.router is not None
    flat = h.reshape(-1, h.shape[-1])  # [T, H]
    weights, chosen = route(flat, lw.router, lw.top_k, lw.renormalise)
    return experts_loop(flat, weights, chosen, lw.experts).reshape(h.shape)


class Transformer:
    """The decoder: embedding, layers, final norm and head, over whatever ``kv`` the caller hands in.

    ``project``, ``attend`` and each layer's ``ffn`` are attributes so a variant can replace them
    once, at load; as built here they are this file's plain functions. ``layers`` (default: every
    ``layer`` of the model) may be a variant's records.
    """

    def __init__(self, model: LoadedModel, layers: list[Any] | None = None) -> None:
        c = model.config
        self.config, self.device, self.dtype = c, model.device, model.dtype
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps = c.rms_norm_eps
        # ``Layer``s, or a variant's records with the same fields (layers.LayerWeights).
        self.layers: list[Any] = (
            layers if layers is not None else [layer(model.weights, c, i) for i in range(c.num_hidden_layers)]
        )
        self.embed = model.weights["model.embed_tokens.weight"]  # [V, H]
        self.final_norm = model.weights["model.norm.weight"]  # [H]
        self.lm_head = self.embed if c.tie_word_embeddings else model.weights["lm_head.weight"]  # [V, H]
        self.inv_freq = rope_inv_freq(c, self.device)  # [D/2] float32
        self.project: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = project_qkv
        self.attend: Callable[..., torch.Tensor] = attention
        if model.shard is not None:  # tensor parallel: chosen once, so one process runs plain ``out``
            self.reduce = model.shard.all_reduce
            self.out = self.out_sharded  # type: ignore[method-assign]

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D]."""
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def qkv(
        self, lw: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> q [B, nh, T, D], k, v [B, nkv, T, D] (normed, rotated)."""
        h = rms_norm(x, lw.attn_norm, self.eps)
        q, k, v = self.project(lw, h, self.nh, self.nkv, self.d)
        if lw.q_norm is not None and lw.k_norm is not None:
            q = rms_norm(q, lw.q_norm, self.eps)
            k = rms_norm(k, lw.k_norm, self.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def out(self, lw: Any, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual adds of attention output attn [B, nh, T, D] and the MLP: x [B, T, H]."""
        b, _, t, _ = attn.shape
        attn = attn.transpose(1, 2).reshape(b, t, self.nh * self.d)
        x = x + F.linear(attn, lw.o_proj, lw.o_bias)
        h = rms_norm(x, lw.mlp_norm, self.eps)
        return x + lw.ffn(lw, h)

    def out_sharded(self, lw: Any, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """``out`` on one rank of a tensor-parallel model (Megatron): this rank's heads through its
        columns of o_proj, and its rows of the MLP (or of each expert) through its columns of
        down_proj, are partial sums; each is all-reduced before its residual add (o_proj's bias
        is rank 0's alone). Every rank then holds the same x."""
        b, _, t, _ = attn.shape
        attn = attn.transpose(1, 2).reshape(b, t, self.nh * self.d)
        x = x + self.reduce(F.linear(attn, lw.o_proj, lw.o_bias))
        h = rms_norm(x, lw.mlp_norm, self.eps)
        return x + self.reduce(lw.ffn(lw, h))

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, kv: Kv
    ) -> torch.Tensor:
        """tokens, positions [B, T] -> hidden states [B, T, H]; ``mask`` as ``attention`` takes it."""
        x = self.embed[tokens]  # [B, T, H]
        cos, sin = self.rope(positions)
        for i, lw in enumerate(self.layers):
            q, k, v = self.qkv(lw, x, cos, sin)
            keys, values = kv(i, k, v)
            x = self.out(lw, x, self.attend(q, keys, values, mask))
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, H] -> float32 logits [B, V]."""
        return (rms_norm(x, self.final_norm, self.eps) @ self.lm_head.T).float()


def _own(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return k, v


@torch.no_grad()
def forward(model: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [S, V] (float32) for every position of ``tokens`` [S], positions 0..S-1, no cache."""
    net = Transformer(model)
    seq = int(tokens.shape[0])
    x = net.forward(tokens.to(model.device)[None], torch.arange(seq, device=model.device)[None], None, _own)
    return net.logits(x[0])
