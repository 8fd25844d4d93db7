"""The network: a loaded model's parameters, RoPE, and the plain reference forward pass.

``LoadedModel`` is what an engine process loads once (config, weights with HF names, tokenizer,
device, dtype); hot paths derive their state from it. ``moe_names`` names a sparse layer's router
and experts as its architecture's checkpoints do (Qwen3-MoE's ``mlp.gate`` and
``mlp.experts.E.{gate,up,down}_proj``, Mixtral's ``block_sparse_moe.gate`` and
``block_sparse_moe.experts.E.{w1,w3,w2}``). ``rope_inv_freq`` and ``rope_cos_sin`` are
part of the model's definition, shared by the reference forward and builds. ``forward`` is the
plain, cache-free, full-sequence forward pass: the obviously-correct twin that hot paths are
tested against. Its MoE block is HF's: a float32 softmax over the router logits, the top k, those
renormalised to sum to 1 where the config asks (Mixtral always), cast to the activation dtype,
and each selected expert's SwiGLU over the rows that chose it, weighted and summed.

This module knows nothing about builds, knobs, KV caches, batching or sampling (those belong to
the hot path a build derives from a ``LoadedModel``), nor about checkpoint files
(``runtime.checkpoint``) or the shape table (``runtime.config``).

Shapes: S = sequence length, H = hidden size, V = vocab size, D = head dim, E = experts,
K = experts per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from polymorph_engine.runtime.config import ModelConfig
from polymorph_engine.runtime.tokenizer import Tokenizer

__all__ = ["LoadedModel", "MoeNames", "forward", "moe_names", "rope_cos_sin", "rope_inv_freq"]


@dataclass
class LoadedModel:
    """Everything loaded once per engine process; hot paths derive their state from it."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF names, e.g. "model.layers.0.self_attn.q_proj.weight"
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    source: str = ""

    def weights_bytes(self) -> int:
        """Bytes held by the weights (the tied embedding counts once)."""
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def __repr__(self) -> str:
        return (
            f"LoadedModel(source={self.source!r}, architecture={self.config.architecture!r}, "
            f"layers={self.config.num_hidden_layers}, hidden={self.config.hidden_size}, "
            f"device={self.device}, dtype={self.dtype}, weights={self.weights_bytes() / 2**20:.1f} MiB)"
        )


@dataclass(frozen=True)
class MoeNames:
    """HF names of one sparse layer's weights: the router [E, H] and, per expert, gate [I, H],
    up [I, H] and down [H, I]."""

    router: str
    gate: tuple[str, ...]
    up: tuple[str, ...]
    down: tuple[str, ...]


def moe_names(config: ModelConfig, layer: int) -> MoeNames:
    """The names of sparse layer ``layer``'s router and experts, as the architecture's checkpoints spell them."""
    e = range(config.num_experts)
    if config.architecture == "mixtral":
        p = f"model.layers.{layer}.block_sparse_moe"
        return MoeNames(
            f"{p}.gate.weight",
            tuple(f"{p}.experts.{i}.w1.weight" for i in e),
            tuple(f"{p}.experts.{i}.w3.weight" for i in e),
            tuple(f"{p}.experts.{i}.w2.weight" for i in e),
        )
    p = f"model.layers.{layer}.mlp"
    return MoeNames(
        f"{p}.gate.weight",
        tuple(f"{p}.experts.{i}.gate_proj.weight" for i in e),
        tuple(f"{p}.experts.{i}.up_proj.weight" for i in e),
        tuple(f"{p}.experts.{i}.down_proj.weight" for i in e),
    )


# --- RoPE: part of the model's definition, shared by the reference forward and builds. ---


def rope_inv_freq(config: ModelConfig, device: str | torch.device = "cpu") -> torch.Tensor:
    """Inverse frequencies [D/2] (float32), with llama3 scaling applied when the config has it."""
    d = config.head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
    inv_freq = 1.0 / (config.rope_theta**exponents)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3: long wavelengths are divided by `factor`, short ones kept, the band between
    # interpolated smoothly in 1/wavelength.
    old_ctx = s.original_max_position_embeddings
    low_freq_wavelen = old_ctx / s.low_freq_factor
    high_freq_wavelen = old_ctx / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [*positions.shape, D] for integer ``positions``, computed in float32 then cast."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [..., D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


# --- The reference forward pass: no cache, whole sequence, one obvious step at a time. ---


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _linear(x: torch.Tensor, w: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return torch.nn.functional.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))


@torch.no_grad()
def forward(model: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [S, V] (float32) for every position of ``tokens`` [S], positions 0..S-1."""
    c, w = model.config, model.weights
    seq = tokens.shape[0]
    nh, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    x = w["model.embed_tokens.weight"][tokens.to(model.device)]  # [S, H]
    positions = torch.arange(seq, device=model.device)
    cos, sin = rope_cos_sin(rope_inv_freq(c, model.device), positions, model.dtype)  # [S, D]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=model.device).tril()  # [S, S]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        h = _rms_norm(x, w[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
        q = _linear(h, w, f"{p}.self_attn.q_proj").view(seq, nh, d)
        k = _linear(h, w, f"{p}.self_attn.k_proj").view(seq, nkv, d)
        v = _linear(h, w, f"{p}.self_attn.v_proj").view(seq, nkv, d)
        if c.qk_norm:
            q = _rms_norm(q, w[f"{p}.self_attn.q_norm.weight"], c.rms_norm_eps)
            k = _rms_norm(k, w[f"{p}.self_attn.k_norm.weight"], c.rms_norm_eps)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, S, D]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=0)  # [nh, S, D]
        v = v.repeat_interleave(nh // nkv, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(d)  # [nh, S, S]
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(model.dtype)
        attn = (probs @ v).transpose(0, 1).reshape(seq, nh * d)  # [S, nh*D]
        x = x + _linear(attn, w, f"{p}.self_attn.o_proj")
        h = _rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
        if c.moe_layer(i):
            x = x + _moe(h, w, c, moe_names(c, i))
            continue
        gate = _linear(h, w, f"{p}.mlp.gate_proj")
        up = _linear(h, w, f"{p}.mlp.up_proj")
        x = x + _linear(torch.nn.functional.silu(gate) * up, w, f"{p}.mlp.down_proj")
    x = _rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    return (x @ head.T).float()


def _moe(h: torch.Tensor, w: dict[str, torch.Tensor], c: ModelConfig, names: MoeNames) -> torch.Tensor:
    """The sparse MoE block, as HF computes it: h [S, H] -> [S, H]."""
    probs = torch.softmax((h @ w[names.router].T).float(), dim=-1)  # [S, E]
    top, chosen = probs.topk(c.num_experts_per_tok, dim=-1)  # [S, K]
    if c.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    top = top.to(h.dtype)
    out = torch.zeros_like(h)
    for e in sorted(set(chosen.flatten().tolist())):
        rows, k = (chosen == e).nonzero(as_tuple=True)
        x = h[rows]
        y = torch.nn.functional.silu(x @ w[names.gate[e]].T) * (x @ w[names.up[e]].T)
        out.index_add_(0, rows, (y @ w[names.down[e]].T) * top[rows, k, None])
    return out
