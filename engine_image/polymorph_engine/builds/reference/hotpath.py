"""Entry module of the reference build: ``load(model, knobs) -> ReferenceHotPath``.

The hot path over the model's layers (layers.py) and a KV cache (kvcache.py): exact prefill and
the layered decode step, and the variants chosen once, at load, from the knobs: the fused step
(fused.py), captured decode steps and bucketed prefill (captured with capture.py). With the
default knobs every step is the obvious one, and it produces the golden outputs every other build
is verified against. What each knob does, its default and what it requires are in build.toml,
read by ``knob_values``; nothing here repeats them.

With ``attention = "sdpa"`` on CUDA, prefill and eager decode run under ``sdpa_kernel`` without
the cuDNN backend: cuDNN builds an execution plan per new shape (every prompt length, every
attended length of an eager decode), which measured 3x slower than manual attention on an H200.
Captured decode steps have one shape per bucket, so they keep cuDNN, which was 2-3x faster there
than the alternatives for masked GQA attention. The context manager restores the global flags on
exit, so nothing leaks out of the build. ``decode_capture = "compile"`` uses the default inductor
mode: max-autotune would multiply prepare time per bucket, and ``reduce-overhead`` would add CUDA
graphs, which is the other knob value's job. A bucketed prefill's graph is captured at its
bucket's first prompt (a cache sees few of its buckets), its static inputs the padded tokens, the
slot and the last position as device tensors, so one graph serves every slot and length of its
bucket: an exact prefill is host-bound on an H200 (~1.25 ms of Python and launches per layer).

No module-level mutable state: everything derived from the model lives on the hot path object
and is dropped by ``close()``.

Shapes: S = prompt length, B = batch rows, V = vocab size, H = hidden size, D = head dim.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from polymorph.contract.builds import read_build, resolve_knobs
from polymorph_engine.runtime.model import LoadedModel, rope_cos_sin, rope_inv_freq

from . import layers as L
from .capture import batch_buckets, capture
from .fused import FusedDecoder, triton_usable
from .kvcache import ConcatCache, StaticCache


@dataclass
class Captured:
    """One captured decode step for a batch bucket: static inputs, and the graph or compiled fn."""

    slots: torch.Tensor  # [bucket] int64
    tokens: torch.Tensor  # [bucket] int64
    logits: torch.Tensor | None = None  # [bucket, V] written by graph replay
    graph: Any = None  # torch.cuda.CUDAGraph


@dataclass
class CapturedPrefill:
    """One prompt-length bucket's prefill over a static cache: static inputs, and on CUDA its graph."""

    tokens: torch.Tensor  # [P] int64: the prompt, then zeros
    slot: torch.Tensor  # [1] int64
    last: torch.Tensor  # [1] int64: position of the prompt's last token
    logits: torch.Tensor | None = None  # [V] float32 written by graph replay
    graph: Any = None  # torch.cuda.CUDAGraph


MIN_PREFILL_BUCKET = 16


def prefill_bucket(seq: int, max_seq_len: int) -> int | None:
    """The padded length of a ``seq``-token prompt: the smallest power of two >= ``seq`` from
    ``MIN_PREFILL_BUCKET`` up; None when it exceeds ``max_seq_len`` (the prompt runs exact)."""
    bucket = MIN_PREFILL_BUCKET
    while bucket < seq:
        bucket *= 2
    return bucket if bucket <= max_seq_len else None


class ReferenceHotPath:
    def __init__(self, model: LoadedModel, knobs: dict[str, Any]) -> None:
        knobs = knob_values(knobs)
        c = model.config
        self.config, self.device, self.dtype = c, model.device, model.dtype
        self.kv_cache, self.attention, self.sampling = (
            knobs["kv_cache"],
            knobs["attention"],
            knobs["sampling"],
        )
        self.prefill_mode = knobs["prefill"]
        # Device rules (build.toml's requires rules are applied by knob_values): cuda_graph needs
        # CUDA, and the fused step captures itself, superseding decode_capture.
        capture = knobs["decode_capture"]
        if (capture == "cuda_graph" and self.device.type != "cuda") or knobs["decode_step"] == "fused":
            capture = "none"
        self.capture = capture
        self._prefilled: weakref.WeakSet[StaticCache] = weakref.WeakSet()  # caches holding prefills
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.layers = L.prepare_layers(
            model.weights,
            c.num_hidden_layers,
            fused_qkv=knobs["fused_qkv"],
            fused_gate_up=knobs["fused_gate_up"],
            config=c,
            moe_routing=knobs["moe_routing"],
            moe_experts=knobs["moe_experts"],
            triton_ok=triton_usable(self.device),
        )
        self.embed = model.weights["model.embed_tokens.weight"]  # [V, H]
        self.final_norm = model.weights["model.norm.weight"]
        self.lm_head = self.embed if c.tie_word_embeddings else model.weights["lm_head.weight"]  # [V, H]
        self.inv_freq = rope_inv_freq(c, self.device)  # [D/2] float32
        self._attend = L.attention_sdpa if self.attention == "sdpa" else L.attention_manual
        self.fused: FusedDecoder | None = None
        if knobs["decode_step"] == "fused":
            self.fused = FusedDecoder(
                model.weights,
                c,
                self.inv_freq,
                rope_cos_sin,
                kernels=knobs["kernels"],
                attention=self.attention,
                buckets=knobs["capture_buckets"],
                device=self.device,
                gemv=knobs["gemv"],
                pdl=knobs["pdl"],
                residual=knobs["residual"],
                moe_routing=knobs["moe_routing"],
                moe_experts=knobs["moe_experts"],
            )
        self._compiled = (
            torch.compile(self._static_step_full, dynamic=False) if self.capture == "compile" else None
        )

    def _kernels(self) -> contextlib.AbstractContextManager[None]:
        if self.attention == "sdpa" and self.device.type == "cuda":
            return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
        return contextlib.nullcontext()

    # --- the network, over whatever cache the caller hands in ---

    def _layer_qkv(
        self, lw: L.LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> q [B, nh, T, D], k, v [B, nkv, T, D] (normed, rotated)."""
        h = L.rms_norm(x, lw.attn_norm, self.config.rms_norm_eps)
        q, k, v = L.project_qkv(lw, h, self.nh, self.nkv, self.d)
        if lw.q_norm is not None and lw.k_norm is not None:
            q = L.rms_norm(q, lw.q_norm, self.config.rms_norm_eps)
            k = L.rms_norm(k, lw.k_norm, self.config.rms_norm_eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return L.apply_rope(q, cos, sin), L.apply_rope(k, cos, sin), v

    def _layer_out(self, lw: L.LayerWeights, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual adds of attention output attn [B, nh, T, D] and the MLP; returns x [B, T, H]."""
        b, _, t, _ = attn.shape
        attn = attn.transpose(1, 2).reshape(b, t, self.nh * self.d)
        x = x + torch.nn.functional.linear(attn, lw.o_proj, lw.o_bias)
        h = L.rms_norm(x, lw.mlp_norm, self.config.rms_norm_eps)
        return x + lw.ffn(lw, h)  # the dense MLP or the MoE block, chosen per layer at load

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, H] -> float32 logits [B, V]."""
        return (L.rms_norm(x, self.final_norm, self.config.rms_norm_eps) @ self.lm_head.T).float()

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D]."""
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    # --- HotPath protocol ---

    def new_cache(self, max_batch: int, max_seq_len: int) -> ConcatCache | StaticCache:
        if max_batch < 1 or max_seq_len < 1:
            raise ValueError(
                f"a cache needs max_batch >= 1 and max_seq_len >= 1; got {max_batch}, {max_seq_len}"
            )
        c = self.config
        if self.kv_cache == "concat":
            return ConcatCache(c.num_hidden_layers, max_batch, max_seq_len, self.device)
        cache = StaticCache(
            c.num_hidden_layers, max_batch, max_seq_len, self.nkv, self.d, self.device, self.dtype
        )
        if self.fused is not None:
            with self._kernels():
                self.fused.prepare(cache)
        elif self.capture != "none":
            self._prepare_captures(cache)  # fixed shapes: every sdpa backend, cuDNN included
        return cache

    @torch.no_grad()
    def prefill(self, cache: ConcatCache | StaticCache, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        seq = int(tokens.shape[0])
        if self.prefill_mode == "bucketed" and isinstance(cache, StaticCache):
            bucket = prefill_bucket(seq, cache.max_seq_len)
            if bucket is not None:
                return self._prefill_bucketed(cache, slot, tokens, bucket)
        cache.begin_prefill(slot, seq)
        tokens = tokens.to(self.device)
        x = self.embed[tokens][None]  # [1, S, H]
        cos, sin = self._rope(torch.arange(seq, device=self.device)[None])
        with self._kernels():
            for i, lw in enumerate(self.layers):
                q, k, v = self._layer_qkv(lw, x, cos, sin)
                cache.store_prefill(i, slot, k, v)
                x = self._layer_out(lw, x, self._attend(q, k, v, None))  # causal over the prompt itself
        cache.end_prefill(slot, seq)
        return self._logits(x[:, -1])[0]

    @torch.no_grad()
    def decode(
        self, cache: ConcatCache | StaticCache, slots: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        slot_list = [int(s) for s in slots.tolist()]  # free when the scheduler passes CPU slots
        if len(set(slot_list)) != len(slot_list):
            raise ValueError(f"decode got the same slot twice: {slot_list}")
        tokens = tokens.to(self.device)
        if isinstance(cache, ConcatCache):
            with self._kernels():
                return self._decode_concat(cache, slot_list, tokens)
        attended = cache.check_decode(slot_list)
        if self.fused is not None:
            with self._kernels():
                logits = self.fused.decode(cache, slots, tokens)  # advances the device lengths itself
            cache.advance_host(slot_list)
            return logits
        slots_dev = slots.to(self.device)
        if self.capture == "none":
            with self._kernels():
                logits = self._static_step(cache, slots_dev, tokens, attended)
        else:
            logits = self._decode_captured(cache, slots_dev, tokens)
        cache.end_decode(slot_list, slots_dev)
        return logits

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sampling == "device":
            return logits.argmax(dim=-1)
        return logits.to("cpu").argmax(dim=-1).to(self.device)  # one host sync per step

    def free(self, cache: ConcatCache | StaticCache, slot: int) -> None:
        cache.free(slot)

    def close(self) -> None:
        for cache in list(self._prefilled):  # a cache that outlives its hot path keeps no graph
            cache.prefills.clear()
        self._prefilled = weakref.WeakSet()
        for lw in self.layers:
            if lw.moe is not None:
                lw.moe.close()
        self.layers = []
        self._compiled = None
        if self.fused is not None:
            self.fused.close()
            self.fused = None
        for name in ("embed", "final_norm", "lm_head", "inv_freq"):
            setattr(self, name, None)

    # --- bucketed prefill ---

    def _prefill_bucketed(
        self, cache: StaticCache, slot: int, tokens: torch.Tensor, bucket: int
    ) -> torch.Tensor:
        """Prefill ``tokens`` [S] padded to ``bucket``: replays the bucket's graph on CUDA, runs the
        padded step eagerly elsewhere. The live length is S; rows [S, bucket) hold padding."""
        seq = int(tokens.shape[0])
        cache.begin_prefill(slot, seq)
        cap = cache.prefills.get(bucket)
        if cap is None:
            cap = self._new_prefill(cache, bucket)
        assert isinstance(cap, CapturedPrefill)
        cap.tokens[:seq].copy_(tokens)
        cap.tokens[seq:].zero_()
        cap.slot.fill_(slot)  # fills with a host scalar: a kernel argument, no copy
        cap.last.fill_(seq - 1)
        if cap.graph is not None:
            cap.graph.replay()
            assert cap.logits is not None
            logits = cap.logits.clone()  # the next replay overwrites the graph's output
        else:
            with self._kernels():
                logits = self._prefill_padded(cache, cap.tokens, cap.slot, cap.last)
        cache.end_prefill(slot, seq)
        return logits

    def _prefill_padded(
        self, cache: StaticCache, tokens: torch.Tensor, slot: torch.Tensor, last: torch.Tensor
    ) -> torch.Tensor:
        """The bucketed step, fixed shapes, no host sync: tokens [P] (a prompt padded at the end),
        slot, last [1] on the device -> float32 logits [V] of position ``last``; writes k, v of all
        P positions into rows [0, P) of the slot."""
        p = tokens.shape[0]
        x = self.embed[tokens][None]  # [1, P, H]
        cos, sin = self._rope(torch.arange(p, device=self.device)[None])
        for i, lw in enumerate(self.layers):
            q, k, v = self._layer_qkv(lw, x, cos, sin)
            cache.store_prefill_rows(i, slot, k, v)
            x = self._layer_out(lw, x, self._attend(q, k, v, None))  # causal: the padding comes last
        return self._logits(x[0].index_select(0, last))[0]

    def _new_prefill(self, cache: StaticCache, bucket: int) -> CapturedPrefill:
        """The static inputs of ``bucket`` for ``cache``, and on CUDA its graph: two warm-up runs
        on a side stream, then the capture, into the pool of the cache's other prefill graphs.
        Warm-up writes only the scratch slot's rows."""
        cap = CapturedPrefill(
            tokens=torch.zeros(bucket, dtype=torch.int64, device=self.device),
            slot=torch.full((1,), cache.scratch, dtype=torch.int64, device=self.device),
            last=torch.zeros(1, dtype=torch.int64, device=self.device),
        )
        if self.device.type == "cuda":
            graphs = [c.graph for c in cache.prefills.values() if isinstance(c, CapturedPrefill)]
            pool = graphs[0].pool() if graphs else None  # one pool for all of the cache's prefills
            with self._kernels():
                cap.graph, cap.logits = capture(
                    functools.partial(self._prefill_padded, cache, cap.tokens, cap.slot, cap.last),
                    self.device,
                    pool,
                )
        cache.prefills[bucket] = cap
        self._prefilled.add(cache)
        return cap

    # --- decode variants ---

    def _decode_concat(self, cache: ConcatCache, slots: list[int], tokens: torch.Tensor) -> torch.Tensor:
        positions, mask = cache.begin_decode(slots)  # [B], [B, 1, 1, L]
        x = self.embed[tokens][:, None]  # [B, 1, H]
        cos, sin = self._rope(positions[:, None])
        for i, lw in enumerate(self.layers):
            q, k, v = self._layer_qkv(lw, x, cos, sin)
            keys, values = cache.decode_kv(i, slots, k, v)
            x = self._layer_out(lw, x, self._attend(q, keys, values, mask))
        cache.end_decode(slots)
        return self._logits(x[:, 0])

    def _static_step(
        self, cache: StaticCache, slots: torch.Tensor, tokens: torch.Tensor, attended: int
    ) -> torch.Tensor:
        """One decode step over a static cache: slots, tokens [B] on device -> logits [B, V].

        Reads positions from ``cache.lengths`` on the device; does not advance them."""
        positions = cache.lengths[slots]  # [B]
        mask = cache.decode_mask(positions, attended)  # [B, 1, 1, L]
        x = self.embed[tokens][:, None]  # [B, 1, H]
        cos, sin = self._rope(positions[:, None])
        for i, lw in enumerate(self.layers):
            q, k, v = self._layer_qkv(lw, x, cos, sin)
            keys, values = cache.decode_kv(i, slots, positions, attended, k, v)
            x = self._layer_out(lw, x, self._attend(q, keys, values, mask))
        return self._logits(x[:, 0])

    def _static_step_full(
        self, cache: StaticCache, slots: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        """The captured step: fixed shapes, attends over all of ``max_seq_len``."""
        return self._static_step(cache, slots, tokens, cache.max_seq_len)

    def _prepare_captures(self, cache: StaticCache) -> None:
        pool = torch.cuda.graph_pool_handle() if self.capture == "cuda_graph" else None
        for bucket in batch_buckets(cache.max_batch):  # largest first: the pool is reused
            cap = Captured(
                slots=torch.full((bucket,), cache.scratch, dtype=torch.int64, device=self.device),
                tokens=torch.zeros(bucket, dtype=torch.int64, device=self.device),
            )
            with torch.no_grad():
                if self.capture == "compile":
                    assert self._compiled is not None
                    self._compiled(cache, cap.slots, cap.tokens)  # compile now, not on the first decode
                else:
                    cap.graph, cap.logits = capture(
                        functools.partial(self._static_step_full, cache, cap.slots, cap.tokens),
                        self.device,
                        pool,
                    )
            cache.captured[bucket] = cap
        # Warm-up wrote only into the scratch slot; reset its length anyway.
        cache.lengths[cache.scratch] = 0

    def _decode_captured(self, cache: StaticCache, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        b = slots.shape[0]
        bucket = min(k for k in cache.captured if k >= b)
        cap = cache.captured[bucket]
        assert isinstance(cap, Captured)
        cap.slots[:b].copy_(slots)
        cap.slots[b:].fill_(cache.scratch)
        cap.tokens[:b].copy_(tokens)
        cap.tokens[b:].zero_()
        if cap.graph is not None:
            cap.graph.replay()
            assert cap.logits is not None
            return cap.logits[:b].clone()  # the graph overwrites its output on the next replay
        assert self._compiled is not None
        return self._compiled(cache, cap.slots, cap.tokens)[:b]


def knob_values(knobs: Mapping[str, object]) -> dict[str, Any]:
    """Every knob's value as this build runs it: ``knobs`` over build.toml's defaults, then each
    knob whose ``requires`` are not met set back to its default, until nothing changes (so
    ``prefill = "bucketed"`` with ``kv_cache = "concat"`` runs exact, and ``kernels`` is the
    default unless the fused step runs). build.toml is the one place knobs are declared."""
    spec = read_build(Path(__file__).parent)
    values: dict[str, Any] = resolve_knobs(spec, knobs)
    changed = True
    while changed:
        changed = False
        for name, knob in spec.knobs.items():
            unmet = any(values[other] != value for other, value in knob.requires.items())
            if unmet and values[name] != knob.default:
                values[name], changed = knob.default, True
    return values


def load(model: LoadedModel, knobs: dict[str, Any]) -> ReferenceHotPath:
    return ReferenceHotPath(model, knobs)
