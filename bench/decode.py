#!/usr/bin/env python
"""Batch decode throughput side by side, in one process on one GPU: peers and Polymorph builds.

Engines (the ``engine`` field of each row):
- ``hf-eager``: HF transformers' model of the architecture (``LlamaForCausalLM`` for the dense
  shapes, ``Qwen3MoeForCausalLM`` / ``MixtralForCausalLM`` for the MoE ones), dynamic cache,
  eager PyTorch;
- ``hf-compiled``: the same model with a ``StaticCache`` and the decode step under
  ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (HF's documented recipe); a MoE model
  asks for transformers' ``grouped_mm`` experts (its loop over the hit experts cannot be traced
  whole), and where the compiled step still fails to build, the row runs eagerly with the static
  cache and records ``compiled: false`` and the ``compile_error``;
- ``compiled-peer``: ``Peer`` below, a gpt-fast-style model written for this benchmark (fused
  q/k/v and gate/up weights, a static cache, SDPA over the whole cache under a mask, the decode
  step under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` with inductor's
  coordinate-descent tuning, as gpt-fast sets it); on a Mixture-of-Experts model ``MoePeer``,
  gpt-fast's Mixtral MoE (stacked expert weights, each token's selected experts' weights indexed
  out and applied by einsum, the top-k weights renormalised where the config asks) with the
  Qwen3 q/k norms where the model has them;
- ``polymorph``: a Polymorph build through its hot path (``new_cache`` / ``prefill`` / ``decode``
  / ``sample``, as the engine calls it): the reference build with its default knobs, and the
  reference build with the knobs of ``--knobs`` (the build the campaign found); each row names
  the build id and knobs.

Every engine decodes the same random weights (one ``LoadedModel`` per shape, shared by
reference: HF and the peer get views, never copies of the unfused weights). Protocol per row: B
random prompts of ``--prompt`` tokens are prefilled, ``--warmup`` decode steps run untimed, then
``--steps`` greedy decode steps are timed with CUDA events; ``tok_s`` = B * steps / seconds.
Prefill and prepare (capture, compile) are excluded and ``prepare_s`` reports the latter.
``--prefill-lengths`` also times, for every engine, a one-request prefill of each length (the
first token read back; a warm-up prefill of each length first, then the median of
``PREFILL_REPEATS``): ``prefill_ms`` maps the length to milliseconds. The peers prefill as their
recipes do: the compiled peer eagerly (gpt-fast compiles its decode step, not its prefill), HF in
its eager forward with a fresh cache.
``--workload FILE`` (a WorkloadProfile or trace, as ``polymorph compile`` reads it) composes, for
every row with prefill timings, ``shape_tok_s``: the workload's output tok/s laid out step by step
as the scheduler runs it (``polymorph.contract.steps.simulate``) with that engine's prefill costs
(piecewise linear through ``prefill_ms``) and every decode step at the row's batch step time (what
a decode step compiled for a fixed batch costs at any occupancy). ``--prefill-lengths`` defaults
to the lengths an experiment samples for that workload. It puts the peers on a shape beside a
build's full replay (``bench/fidelity.py``), as a peer serving that traffic at that batch would.

Roofline (``hot_vs_cold.decode_bytes_per_step``): bytes one step must read = every weight once
(an untied input embedding as B rows, a tied one once, as the head) + the KV cache of B rows at
the mean context, a MoE layer's experts counted as the E * (1 - (1 - k/E)^B) distinct ones B rows
select on average; ``roofline_tok_s`` = B * copy bandwidth / those bytes, the bandwidth measured in
this run by a 1 GiB device-to-device copy. ``roofline_fraction`` = tok_s / roofline_tok_s.

``--profile`` records, for each ``--knobs`` build and the compiled peer at batch 1, the top
kernels by device time over extra decode steps after the timed ones (torch.profiler);
``--profile-batches N,N`` does so at those batches (kernels launched inside CUDA graphs included). ``--verify`` judges every ``--knobs`` build on each model
against the reference build's golden outputs, as an experiment does (``experiment.verify``: the
default prompts, teacher-forced, the default gates) and records it under ``verification``. Rows
that fail record their error; rows past ``--budget-s`` are recorded as skipped, never silently
dropped.

Run on the GPU from the source tree: ``PYTHONPATH=operator:engine_image python bench/decode.py
--json --out bench/results/decode-h200-<date>.json --knobs kv_cache=static,decode_step=fused,...``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from polymorph.contract.builds import REFERENCE_BUILD, knob_variant, read_build, resolve_knobs
from polymorph.contract.errors import BuildError, UsageError

ENGINES = ("polymorph-reference", "polymorph", "compiled-peer", "hf-eager", "hf-compiled")
COMPILED = {"compiled-peer", "hf-compiled"}
PROFILE_STEPS = 32
PREFILL_REPEATS = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Batch decode tok/s: HF, a compiled peer, Polymorph builds.")
    p.add_argument("--models", default="llama-1b,llama-8b", help="comma-separated shapes")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument(
        "--compiled-batches", default="1,8,32", help="batches for the compiled peer (each compiles anew)"
    )
    p.add_argument("--hf-batches", default="1,8,32", help="batches for hf-compiled (each compiles anew)")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument(
        "--knobs",
        default="",
        help="the best build's knobs: name=value,name=value (several sets: ';' between)",
    )
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="compose each row's tok/s on this workload from its prefill and decode timings",
    )
    p.add_argument(
        "--prefill-lengths",
        default="",
        metavar="N,N,...",
        help="also time a one-request prefill of each length, every engine (default: none)",
    )
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda", help="cuda; cpu only for smoke runs of the script")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=1e9, help="skip rows that would start after this")
    p.add_argument(
        "--profile",
        action="store_true",
        help="top kernels of the --knobs builds and the compiled peer at batch 1",
    )
    p.add_argument(
        "--profile-batches",
        default="",
        metavar="N,N,...",
        help="as --profile, at these batches (implies --profile)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="verify every --knobs build against the reference build's golden outputs on each model",
    )
    p.add_argument("--out")
    p.add_argument("--json", action="store_true")
    return p


def parse_knobs(text: str) -> dict[str, Any]:
    """``a=static,b=true,c=4`` -> {"a": "static", "b": True, "c": 4}."""
    out: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, raw = item.partition("=")
        value: Any = raw
        if raw in ("true", "false"):
            value = raw == "true"
        elif raw.lstrip("-").isdigit():
            value = int(raw)
        out[name.strip()] = value
    return out


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"{flag} must be comma-separated positive integers, e.g. 1,8,32; got {text!r}")
    return values


def _profiled(args: argparse.Namespace, batch: int) -> bool:
    """Whether this batch's rows record a kernel profile (``--profile``: batch 1; ``--profile-batches``)."""
    if args.profile_batches.strip():
        return batch in _ints("--profile-batches", args.profile_batches)
    return bool(args.profile) and batch == 1


def _lengths(args: argparse.Namespace) -> list[int]:
    return _ints("--prefill-lengths", args.prefill_lengths) if args.prefill_lengths.strip() else []


def _workload(args: argparse.Namespace) -> Any:
    """The ``--workload`` (None without one); fills ``--prefill-lengths`` with its sampled lengths when not given."""
    if not args.workload:
        return None
    from polymorph.contract.steps import plan
    from polymorph.contract.workload import read_workload

    try:
        workload = read_workload(args.workload)[0]
    except UsageError as exc:
        raise SystemExit(f"--workload: {exc}") from None
    if not args.prefill_lengths.strip():
        args.prefill_lengths = ",".join(str(n) for n in plan(workload).prefill_lengths)
    return workload


def _check_flags(args: argparse.Namespace) -> tuple[list[int], dict[str, set[int]]]:
    """One line naming the flag for each bad value that takes no torch to judge; the batches and
    each compiled engine's batches. Run before torch loads when this is a script, so a typo is
    answered at once (``_check`` judges the rest: the device, the models, the dtype)."""
    bad = [e for e in args.engines.split(",") if e not in ENGINES]
    if bad or not args.engines:
        raise SystemExit(f"--engines must be comma-separated from {', '.join(ENGINES)}; got {args.engines!r}")
    batches = _ints("--batches", args.batches)
    _workload(args)
    _lengths(args)
    _profiled(args, 1)
    compiled_batches = {
        "compiled-peer": set(_ints("--compiled-batches", args.compiled_batches)),
        "hf-compiled": set(_ints("--hf-batches", args.hf_batches)),
    }
    for flag in ("prompt", "steps"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag} must be a positive integer; got {getattr(args, flag)}")
    if args.warmup < 0:
        raise SystemExit(f"--warmup must be >= 0; got {args.warmup}")
    spec = read_build(REFERENCE_BUILD)
    for text in (t for t in args.knobs.split(";") if t.strip()):
        try:
            resolve_knobs(spec, parse_knobs(text))
        except BuildError as exc:
            raise SystemExit(f"--knobs {text!r}: {exc}") from None
    return batches, compiled_batches


if __name__ == "__main__":  # a bad flag is answered before torch loads (seconds), then main checks the rest
    _check_flags(_parser().parse_args())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from polymorph_engine.runtime.checkpoint import load_model  # noqa: E402
from polymorph_engine.runtime.config import SHAPES, parse_dtype  # noqa: E402
from polymorph_engine.runtime.hotreload import build_id_of  # noqa: E402
from polymorph_engine.runtime.loader import load_hotpath  # noqa: E402
from polymorph_engine.runtime.model import rope_inv_freq  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hot_vs_cold import copy_bandwidth, decode_bytes_per_step  # noqa: E402  (a sibling script)

# --- timing ----------------------------------------------------------------------------------


def timed_decode(step: Callable[[], None], steps: int, warmup: int) -> float:
    """Seconds for ``steps`` calls of ``step`` after ``warmup`` untimed ones (CUDA events)."""
    for _ in range(warmup):
        step()
    if not torch.cuda.is_available():  # CPU smoke runs of this script
        t = time.perf_counter()
        for _ in range(steps):
            step()
        return time.perf_counter() - t
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def prompts(batch: int, length: int, vocab: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)  # [B, S]


def timed_prefills(
    prefill: Callable[[torch.Tensor], None], lengths: list[int], vocab: int, seed: int, device: torch.device
) -> dict[str, float]:
    """Milliseconds of ``prefill(tokens [S])`` (which must end with its first token on the host) per
    length: one warm-up call, then the median of ``PREFILL_REPEATS``."""
    out: dict[str, float] = {}
    for n in lengths:
        tokens = prompts(1, n, vocab, seed, device)[0]
        prefill(tokens)
        seconds = []
        for _ in range(PREFILL_REPEATS):
            _sync()
            t = time.perf_counter()
            prefill(tokens)
            seconds.append(time.perf_counter() - t)
        out[str(n)] = round(sorted(seconds)[len(seconds) // 2] * 1e3, 3)
    return out


# --- Polymorph --------------------------------------------------------------------------------


def run_polymorph(
    model: Any, build_dir: Path, knobs: dict[str, Any], batch: int, args: argparse.Namespace
) -> dict[str, Any]:
    hotpath, _, resolved = load_hotpath(model, build_dir, knobs)
    t = time.perf_counter()
    profiled = _profiled(args, batch) and bool(knobs) and torch.cuda.is_available()
    room = args.prompt + args.warmup + args.steps + (PROFILE_STEPS if profiled else 0) + 8
    cache = hotpath.new_cache(batch, room)
    _sync()
    prepare_s = time.perf_counter() - t
    toks = prompts(batch, args.prompt, model.config.vocab_size, args.seed, model.device)
    first = [hotpath.sample(hotpath.prefill(cache, b, toks[b])[None])[0] for b in range(batch)]
    state = {"tokens": torch.stack(first)}
    slots = torch.arange(batch)  # on the host, as the scheduler passes them

    def step() -> None:
        state["tokens"] = hotpath.sample(hotpath.decode(cache, slots, state["tokens"]))

    seconds = timed_decode(step, args.steps, args.warmup)
    profile = _profile_or_error(step) if profiled else None
    out = {
        "tok_s": batch * args.steps / seconds,
        "prepare_s": prepare_s,
        "knobs": resolved,
        "profile": profile,
    }
    lengths = _lengths(args)
    if lengths:
        del cache
        one = hotpath.new_cache(1, max(lengths) + 1)

        def prefill(tokens: torch.Tensor) -> None:
            int(hotpath.sample(hotpath.prefill(one, 0, tokens)[None])[0])
            hotpath.free(one, 0)

        out["prefill_ms"] = timed_prefills(prefill, lengths, model.config.vocab_size, args.seed, model.device)
    hotpath.close()
    return out


def verify_builds(
    args: argparse.Namespace, builds: list[tuple[Path, dict[str, Any]]], device: torch.device
) -> list[dict[str, Any]]:
    """Each build on each model of ``args.models`` against the reference's golden outputs."""
    from polymorph.contract.api import Gates  # lazy: only --verify needs the experiment's verify
    from polymorph_engine.experiment.verify import default_prompts, golden, verify

    out = []
    for name in args.models.split(","):
        model = load_model(name, device=device, dtype=args.dtype, seed=args.seed)
        want = golden(model, default_prompts(model.config.vocab_size), steps=8)
        for build_dir, knobs in builds:
            hotpath, _, resolved = load_hotpath(model, build_dir, knobs)
            try:
                got = verify(hotpath, want, Gates(), device)
            finally:
                hotpath.close()
            out.append(
                {"model": name, "build_id": build_id_of(build_dir), "knobs": resolved, **got.model_dump()}
            )
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
        del model, want
        gc.collect()
        torch.cuda.empty_cache()
    return out


def _profile_or_error(step: Callable[[], None]) -> dict[str, Any]:
    try:
        return kernel_profile(step, PROFILE_STEPS)
    except Exception as exc:  # the profile is evidence, not the figure: keep the row
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def kernel_profile(step: Callable[[], None], steps: int, top: int = 25) -> dict[str, Any]:
    """Top kernels by device time over ``steps`` calls of ``step``: per-step microseconds."""
    from torch.profiler import ProfilerActivity, profile  # lazy: only --profile needs it

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    total = 0.0
    for ev in prof.key_averages():
        us = float(getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0))
        if us <= 0 or ev.key.startswith(("ProfilerStep", "cudaGraph")):
            continue
        total += us
        rows.append((us, ev.key, ev.count))
    rows.sort(reverse=True)
    return {
        "steps": steps,
        "device_us_per_step": round(total / steps, 1),
        "top": [
            {
                "kernel": k[:120],
                "us_per_step": round(us / steps, 2),
                "calls_per_step": c / steps,
                "share": round(us / total, 4),
            }
            for us, k, c in rows[:top]
        ],
    }


# --- the compiled peer (gpt-fast style) -------------------------------------------------------


@dataclass
class PeerLayer:
    wqkv: torch.Tensor  # [(nh+2nkv)*D, H]
    wo: torch.Tensor  # [H, nh*D]
    w13: torch.Tensor  # [2I, H]
    w2: torch.Tensor  # [H, I]
    attn_norm: torch.Tensor  # [H]
    ffn_norm: torch.Tensor  # [H]
    k_cache: torch.Tensor  # [B, nkv, S, D]
    v_cache: torch.Tensor


class Peer:
    """A gpt-fast-style Llama: static cache, fused weights, SDPA over the whole cache under a mask."""

    def __init__(self, model: Any, batch: int, max_seq: int) -> None:
        c, w = model.config, model.weights
        self.c, self.nh, self.nkv, self.d = c, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        dev, dt = model.device, model.dtype
        self.layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}"
            a = f"{p}.self_attn"
            self.layers.append(
                PeerLayer(
                    wqkv=torch.cat([w[f"{a}.{n}_proj.weight"] for n in "qkv"]),
                    wo=w[f"{a}.o_proj.weight"],
                    w13=torch.cat([w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"]]),
                    w2=w[f"{p}.mlp.down_proj.weight"],
                    attn_norm=w[f"{p}.input_layernorm.weight"],
                    ffn_norm=w[f"{p}.post_attention_layernorm.weight"],
                    k_cache=torch.zeros(batch, self.nkv, max_seq, self.d, device=dev, dtype=dt),
                    v_cache=torch.zeros(batch, self.nkv, max_seq, self.d, device=dev, dtype=dt),
                )
            )
        self.embed = w["model.embed_tokens.weight"]
        self.norm = w["model.norm.weight"]
        self.head = self.embed if c.tie_word_embeddings else w["lm_head.weight"]
        inv = rope_inv_freq(c, dev)  # [D/2]
        freqs = torch.arange(max_seq, device=dev).float()[:, None] * inv  # [S, D/2]
        emb = torch.cat([freqs, freqs], -1)
        self.cos, self.sin = emb.cos().to(dt), emb.sin().to(dt)  # [S, D]
        self.causal = torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev).tril()
        # gpt-fast's weights and caches are an nn.Module's parameters and buffers, which
        # cudagraph trees keep at fixed addresses. These are plain tensors, so mark them: a graph
        # input without a static address is copied into the graph's own buffer at every replay
        # (every weight, every step), and a mutated one (the caches) disables the graphs.
        for t in self.static_tensors():
            torch._dynamo.mark_static_address(t)

    def static_tensors(self) -> list[torch.Tensor]:
        """Every tensor the decode step reads besides its arguments: weights, caches, tables."""
        out = [self.embed, self.norm, self.head, self.cos, self.sin, self.causal]
        for lw in self.layers:
            out += [lw.wqkv, lw.wo, lw.w13, lw.w2, lw.attn_norm, lw.ffn_norm, lw.k_cache, lw.v_cache]
        return out

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c.rms_norm_eps)).to(x.dtype)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]  # [1, 1, T, D]
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, T], pos [T] (shared by the rows) -> logits [B, V] of the last position."""
        b, t = tokens.shape
        x = self.embed[tokens]  # [B, T, H]
        mask = self.causal[pos][None, None]  # [1, 1, T, S]
        for lw in self.layers:
            qkv = F.linear(self._norm(x, lw.attn_norm), lw.wqkv)
            q, k, v = qkv.split([self.nh * self.d, self.nkv * self.d, self.nkv * self.d], -1)
            q = self._rope(q.view(b, t, self.nh, self.d).transpose(1, 2), pos)
            k = self._rope(k.view(b, t, self.nkv, self.d).transpose(1, 2), pos)
            lw.k_cache[:, :, pos] = k
            lw.v_cache[:, :, pos] = v.view(b, t, self.nkv, self.d).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, lw.k_cache, lw.v_cache, attn_mask=mask, enable_gqa=True)
            x = x + F.linear(y.transpose(1, 2).reshape(b, t, -1), lw.wo)
            g, u = F.linear(self._norm(x, lw.ffn_norm), lw.w13).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, lw.w2)
        return (self._norm(x[:, -1], self.norm) @ self.head.T).float()


@dataclass
class MoePeerLayer:
    wqkv: torch.Tensor  # [(nh+2nkv)*D, H]
    wo: torch.Tensor  # [H, nh*D]
    attn_norm: torch.Tensor  # [H]
    ffn_norm: torch.Tensor  # [H]
    k_cache: torch.Tensor  # [B, nkv, S, D]
    v_cache: torch.Tensor
    q_norm: torch.Tensor | None  # [D] (Qwen3-MoE)
    k_norm: torch.Tensor | None
    gate: torch.Tensor | None  # [E, H] router of a sparse layer
    w13: torch.Tensor  # [E, 2I, H] stacked experts (a dense layer: [2I, H])
    w2: torch.Tensor  # [E, H, I] (a dense layer: [H, I])


class MoePeer(Peer):
    """gpt-fast's Mixtral MoE over ``Peer``'s attention: stacked experts (the loader's packed
    stacks, no copy), each token's selected experts' weights indexed out and applied by einsum
    (``ConditionalFeedForward``), the top-k weights renormalised where the config asks; Qwen3-MoE's
    q/k norms and dense layers where the model has them."""

    MOE_CHUNK = 64
    """Tokens per gathered einsum in a prompt: gpt-fast gathers all of them at once, which for a
    long prompt of a large model is more memory than the GPU has."""

    def __init__(self, model: Any, batch: int, max_seq: int) -> None:
        from polymorph_engine.runtime.checkpoint import expert_stacks
        from polymorph_engine.runtime.model import moe_names

        c, w = model.config, model.weights
        self.c, self.nh, self.nkv, self.d = c, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        dev, dt = model.device, model.dtype
        self.moe_layers: list[MoePeerLayer] = []
        for i in range(c.num_hidden_layers):
            p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
            if c.moe_layer(i):
                w13, w2 = expert_stacks(c, w, i)
                gate: torch.Tensor | None = w[moe_names(c, i).router]
            else:
                w13 = torch.cat([w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"]])
                w2, gate = w[f"{p}.mlp.down_proj.weight"], None
            self.moe_layers.append(
                MoePeerLayer(
                    wqkv=torch.cat([w[f"{a}.{n}_proj.weight"] for n in "qkv"]),
                    wo=w[f"{a}.o_proj.weight"],
                    attn_norm=w[f"{p}.input_layernorm.weight"],
                    ffn_norm=w[f"{p}.post_attention_layernorm.weight"],
                    k_cache=torch.zeros(batch, self.nkv, max_seq, self.d, device=dev, dtype=dt),
                    v_cache=torch.zeros(batch, self.nkv, max_seq, self.d, device=dev, dtype=dt),
                    q_norm=w.get(f"{a}.q_norm.weight"),
                    k_norm=w.get(f"{a}.k_norm.weight"),
                    gate=gate,
                    w13=w13,
                    w2=w2,
                )
            )
        self.layers = []
        self.embed = w["model.embed_tokens.weight"]
        self.norm = w["model.norm.weight"]
        self.head = self.embed if c.tie_word_embeddings else w["lm_head.weight"]
        inv = rope_inv_freq(c, dev)
        freqs = torch.arange(max_seq, device=dev).float()[:, None] * inv
        emb = torch.cat([freqs, freqs], -1)
        self.cos, self.sin = emb.cos().to(dt), emb.sin().to(dt)
        self.causal = torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev).tril()
        for t in self.static_tensors():
            torch._dynamo.mark_static_address(t)

    def static_tensors(self) -> list[torch.Tensor]:
        out = [self.embed, self.norm, self.head, self.cos, self.sin, self.causal]
        for lw in self.moe_layers:
            out += [lw.wqkv, lw.wo, lw.w13, lw.w2, lw.attn_norm, lw.ffn_norm, lw.k_cache, lw.v_cache]
            out += [t for t in (lw.q_norm, lw.k_norm, lw.gate) if t is not None]
        return out

    def _experts(self, x: torch.Tensor, lw: MoePeerLayer) -> torch.Tensor:
        """gpt-fast's MOEFeedForward: x [T, H] -> [T, H]."""
        assert lw.gate is not None
        weights = F.softmax(F.linear(x, lw.gate).float(), dim=-1)  # [T, E]
        weights, chosen = torch.topk(weights, self.c.num_experts_per_tok, dim=-1)  # [T, A]
        if self.c.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = []
        for start in range(0, x.shape[0], self.MOE_CHUNK):
            xs, cs = x[start : start + self.MOE_CHUNK], chosen[start : start + self.MOE_CHUNK]
            g, u = torch.einsum("ti,taoi->tao", xs, lw.w13[cs]).chunk(2, -1)  # [T, A, I]
            y = torch.einsum("tao,taio->tai", F.silu(g) * u, lw.w2[cs])  # [T, A, H]
            out.append(torch.einsum("tai,ta->ti", y, weights[start : start + self.MOE_CHUNK]))
        return out[0] if len(out) == 1 else torch.cat(out)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, T], pos [T] (shared by the rows) -> logits [B, V] of the last position."""
        b, t = tokens.shape
        x = self.embed[tokens]  # [B, T, H]
        mask = self.causal[pos][None, None]  # [1, 1, T, S]
        for lw in self.moe_layers:
            qkv = F.linear(self._norm(x, lw.attn_norm), lw.wqkv)
            q, k, v = qkv.split([self.nh * self.d, self.nkv * self.d, self.nkv * self.d], -1)
            q, k = q.view(b, t, self.nh, self.d), k.view(b, t, self.nkv, self.d)
            if lw.q_norm is not None and lw.k_norm is not None:
                q, k = self._norm(q, lw.q_norm), self._norm(k, lw.k_norm)
            q, k = self._rope(q.transpose(1, 2), pos), self._rope(k.transpose(1, 2), pos)
            lw.k_cache[:, :, pos] = k
            lw.v_cache[:, :, pos] = v.view(b, t, self.nkv, self.d).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, lw.k_cache, lw.v_cache, attn_mask=mask, enable_gqa=True)
            x = x + F.linear(y.transpose(1, 2).reshape(b, t, -1), lw.wo)
            h = self._norm(x, lw.ffn_norm)
            if lw.gate is None:
                g, u = F.linear(h, lw.w13).chunk(2, -1)
                x = x + F.linear(F.silu(g) * u, lw.w2)
            else:
                x = x + self._experts(h.reshape(b * t, -1), lw).view(b, t, -1)
        return (self._norm(x[:, -1], self.norm) @ self.head.T).float()


def peer_for(model: Any, batch: int, max_seq: int) -> Peer:
    """The compiled peer of ``model``: ``MoePeer`` for a Mixture-of-Experts model, else ``Peer``."""
    return (MoePeer if model.config.is_moe else Peer)(model, batch, max_seq)


def run_peer(model: Any, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch._inductor.config as inductor_config

    profiled = _profiled(args, batch) and torch.cuda.is_available()
    max_seq = args.prompt + args.warmup + args.steps + (PROFILE_STEPS if profiled else 0) + 8
    peer = peer_for(model, batch, max_seq)
    toks = prompts(batch, args.prompt, model.config.vocab_size, args.seed, model.device)
    with torch.no_grad():
        first = peer.forward(toks, torch.arange(args.prompt, device=model.device)).argmax(-1)
        decode = torch.compile(peer.forward, mode="reduce-overhead", fullgraph=True)
        state = {"tok": first[:, None], "pos": torch.tensor([args.prompt], device=model.device)}

        def step() -> None:
            state["tok"] = decode(state["tok"], state["pos"]).argmax(-1)[:, None]
            state["pos"] += 1

        t = time.perf_counter()
        with inductor_config.patch({"coordinate_descent_tuning": True, "triton.unique_kernel_names": True}):
            for _ in range(3):
                step()  # compile and record the graph
        _sync()
        prepare_s = time.perf_counter() - t
        seconds = timed_decode(step, args.steps, max(0, args.warmup - 3))
        out: dict[str, Any] = {"tok_s": batch * args.steps / seconds, "prepare_s": prepare_s}
        if profiled:
            out["profile"] = _profile_or_error(step)
        lengths = _lengths(args)
        if lengths:
            del peer, decode, state
            one = peer_for(model, 1, max(lengths) + 8)

            def prefill(tokens: torch.Tensor) -> None:
                int(one.forward(tokens[None], torch.arange(len(tokens), device=model.device)).argmax(-1)[0])

            out["prefill_ms"] = timed_prefills(
                prefill, lengths, model.config.vocab_size, args.seed, model.device
            )
    return out


# --- HF transformers -------------------------------------------------------------------------


def hf_model(model: Any, compiled: bool = False) -> Any:
    """HF's model of the architecture whose parameters are the ``LoadedModel``'s tensors (no
    copies): ``LlamaForCausalLM`` for the dense shapes (their Qwen variants' extras aside), the
    architecture's own class for a MoE model; ``compiled`` asks a MoE model for transformers'
    ``grouped_mm`` experts, which torch.compile can trace."""
    import transformers  # lazy: an optional extra, HF rows only

    doc = model.config.to_hf(model.dtype)
    doc.pop("architectures", None)
    arch = doc.pop("model_type", None)
    if model.config.is_moe:
        if compiled:
            doc["experts_implementation"] = "grouped_mm"
        config = transformers.AutoConfig.for_model(arch, **doc)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(config)
        state = _hf_moe_state(model, hf.state_dict())
    else:
        config = transformers.LlamaConfig(**doc)
        with torch.device("meta"):
            hf = transformers.LlamaForCausalLM(config)
        state = dict(model.weights)
    if model.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    hf.load_state_dict(state, strict=False, assign=True)
    hf.tie_weights()
    inv = rope_inv_freq(model.config, model.device)  # [D/2]: the same llama3-scaled frequencies
    for module in hf.modules():  # the rotary buffers were made on the meta device: fill them
        for buffer in ("inv_freq", "original_inv_freq"):
            if isinstance(getattr(module, buffer, None), torch.Tensor):
                module.register_buffer(buffer, inv.clone(), persistent=False)
    return hf.eval()


def _hf_moe_state(model: Any, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``LoadedModel``'s weights under the HF model's own names: the checkpoint's names where
    they match (transformers 4: one module per expert), the packed expert stacks for transformers
    5's ``mlp.experts.gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I], the router by layer."""
    from polymorph_engine.runtime.checkpoint import expert_stacks
    from polymorph_engine.runtime.model import moe_names

    c, w = model.config, model.weights
    state: dict[str, torch.Tensor] = {}
    for key in hf_state:
        if key in w:
            state[key] = w[key]
            continue
        parts = key.split(".")
        if len(parts) < 4 or parts[:2] != ["model", "layers"] or not c.moe_layer(int(parts[2])):
            continue
        layer = int(parts[2])
        if key.endswith("experts.gate_up_proj"):
            state[key] = expert_stacks(c, w, layer)[0]
        elif key.endswith("experts.down_proj"):
            state[key] = expert_stacks(c, w, layer)[1]
        elif key.endswith("gate.weight"):
            state[key] = w[moe_names(c, layer).router]
        elif ".experts." in key:  # one module per expert, under names other than the checkpoint's
            e, proj = int(parts[-3]), parts[-2]
            names = moe_names(c, layer)
            by = {"gate_proj": names.gate, "w1": names.gate, "up_proj": names.up, "w3": names.up}
            state[key] = w[by.get(proj, names.down)[e]]
    return state


def run_hf(model: Any, batch: int, args: argparse.Namespace, compiled: bool) -> dict[str, Any]:
    from transformers import DynamicCache, StaticCache  # lazy: an optional extra, HF rows only

    hf = hf_model(model, compiled)
    dev = model.device
    toks = prompts(batch, args.prompt, model.config.vocab_size, args.seed, dev)
    max_len = args.prompt + args.warmup + args.steps + 8
    prepare_s = 0.0
    with torch.no_grad():
        if compiled:
            try:
                cache: Any = StaticCache(config=hf.config, max_batch_size=batch, max_cache_len=max_len)
            except TypeError:
                cache = StaticCache(config=hf.config, max_cache_len=max_len)
        else:
            cache = DynamicCache()
        out = hf(
            input_ids=toks,
            past_key_values=cache,
            use_cache=True,
            cache_position=torch.arange(args.prompt, device=dev),
        )
        state = {"tok": out.logits[:, -1].argmax(-1)[:, None], "pos": torch.tensor([args.prompt], device=dev)}

        def forward(tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            logits = hf(
                input_ids=tok,
                position_ids=pos[None].expand(tok.shape[0], 1),
                cache_position=pos,
                past_key_values=cache,
                use_cache=True,
                return_dict=False,
            )[0]
            return logits[:, -1]

        fn = torch.compile(forward, mode="reduce-overhead", fullgraph=True) if compiled else forward
        compile_error = None

        def step() -> None:
            state["tok"] = fn(state["tok"], state["pos"]).argmax(-1)[:, None]
            state["pos"] += 1

        if compiled:
            t = time.perf_counter()
            try:
                for _ in range(3):
                    step()
            except Exception as exc:
                if not model.config.is_moe:
                    raise
                # A MoE model's compiled step may not build: run it eagerly, static cache and all.
                compile_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                torch._dynamo.reset()
                fn = forward
            _sync()
            prepare_s = time.perf_counter() - t
        seconds = timed_decode(step, args.steps, max(0, args.warmup - (3 if compiled else 0)))
        out: dict[str, Any] = {"tok_s": batch * args.steps / seconds, "prepare_s": prepare_s}
        if compiled and model.config.is_moe:
            out["compiled"] = compile_error is None
            out["compile_error"] = compile_error
        lengths = _lengths(args)
        if lengths:
            del cache, state

            def prefill(tokens: torch.Tensor) -> None:
                n = len(tokens)
                logits = hf(
                    input_ids=tokens[None],
                    past_key_values=DynamicCache(),
                    use_cache=True,
                    cache_position=torch.arange(n, device=dev),
                ).logits
                int(logits[0, -1].argmax())

            out["prefill_ms"] = timed_prefills(prefill, lengths, model.config.vocab_size, args.seed, dev)
    return out


# --- driver ----------------------------------------------------------------------------------


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@contextlib.contextmanager
def _freed() -> Iterator[None]:
    try:
        yield
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        torch._dynamo.reset()


def shape_tok_s(workload: Any, row: dict[str, Any]) -> float | None:
    """``row``'s output tok/s on ``workload`` composed from its timings (see the module docstring)."""
    from polymorph.contract.steps import piecewise, simulate

    if not row.get("tok_s") or not row.get("prefill_ms"):
        return None
    step_s = row["batch"] / row["tok_s"]
    prefill_s = piecewise([(int(n), ms / 1e3) for n, ms in row["prefill_ms"].items()])
    timeline = simulate(workload, prefill_s, lambda _rows, _context: step_s, row["batch"])
    return timeline.output_tokens / timeline.duration_s


def _check(args: argparse.Namespace) -> tuple[list[int], dict[str, set[int]]]:
    """One line naming the flag for each bad value, before any model is built (``_check_flags``,
    then the device, the models and the dtype); the batches and each compiled engine's batches."""
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda: no CUDA device is visible (--device cpu runs a smoke test of the script)"
        )
    unknown = [m for m in args.models.split(",") if m not in SHAPES]
    if unknown or not args.models:
        raise SystemExit(f"--models must name shapes from {', '.join(sorted(SHAPES))}; got {args.models!r}")
    try:
        parse_dtype(args.dtype)
    except UsageError as exc:
        raise SystemExit(f"--{exc}") from None
    return _check_flags(args)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    batches, compiled_batches = _check(args)
    workload = _workload(args)
    started = time.perf_counter()
    device = torch.device(args.device)
    bandwidth = copy_bandwidth(args.device, (1 << 30) if device.type == "cuda" else (64 << 20))
    work = Path(tempfile.mkdtemp(prefix="polymorph-decode-"))
    builds: dict[str, tuple[Path, dict[str, Any]]] = {"polymorph-reference": (REFERENCE_BUILD, {})}
    candidates = []  # one "polymorph" engine per knob set of --knobs (sets separated by ';')
    for i, text in enumerate(t for t in args.knobs.split(";") if t.strip()):
        knobs = parse_knobs(text)
        builds[f"polymorph#{i}"] = (
            knob_variant(REFERENCE_BUILD, knobs, work / f"best-{i}", name="best"),
            knobs,
        )
        candidates.append(f"polymorph#{i}")
    engines: list[str] = []
    for e in (e for e in args.engines.split(",") if e):
        engines += candidates if e == "polymorph" else [e]
    rows: list[dict[str, Any]] = []
    verification = verify_builds(args, [builds[c] for c in candidates], device) if args.verify else []
    # Batch-major: the batch-1 rows of every model and engine come first, under the budget.
    for batch in batches:
        for name in args.models.split(","):
            model = load_model(name, device=device, dtype=args.dtype, seed=args.seed)
            elem = torch.empty((), dtype=model.dtype).element_size()
            for engine in engines:
                if engine in COMPILED and batch not in compiled_batches[engine]:
                    continue
                context = args.prompt + args.warmup + args.steps / 2
                roofline = batch * bandwidth / decode_bytes_per_step(model.config, elem, context, batch)
                row = _row(engine, name, batch, roofline)
                if engine in builds:
                    row["build_id"] = build_id_of(builds[engine][0])
                    row["build"] = "reference" if engine == "polymorph-reference" else "best"
                if time.perf_counter() - started > args.budget_s:
                    row["error"] = f"skipped: past the --budget-s of {args.budget_s:.0f} s"
                    rows.append(row)
                    continue
                t = time.perf_counter()
                try:
                    with _freed():
                        if engine in builds:
                            got = run_polymorph(model, *builds[engine], batch, args)
                        elif engine == "compiled-peer":
                            got = run_peer(model, batch, args)
                        else:
                            got = run_hf(model, batch, args, compiled=engine == "hf-compiled")
                    row.update(got)
                    row["tok_s"] = round(got["tok_s"], 2)
                    row["roofline_fraction"] = round(got["tok_s"] / roofline, 4)
                    row["prepare_s"] = round(got.get("prepare_s", 0.0), 2)
                    if workload is not None:
                        composed = shape_tok_s(workload, row)
                        row["shape_tok_s"] = round(composed, 2) if composed is not None else None
                except Exception as exc:  # a failing engine is a row with its error, not a lost run
                    row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                row["wall_s"] = round(time.perf_counter() - t, 1)
                if row.get("profile") is None:
                    row.pop("profile", None)
                rows.append(row)
                print(_line(row), file=sys.stderr, flush=True)
            del model
            gc.collect()
            torch.cuda.empty_cache()
    result = {
        "rows": rows,
        "verification": verification,
        "copy_bandwidth_GBps": round(bandwidth / 1e9, 1),
        "protocol": {
            "prompt": args.prompt,
            "steps": args.steps,
            "warmup": args.warmup,
            "dtype": args.dtype,
            "prefillLengths": _lengths(args),
            "workload": args.workload,
        },
        "device": {
            "name": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
            "count": torch.cuda.device_count(),
        },
        "versions": _versions(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text if args.json else "\n".join(_line(r) for r in rows))
    return 0


def _row(engine: str, model: str, batch: int, roofline: float) -> dict[str, Any]:
    return {
        "engine": "polymorph" if engine.startswith("polymorph") else engine,
        "model": model,
        "batch": batch,
        "tok_s": None,
        "roofline_fraction": None,
        "roofline_tok_s": round(roofline, 1),
        "build_id": None,
        "knobs": None,
    }


def _line(row: dict[str, Any]) -> str:
    name = row["engine"] + ("" if row.get("build") != "reference" else "(ref)")
    if row["tok_s"] is None:
        return f"{row['model']:9} b{row['batch']:<3} {name:18} {row.get('error', '')[:150]}"
    return (
        f"{row['model']:9} b{row['batch']:<3} {name:18} {row['tok_s']:9.1f} tok/s "
        f"{row['roofline_fraction']:6.1%} of {row['roofline_tok_s']:.0f}  prepare {row.get('prepare_s', 0):.1f}s"
    )


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("triton", "transformers"):
        with contextlib.suppress(ImportError):
            out[pkg] = __import__(pkg).__version__
    return out


if __name__ == "__main__":
    sys.exit(main())
