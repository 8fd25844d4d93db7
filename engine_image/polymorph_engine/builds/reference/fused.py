"""The fused decode step of the reference build (knob ``decode_step = "fused"``; build.toml
describes it and the knobs that tune it: ``kernels``, ``capture_buckets``, ``gemv``, ``pdl``,
``residual``).

One decode step over a ``StaticCache`` as few large operations per layer: the input norm fused
into one q/k/v projection, RoPE and the cache write in one operation, attention, the output
projection with its residual add, the MLP norm fused into one gate/up projection, SwiGLU fused
into the down projection with its residual add; then the final norm and the head. Positions come
from ``cache.lengths`` on the device and the step advances them itself, so on CUDA the whole
step, every layer and the head, is one CUDA graph per batch bucket, replayed with no host work
besides copying the slots and tokens in. What runs each operation is a class of fused_ops.py
(``TorchOps``, ``TritonOps``); ``kernels = "compile"`` compiles ``TorchOps`` per layer, one
compilation per bucket shared by all layers (every layer has the same shapes).

The fused step always uses fused q/k/v and gate/up weights (built once at load). A sparse (MoE)
layer runs ``_moe_layer``: the same attention, then the MLP norm and the layer's ``moe.Moe`` with
the residual add; which of the two each layer runs is chosen once, at load. It knows nothing
about prefill, scheduling or sampling.

Tensor parallel (``reduce``, a rank's all-reduce): each rank holds its heads and its share of
the MLP's (or each expert's) width, so the output projection and the down projection (or the MoE
block) give partial sums; each is all-reduced before its residual add, as ``model.py``'s
``out_sharded`` does, and the adds the kernels would fuse into those projections happen after the
reduce instead. The step then runs uncaptured: its all-reduces are not captured into CUDA graphs.
Shapes: B = rows (a bucket), H = hidden, I = intermediate, V = vocab, D = head dim.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import layers as L
from .capture import batch_buckets, capture
from .fused_ops import RopeFn, Shape, TorchOps, TritonOps
from .kvcache import StaticCache


def triton_usable(device: torch.device) -> bool:
    """Whether triton kernels can run on ``device``: CUDA, or CPU under the triton interpreter."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton  # noqa: F401  (optional extra: only this knob value needs it)
    except ImportError:
        return False
    return True


def pdl_usable(device: torch.device) -> bool:
    """Whether ``device`` takes programmatic dependent launches: CUDA, compute capability 9 or later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@dataclass
class Graph:
    """One captured step for a batch bucket: its static inputs and output."""

    slots: torch.Tensor  # [bucket] int64
    tokens: torch.Tensor  # [bucket] int64
    logits: torch.Tensor | None = None  # [bucket, V] float32, rewritten by each replay
    graph: Any = None  # torch.cuda.CUDAGraph
    host_slots: torch.Tensor | None = None  # [b] on the CPU: what ``slots`` holds now, if known


class FusedDecoder:
    """The fused step over a static cache; see the module docstring."""

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        config: Any,
        inv_freq: torch.Tensor,
        rope: RopeFn,
        *,
        kernels: str,
        attention: str,
        buckets: str,
        device: torch.device,
        gemv: str = "cublas",
        pdl: bool = False,
        residual: str = "projection",
        moe_routing: str = "plain",
        moe_experts: str = "loop",
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.reduce = reduce
        self.shape = Shape(
            config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.rms_norm_eps
        )
        self.layers = L.prepare_layers(
            weights,
            config.num_hidden_layers,
            fused_qkv=True,
            fused_gate_up=True,
            config=config,
            moe_routing=moe_routing,
            moe_experts=moe_experts,
            triton_ok=triton_usable(device),
        )
        self.embed = weights["model.embed_tokens.weight"]  # [V, H]
        self.final_norm = weights["model.norm.weight"]
        self.lm_head = self.embed if config.tie_word_embeddings else weights["lm_head.weight"]
        self.inv_freq = inv_freq  # [D/2] float32
        self.device, self.buckets = device, buckets
        if kernels == "triton" and not triton_usable(device):
            kernels = "torch"  # documented degradation: no triton here
        self.kernels = kernels
        self.ops = (
            TritonOps(self.shape, rope, attention, gemv, pdl and pdl_usable(device), residual)
            if kernels == "triton"
            else TorchOps(self.shape, rope, attention)
        )
        self._layer_fn: Callable[..., torch.Tensor] = self._layer
        moe_fn: Callable[..., torch.Tensor] = self._moe_layer
        if kernels == "compile":
            self._layer_fn = torch.compile(self._layer, fullgraph=True, dynamic=False)
            moe_fn = torch.compile(self._moe_layer, fullgraph=True, dynamic=False)
        # Each layer's function, chosen once: the dense layer, or the sparse one.
        self._layer_fns = [self._layer_fn if lw.moe is None else moe_fn for lw in self.layers]
        self._deferred_fns = [
            self._layer_deferred if lw.moe is None else self._moe_layer_deferred for lw in self.layers
        ]
        self.capture = device.type == "cuda" and reduce is None

    def _layer(
        self,
        x: torch.Tensor,
        lw: L.LayerWeights,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        """One decoder layer: x [B, H] -> [B, H]; writes this step's k, v into kc, vc."""
        assert lw.gate_up_proj is not None and lw.down_proj is not None
        x = self._attention(x, lw, kc, vc, slots, lengths)
        gu = self.ops.norm_linear(x, lw.mlp_norm, lw.gate_up_proj, None)  # [B, 2I]
        if self.reduce is not None:
            return x + self.reduce(self.ops.silu_linear(gu, lw.down_proj))
        return self.ops.silu_linear_residual(gu, lw.down_proj, x)

    def _attention(
        self,
        x: torch.Tensor,
        lw: L.LayerWeights,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        """A layer's attention half, dense or sparse: x [B, H] -> x + o_proj(attention(norm(x)))."""
        ops = self.ops
        assert lw.qkv_proj is not None
        qkv = ops.norm_linear(x, lw.attn_norm, lw.qkv_proj, lw.qkv_bias)  # [B, (nh+2nkv)*D]
        q = ops.rope_store(qkv, kc, vc, slots, lengths, self.inv_freq, lw.q_norm, lw.k_norm)  # [B, nh, D]
        attn = ops.attend(q, kc, vc, slots, lengths)  # [B, nh*D]
        if self.reduce is not None:
            return x + self.reduce(ops.linear(attn, lw.o_proj, lw.o_bias))
        return ops.linear_residual(attn, lw.o_proj, lw.o_bias, x)

    def _moe_layer(
        self,
        x: torch.Tensor,
        lw: L.LayerWeights,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        """``_layer`` of a sparse layer: the same attention, then x + moe(rms_norm(x))."""
        assert lw.moe is not None
        x = self._attention(x, lw, kc, vc, slots, lengths)
        return x + self._reduced(lw.moe(self.ops.add_norm(x, None, lw.mlp_norm)[1]))

    def _moe_layer_deferred(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None,
        lw: L.LayerWeights,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_layer_deferred`` of a sparse layer: the MoE block's output is the deferred add."""
        assert lw.moe is not None
        x, h = self._attention_deferred(x, y, lw, kc, vc, slots, lengths)
        return x, self._reduced(lw.moe(h))

    def _layer_deferred(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None,
        lw: L.LayerWeights,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_layer`` with the residual adds deferred: (x, y) [B, H] -> (x', y') with the layer's
        output x' + y'; each add happens inside the next norm's launch."""
        assert lw.gate_up_proj is not None and lw.down_proj is not None
        x, h = self._attention_deferred(x, y, lw, kc, vc, slots, lengths)
        gu = self.ops.linear(h, lw.gate_up_proj, None)  # [B, 2I]
        return x, self._reduced(self.ops.silu_linear(gu, lw.down_proj))

    def _attention_deferred(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None,
        lw: L.LayerWeights,
        kc: torch.Tensor,
        vc: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_attention`` with the residual adds deferred, dense or sparse: (x, y) -> (x', h), x'
        the residual after attention and h = mlp_norm(x'), the MLP's or the MoE block's input."""
        ops = self.ops
        assert lw.qkv_proj is not None
        x, h = ops.add_norm(x, y, lw.attn_norm)
        qkv = ops.linear(h, lw.qkv_proj, lw.qkv_bias)  # [B, (nh+2nkv)*D]
        q = ops.rope_store(qkv, kc, vc, slots, lengths, self.inv_freq, lw.q_norm, lw.k_norm)  # [B, nh, D]
        attn = ops.attend(q, kc, vc, slots, lengths)  # [B, nh*D]
        return ops.add_norm(x, self._reduced(ops.linear(attn, lw.o_proj, lw.o_bias)), lw.mlp_norm)

    def _reduced(self, partial: torch.Tensor) -> torch.Tensor:
        """A rank's partial sum all-reduced (tensor parallel), or ``partial`` as it is."""
        return partial if self.reduce is None else self.reduce(partial)

    def step(self, cache: StaticCache, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """slots, tokens [B] on the device -> float32 logits [B, V]; advances ``cache.lengths``
        of the slots (the scratch slot stays at 0)."""
        x = self.embed[tokens]  # [B, H]
        if getattr(self.ops, "deferred", False):
            y: torch.Tensor | None = None
            for i, (fn, lw) in enumerate(zip(self._deferred_fns, self.layers, strict=True)):
                x, y = fn(x, y, lw, cache.k[i], cache.v[i], slots, cache.lengths)
            logits = self.ops.logits(self.ops.add_norm(x, y, self.final_norm)[1], self.lm_head)
        else:
            for i, (fn, lw) in enumerate(zip(self._layer_fns, self.layers, strict=True)):
                x = fn(x, lw, cache.k[i], cache.v[i], slots, cache.lengths)
            logits = self.ops.head(x, self.final_norm, self.lm_head)
        cache.lengths.index_add_(0, slots, torch.ones_like(slots))
        cache.lengths.narrow(0, cache.scratch, 1).zero_()  # a kernel: `[i] = 0` would copy from the host
        return logits

    # --- capture ---

    def prepare(self, cache: StaticCache) -> None:
        """Compile / JIT and capture every bucket for ``cache`` (the prepare step, never a decode)."""
        pool = torch.cuda.graph_pool_handle() if self.capture else None
        for bucket in batch_buckets(cache.max_batch, self.buckets):
            g = Graph(
                slots=torch.full((bucket,), cache.scratch, dtype=torch.int64, device=self.device),
                tokens=torch.zeros(bucket, dtype=torch.int64, device=self.device),
            )
            with torch.no_grad(), _tuning(self.kernels):
                if not self.capture:
                    self.step(cache, g.slots, g.tokens)  # compile / JIT now, not on the first decode
                else:
                    g.graph, g.logits = capture(
                        functools.partial(self.step, cache, g.slots, g.tokens), self.device, pool
                    )
            cache.captured[bucket] = g

    @torch.no_grad()
    def decode(self, cache: StaticCache, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """slots [b] (host or device), tokens [b] -> logits [b, V]; advances device lengths."""
        b = int(slots.shape[0])
        fits = [k for k in cache.captured if k >= b]
        if not fits:
            raise ValueError(f"decode got {b} rows but this cache was prepared for at most {cache.max_batch}")
        g = cache.captured[min(fits)]
        assert isinstance(g, Graph)
        # A copy from pageable host memory waits for the stream to drain; successive steps of one
        # batch pass the same slots, so copy them only when they change and the host runs ahead.
        if slots.device.type != "cpu" or g.host_slots is None or not torch.equal(g.host_slots, slots):
            g.slots[:b].copy_(slots)
            g.slots[b:].fill_(cache.scratch)
            g.host_slots = slots.clone() if slots.device.type == "cpu" else None
        g.tokens[:b].copy_(tokens)
        if b < g.tokens.shape[0]:
            g.tokens[b:].zero_()
        if g.graph is None:
            return self.step(cache, g.slots, g.tokens)[:b]
        g.graph.replay()
        assert g.logits is not None
        return g.logits[:b].clone()  # the next replay overwrites the graph's output

    def close(self) -> None:
        for lw in self.layers:
            if lw.moe is not None:
                lw.moe.close()
        self.layers = []
        self._layer_fn = self._layer
        self._layer_fns, self._deferred_fns = [], []
        for name in ("embed", "final_norm", "lm_head", "inv_freq"):
            setattr(self, name, None)


def _tuning(kernels: str) -> contextlib.AbstractContextManager[Any]:
    """Inductor settings for the ``compile`` kernels, applied while they compile (in prepare)."""
    if kernels != "compile":
        return contextlib.nullcontext()
    # Lazy: importing inductor costs start-up time that only this knob value needs.
    import torch._inductor.config as inductor_config

    return inductor_config.patch(coordinate_descent_tuning=True)
