"""The sparse Mixture-of-Experts block of the reference build (Qwen3-MoE, Mixtral): routing, then
the selected experts' SwiGLU, weighted and summed.

``Moe`` is built once per sparse layer at load (``layers.prepare_layers``) and called as
``moe(h)``: h [..., H] -> [..., H]. The ``moe_routing`` and ``moe_experts`` knobs (build.toml
says what each value computes) pick its routing and its experts' implementation once, at load,
with the degradations build.toml names. ``loop`` reads the selected set on the host; a step that
cannot sync (captured into a CUDA graph, or traced by torch.compile) runs every expert over
every row weighted by its routing weight, zero where not selected: the same function with
static shapes. ``grouped`` probes ``torch._grouped_mm`` at load, and where it cannot run
gathers each row's experts out of the stacks (``_gather``, ``GATHER_ROWS`` rows at a time,
bounding the gathered copy in a prompt). ``gather`` was a value of its own until the devices
showed it never wins: 0.21x the Triton experts on qwen3-30b-a3b's sample workload on an H100
(its prompts copy every row's experts), level with grouped at batch 1 and 0.47x it at batch 8.
``triton`` runs its kernels on decode shapes (at most ``moe_kernels.TUNED_MAX_PAIRS`` pairs)
and ``grouped`` on prompts, where ``_grouped_mm`` runs: the kernels compute a pair per program,
GEMV-shaped, and a prompt of thousands of rows wants a tiled GEMM per expert (vLLM's fused_moe
pads each expert's pairs to blocks of rows for the same reason). On an H100, qwen3-30b-a3b's
sample workload ran 6-9% faster grouped than with the kernels on its prompts too (paired),
though the kernels decode 1.33x faster at batch 8
(``bench/results/search-quality-qwen3-30b-a3b-h100-2026-12-06-sweep.json``); with prompts run
grouped, the Triton experts lead that workload, 1.31x grouped (``...-b-sweep.json``).

The stacks are the loader's packed expert tensors (``expert_stacks``): no copy of the experts.
Nothing here knows about caches, attention or scheduling.
Shapes: T = rows, H = hidden, I = expert width, E = experts, K = experts per row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polymorph_engine.runtime.checkpoint import expert_stacks
from polymorph_engine.runtime.config import ModelConfig
from polymorph_engine.runtime.model import moe_names

from . import model

GATHER_ROWS = 16
"""Rows ``_gather`` handles per einsum: the gathered weights are GATHER_ROWS * K expert matrices."""


def _syncless() -> bool:
    """Whether the running step may not read device values on the host (capture or tracing)."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class Moe:
    """One sparse layer's router and experts; see the module docstring."""

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        config: ModelConfig,
        layer: int,
        *,
        routing: str = "plain",
        experts: str = "loop",
        triton_ok: bool = False,
    ) -> None:
        names = moe_names(config, layer)
        self.router = weights[names.router]  # [E, H]
        self.k, self.e, self.width = (
            config.num_experts_per_tok,
            config.num_experts,
            config.moe_intermediate_size,
        )
        self.norm_topk = config.norm_topk_prob
        self.routing = routing
        # Per expert: (gate [I, H], up [I, H], down [H, I]), views of the model's weights.
        self.experts = [
            (weights[g], weights[u], weights[d])
            for g, u, d in zip(names.gate, names.up, names.down, strict=True)
        ]
        self.w13: torch.Tensor | None = None  # [E, 2I, H]
        self.w2: torch.Tensor | None = None  # [E, H, I]
        if experts != "loop":
            self.w13, self.w2 = expert_stacks(config, weights, layer)
        if experts == "triton" and not triton_ok:
            experts = "grouped"  # documented degradation: no triton here
        if experts == "grouped" and not grouped_mm_usable(self.w13, self.w2):
            experts = "gather"  # documented degradation: torch._grouped_mm cannot run this
        self.mode = experts
        self.kernels = None
        self.prompts_grouped = False
        if experts == "triton":
            from . import moe_kernels  # optional extra: triton only when this knob value is chosen

            self.kernels = moe_kernels
            self.prompts_grouped = grouped_mm_usable(self.w13, self.w2)
        self._impl = {
            "loop": self._loop,
            "gather": self._gather,  # grouped's degradation, not a knob value
            "grouped": self._grouped,
            "triton": self._triton,
        }[experts]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        flat = h.reshape(-1, shape[-1])  # [T, H]
        weights, chosen = self.route(flat)
        return self._impl(flat, weights, chosen).reshape(shape)

    # --- routing ---

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """flat [T, H] -> routing weights [T, K] (activation dtype) and chosen experts [T, K] (int64)."""
        if self.routing == "fused":
            if self.kernels is not None:  # one launch after the router's projection
                return self.kernels.route(F.linear(flat, self.router), self.k, self.norm_topk, flat.dtype)
            logits = F.linear(flat, self.router).float()  # [T, E]
            top, chosen = logits.topk(self.k, dim=-1)
            if self.norm_topk:
                top = torch.softmax(top, dim=-1)
            else:
                top = (top - logits.logsumexp(dim=-1, keepdim=True)).exp()
            return top.to(flat.dtype), chosen
        return model.route(flat, self.router, self.k, self.norm_topk)

    # --- experts ---

    def _expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        return model.expert(x, *self.experts[e])

    def _loop(self, flat: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        if _syncless():
            out = torch.zeros_like(flat)
            for e in range(self.e):  # static shapes: every expert, zero weight where not chosen
                w = (weights * (chosen == e)).sum(dim=-1, keepdim=True)  # [T, 1]
                out += self._expert(flat, e) * w
            return out
        return model.experts_loop(flat, weights, chosen, self.experts)

    def _gather(self, flat: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        assert self.w13 is not None and self.w2 is not None
        parts = []
        for start in range(0, flat.shape[0], GATHER_ROWS):
            x, c = flat[start : start + GATHER_ROWS], chosen[start : start + GATHER_ROWS]
            gate, up = torch.einsum("th,tkoh->tko", x, self.w13[c]).chunk(2, dim=-1)  # [t, K, I]
            y = torch.einsum("tki,tkhi->tkh", F.silu(gate) * up, self.w2[c])  # [t, K, H]
            parts.append((y * weights[start : start + GATHER_ROWS, :, None]).sum(dim=1))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _sorted_pairs(
        self, flat: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The T*K (row, expert) pairs sorted by expert (stable): rows [T*K], their weights
        [T*K], sorted experts [T*K] and offsets [E] (int32: the end of each expert's run)."""
        rows, w, sorted_experts = model.pairs_by_expert(weights, chosen)
        ends = torch.searchsorted(sorted_experts, torch.arange(self.e, device=flat.device), right=True)
        return rows, w, sorted_experts, ends.to(torch.int32)

    def _grouped(self, flat: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        assert self.w13 is not None and self.w2 is not None
        if flat.dtype != torch.bfloat16 and torch.compiler.is_compiling():
            return self._gather(flat, weights, chosen)  # torch.compile's _grouped_mm takes bfloat16 only
        rows, w, _, offs = self._sorted_pairs(flat, weights, chosen)
        gate, up = torch._grouped_mm(flat[rows], self.w13.transpose(1, 2), offs=offs).chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.w2.transpose(1, 2), offs=offs)  # [T*K, H]
        return torch.zeros_like(flat).index_add_(0, rows, y * w[:, None])

    def _triton(self, flat: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        assert self.w13 is not None and self.w2 is not None and self.kernels is not None
        if self.prompts_grouped and flat.shape[0] * self.k > self.kernels.TUNED_MAX_PAIRS:
            return self._grouped(flat, weights, chosen)  # a prompt: one tiled GEMM per expert
        return self.kernels.fused_moe(flat, self.w13, self.w2, weights, chosen)

    def close(self) -> None:
        self.experts = []
        self.w13 = self.w2 = None


def grouped_mm_usable(w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` runs these stacks (their dtype, device and layout), probed
    on two rows."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    e = min(2, w13.shape[0])
    offs = torch.arange(1, e + 1, device=w13.device, dtype=torch.int32)
    try:
        torch._grouped_mm(w13.new_zeros(e, w13.shape[2]), w13[:e].transpose(1, 2), offs=offs)
        torch._grouped_mm(w2.new_zeros(e, w2.shape[2]), w2[:e].transpose(1, 2), offs=offs)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True
