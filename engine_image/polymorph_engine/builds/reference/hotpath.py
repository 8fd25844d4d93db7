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
from polymorph_engine.runtime.model import LoadedModel, rope_cos_sin

from . import layers as L
from . import model as M
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
        if model.shard is not None and model.shard.world > 1:
            refuse_parallel(knobs, capture, self.device)
        self._prefilled: weakref.WeakSet[StaticCache] = weakref.WeakSet()  # caches holding prefills
        self.nh, self.nkv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        # build.toml: the MoE knobs change nothing on a dense model (it computes as their defaults).
        self.inert_knobs = () if c.num_experts else ("moe_experts", "moe_routing")
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
        # model.py's network over these layers; the variants the knobs choose replace its parts.
        self.net: M.Transformer = M.Transformer(model, self.layers)
        if knobs["fused_qkv"]:
            self.net.project = L.project_qkv_fused
        if self.attention == "sdpa":
            self.net.attend = L.attention_sdpa
        self.fused: FusedDecoder | None = None
        if knobs["decode_step"] == "fused":
            self.fused = FusedDecoder(
                model.weights,
                c,
                self.net.inv_freq,
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
                reduce=model.shard.all_reduce if model.shard is not None and model.shard.world > 1 else None,
            )
        self._compiled = (
            torch.compile(self._static_step_full, dynamic=False) if self.capture == "compile" else None
        )

    def _kernels(self) -> contextlib.AbstractContextManager[None]:
        if self.attention == "sdpa" and self.device.type == "cuda":
            return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
        return contextlib.nullcontext()

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
        tokens = tokens.to(self.device)[None]  # [1, S]

        def kv(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            cache.store_prefill(i, slot, k, v)
            return k, v

        with self._kernels():
            x = self.net.forward(tokens, torch.arange(seq, device=self.device)[None], None, kv)  # causal
        cache.end_prefill(slot, seq)
        return self.net.logits(x[:, -1])[0]

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
        self.net = None  # type: ignore[assignment]  # everything derived from the model goes with it

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

        def kv(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            cache.store_prefill_rows(i, slot, k, v)
            return k, v

        mask = None  # causal: the padding comes last
        x = self.net.forward(tokens[None], torch.arange(p, device=self.device)[None], mask, kv)
        return self.net.logits(x[0].index_select(0, last))[0]

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

        def kv(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return cache.decode_kv(i, slots, k, v)

        x = self.net.forward(tokens[:, None], positions[:, None], mask, kv)  # [B, 1, H]
        cache.end_decode(slots)
        return self.net.logits(x[:, 0])

    def _static_step(
        self, cache: StaticCache, slots: torch.Tensor, tokens: torch.Tensor, attended: int
    ) -> torch.Tensor:
        """One decode step over a static cache: slots, tokens [B] on device -> logits [B, V].

        Reads positions from ``cache.lengths`` on the device; does not advance them."""
        positions = cache.lengths[slots]  # [B]
        mask = cache.decode_mask(positions, attended)  # [B, 1, 1, L]

        def kv(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return cache.decode_kv(i, slots, positions, attended, k, v)

        x = self.net.forward(tokens[:, None], positions[:, None], mask, kv)  # [B, 1, H]
        return self.net.logits(x[:, 0])

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


def refuse_parallel(knobs: Mapping[str, Any], capture: str, device: torch.device) -> None:
    """Refuse, in one sentence, the variants that do not run tensor parallel yet: compiled steps
    (an all-reduce inside a torch.compile graph), and on CUDA the captured ones (captured decode
    steps and bucketed prefill: their all-reduces would be captured into CUDA graphs, which no
    multi-GPU run has checked yet). The fused step runs, uncaptured (fused.py)."""
    refused = []
    if knobs["decode_step"] == "fused" and knobs["kernels"] == "compile":
        refused.append("decode_step = fused with kernels = compile")
    if capture != "none":
        refused.append(f"decode_capture = {capture}")
    if knobs["prefill"] == "bucketed" and device.type == "cuda":
        refused.append("prefill = bucketed on CUDA")
    if refused:
        verb = "does" if len(refused) == 1 else "do"
        raise ValueError(
            f"{' and '.join(refused)} {verb} not run tensor parallel yet (--tensor-parallel > 1): "
            "the uncaptured steps do, layered or fused (docs/tensor-parallel.md)."
        )


def load(model: LoadedModel, knobs: dict[str, Any]) -> ReferenceHotPath:
    return ReferenceHotPath(model, knobs)
