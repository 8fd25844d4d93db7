"""A loaded model's parameters and the parts of its definition every build shares: RoPE, and the
names of a sparse layer's weights.

``LoadedModel`` is what an engine process loads once (config, weights with HF names, tokenizer,
device, dtype); hot paths derive their state from it. ``moe_names`` names a sparse layer's router
and experts as its architecture's checkpoints do (Qwen3-MoE's ``mlp.gate`` and
``mlp.experts.E.{gate,up,down}_proj``, Mixtral's ``block_sparse_moe.gate`` and
``block_sparse_moe.experts.E.{w1,w3,w2}``). ``rope_inv_freq`` and ``rope_cos_sin`` are part of
the model's definition, shared by every build.

The network itself is the reference build's ``model.py``: one plain model, whose forward over a
KV cache computes the golden outputs and whose ``forward`` over a whole sequence is the cache-free
twin tests compare hot paths with. This module knows nothing about builds, knobs, KV caches,
batching or sampling, nor about checkpoint files (``runtime.checkpoint``) or the shape table
(``runtime.config``).

Shapes: D = head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from polymorph_engine.runtime.config import ModelConfig
from polymorph_engine.runtime.tokenizer import Tokenizer

__all__ = ["LoadedModel", "MoeNames", "Shard", "moe_names", "rope_cos_sin", "rope_inv_freq"]


@dataclass(frozen=True)
class Shard:
    """This process's part of a tensor-parallel model (``runtime.parallel``): rank ``rank`` of
    ``world``. A sharded ``LoadedModel`` holds its attention heads and MLP (and expert) rows only,
    its ``config`` counting this rank's heads and widths; ``all_reduce`` sums a partial output
    over the ranks (in place, returned). ``leader`` is set on rank 0 alone: the
    ``parallel.Leader`` through which a build loaded there is loaded on every rank."""

    rank: int
    world: int
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    leader: Any = None


@dataclass
class LoadedModel:
    """Everything loaded once per engine process; hot paths derive their state from it."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF names, e.g. "model.layers.0.self_attn.q_proj.weight"
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    source: str = ""
    shard: Shard | None = None  # tensor parallel: this rank's part (None: the whole model)

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
