"""The reference build's fast knobs (``decode_step = "fused"`` and the knobs under it) against its
defaults, and each Triton kernel against its pure-PyTorch twin, on fresh random inputs.

Runs on CPU. The Triton kernels run through the triton interpreter (``TRITON_INTERPRET=1``, set
for this module's tests alone, before any of them loads a build) when the ``triton`` package is
installed; without it the kernel tests skip and ``kernels = "triton"`` is checked to degrade to
the torch twins. The variable is removed afterwards: every campaign a later test starts would
inherit it and run its Triton candidates through the interpreter, minutes each.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel, rope_cos_sin

INTERPRET = not torch.cuda.is_available()
"""On CPU, triton's own library functions must be wrapped for the interpreter when triton is
imported: set the variable for the import, and again for each test (``_triton_interpreter``)."""
try:
    with pytest.MonkeyPatch.context() as _env:
        if INTERPRET:
            _env.setenv("TRITON_INTERPRET", "1")
        import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

FUSED = {"kv_cache": "static", "decode_step": "fused", "sampling": "device"}
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")


@pytest.fixture(autouse=True, scope="module")
def _triton_interpreter() -> Any:
    """``TRITON_INTERPRET=1`` on CPU for this module (read when a build's kernels.py is imported),
    and a shim: triton 3.6's interpreter converts 1-element arrays with int(), which numpy >= 2.4
    refuses."""
    if not HAVE_TRITON or not INTERPRET:
        yield
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        import triton.runtime.interpreter as interp

        def patched(tensor: Any, scope: Any, original: Any = interp._patch_lang_tensor) -> None:
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        env.setattr(interp, "_patch_lang_tensor", patched)
        yield


def _prompt(n: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def run_scenario(
    model: LoadedModel, knobs: dict[str, Any], seed: int
) -> list[tuple[list[int], torch.Tensor]]:
    """Continuous batching through one cache (rows of different lengths, a slot freed and reused,
    batches smaller than the cache); returns (sequence so far, its next-token logits) per row."""
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD, knobs)
    vocab = model.config.vocab_size
    cache = hotpath.new_cache(3, 40)
    seqs: dict[int, list[int]] = {}
    events: list[tuple[list[int], torch.Tensor]] = []

    def prefill(slot: int, n: int, s: int) -> None:
        prompt = _prompt(n, vocab, seed * 100 + s)
        logits = hotpath.prefill(cache, slot, prompt)
        seqs[slot] = prompt.tolist()
        events.append((list(seqs[slot]), logits))
        seqs[slot].append(int(hotpath.sample(logits[None])[0]))

    def decode(slots: list[int], steps: int) -> None:
        for _ in range(steps):
            last = torch.tensor([seqs[s][-1] for s in slots])
            logits = hotpath.decode(cache, torch.tensor(slots), last)
            nxt = hotpath.sample(logits).tolist()
            for b, s in enumerate(slots):
                events.append((list(seqs[s]), logits[b].clone()))
                seqs[s].append(int(nxt[b]))

    prefill(0, 7, 1)
    prefill(2, 12, 2)
    decode([0, 2], 3)
    prefill(1, 3, 3)
    decode([2, 0, 1], 2)
    hotpath.free(cache, 0)  # reused by a shorter prompt: stale keys must not leak in
    prefill(0, 2, 4)
    decode([1, 0], 2)
    decode([0], 2)
    hotpath.close()
    return events


def _assert_agrees(
    got: list[tuple[list[int], torch.Tensor]], want: list[tuple[list[int], torch.Tensor]]
) -> None:
    assert len(got) == len(want)
    for (seq, logits), (wseq, wlogits) in zip(got, want, strict=True):
        assert seq == wseq  # greedy tokens equal
        torch.testing.assert_close(logits, wlogits, atol=1e-4, rtol=1e-4)


VARIANTS = [
    FUSED,
    {**FUSED, "capture_buckets": "max"},
    {**FUSED, "kernels": "triton"},
    {**FUSED, "kernels": "triton", "capture_buckets": "max", "attention": "sdpa"},
    {**FUSED, "kernels": "triton", "residual": "norm"},
]


@pytest.mark.parametrize("shape", ["tiny", "qwen2-tiny", "qwen3-tiny"])
@pytest.mark.parametrize("knobs", VARIANTS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_fused_step_agrees_with_the_defaults(shape: str, knobs: dict[str, Any]) -> None:
    model = load_model(shape, seed=5)
    _assert_agrees(run_scenario(model, knobs, seed=3), run_scenario(model, {}, seed=3))


@pytest.mark.parametrize("residual", ["projection", "norm"])
def test_fused_triton_gemv_agrees_with_the_defaults(residual: str) -> None:
    model = load_model("qwen2-tiny", seed=6)  # biases and a tied head: every gemv option
    knobs = {**FUSED, "kernels": "triton", "gemv": "triton", "residual": residual}
    _assert_agrees(run_scenario(model, knobs, seed=4), run_scenario(model, {}, seed=4))


def test_triton_kernels_degrade_to_torch_without_triton() -> None:
    hotpath, _, _ = load_hotpath(load_model("tiny", seed=1), REFERENCE_BUILD, {**FUSED, "kernels": "triton"})
    assert hotpath.fused is not None
    assert hotpath.fused.kernels == ("triton" if HAVE_TRITON else "torch")
    hotpath.close()


_COMPILE_CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
from test_fast_knobs import FUSED, _assert_agrees, run_scenario
from polymorph_engine.runtime.checkpoint import load_model

model = load_model(sys.argv[2], seed=5)
knobs = {**FUSED, "kernels": "compile", "capture_buckets": "max"}
if model.config.num_experts:  # stacked experts under torch.compile (grouped: gather outside bfloat16)
    knobs |= {"moe_experts": "grouped", "moe_routing": "fused"}
_assert_agrees(run_scenario(model, knobs, seed=3), run_scenario(model, {}, seed=3))
print("compiled layers agree")
"""


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["tiny", "qwen3-moe-tiny"])
def test_compiled_layers_agree_with_the_defaults(shape: str) -> None:
    # A child process: dynamo and inductor keep process-wide caches that would outlive the test.
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_CHECK, str(Path(__file__).parent), shape],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compiled layers agree" in result.stdout


# --- kernels against their twins ---------------------------------------------------------------


def _build_modules() -> tuple[Any, Any, Any]:
    """(hot path, fused module, GEMV module) of a freshly imported reference build; the modules
    stay importable while the caller holds the hot path."""
    hotpath, _, _ = load_hotpath(load_model("tiny", seed=1), REFERENCE_BUILD, {**FUSED, "kernels": "triton"})
    fused = sys.modules[type(hotpath.fused).__module__]
    return hotpath, fused, sys.modules[fused.__name__.rsplit(".", 1)[0] + ".gemv_kernels"]


def _ops(nh: int, nkv: int, d: int, gemv: str = "triton") -> tuple[Any, Any]:
    """(TritonOps, TorchOps) from a freshly imported reference build."""
    _hotpath, fused, _ = _build_modules()
    shape = fused.Shape(nh, nkv, d, 1e-5)
    return fused.TritonOps(shape, rope_cos_sin, "manual", gemv), fused.TorchOps(shape, rope_cos_sin, "manual")


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@needs_triton
@pytest.mark.parametrize("gemv", ["triton", "cublas"])
@pytest.mark.parametrize("rows", [1, 3])
def test_projections_match_the_twins(gemv: str, rows: int) -> None:
    fast, ref = _ops(4, 2, 16, gemv)
    n, k = 40, 5000  # neither a multiple of the tiles: masks and several K iterations are exercised
    x, w, res = _rand(rows, k, seed=1), _rand(n, k, seed=2) / k**0.5, _rand(rows, n, seed=3)
    nw, bias = 1 + 0.1 * _rand(k, seed=4), _rand(n, seed=5)
    gu, wd = _rand(rows, 2 * k, seed=6), _rand(n, k, seed=7) / k**0.5
    close = {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(fast.norm_linear(x, nw, w, bias), ref.norm_linear(x, nw, w, bias), **close)
    torch.testing.assert_close(
        fast.linear_residual(x, w, bias, res), ref.linear_residual(x, w, bias, res), **close
    )
    torch.testing.assert_close(
        fast.silu_linear_residual(gu, wd, res), ref.silu_linear_residual(gu, wd, res), **close
    )
    torch.testing.assert_close(fast.head(x, nw, w), ref.head(x, nw, w), **close)
    # The deferred-residual flow's pieces.
    torch.testing.assert_close(fast.linear(x, w, bias), ref.linear(x, w, bias), **close)
    torch.testing.assert_close(fast.silu_linear(gu, wd), ref.silu_linear(gu, wd), **close)
    torch.testing.assert_close(fast.logits(x, w), ref.logits(x, w), **close)
    y = _rand(rows, k, seed=8)
    for got, want in zip(fast.add_norm(x, y, nw), ref.add_norm(x, y, nw), strict=True):
        torch.testing.assert_close(got, want, **close)
    torch.testing.assert_close(fast.add_norm(x, None, nw)[1], ref.add_norm(x, None, nw)[1], **close)


@needs_triton
@pytest.mark.parametrize("blocks", [(2, 1024), (16, 256), (4, 4096)])
def test_every_gemv_tile_matches_torch(blocks: tuple[int, int]) -> None:
    # The tiles prepare tunes over: one K tile (the peeled first load alone), several, a ragged last.
    _hotpath, _, gemv = _build_modules()
    n, k, rows = 40, 3000, 2
    x, w, res, nw = (
        _rand(rows, k, seed=1),
        _rand(n, k, seed=2) / k**0.5,
        _rand(rows, n, seed=3),
        _rand(k, seed=4),
    )
    gu = _rand(rows, 2 * k, seed=5)
    close = {"atol": 1e-5, "rtol": 1e-5}
    got = gemv.gemv(x, w, torch.empty(rows, n), res=res, blocks=blocks)
    torch.testing.assert_close(got, res + x @ w.T, **close)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * nw
    got = gemv.gemv(x, w, torch.empty(rows, n), norm_weight=nw, blocks=blocks)
    torch.testing.assert_close(got, normed @ w.T, **close)
    gate, up = gu.chunk(2, dim=-1)
    got = gemv.gemv(gu, w, torch.empty(rows, n), silu_mul=True, blocks=blocks)
    torch.testing.assert_close(got, (torch.nn.functional.silu(gate) * up) @ w.T, **close)


@needs_triton
def test_gemv_tuning_candidates_cover_the_swept_winners() -> None:
    # Each shape's best tile in a sweep of the llama-1b and llama-8b decode shapes on an H200, as
    # (BLOCK_N, weight elements per iteration): the set prepare tunes over must hold them all.
    _hotpath, _, gemv = _build_modules()
    configs = gemv.gemv_configs()
    tiles = {(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"]) for c in configs}
    assert {(8, 4096), (16, 4096), (2, 8192), (4, 2048), (8, 16384), (2, 2048)} <= tiles
    assert len(tiles) == len(configs) <= 16  # distinct, and few: each one is compiled
    # Pruned to the shape: no tile wider than K.
    assert max(c.kwargs["BLOCK_K"] for c in gemv.fitting_configs("K")(configs, {"K": 1000})) <= 1024


@needs_triton
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_and_attention_match_the_twins(qk_norm: bool) -> None:
    nh, nkv, d, length, rows = 4, 2, 16, 300, 3
    fast, ref = _ops(nh, nkv, d)
    kc, vc = _rand(rows + 1, nkv, length, d, seed=1), _rand(rows + 1, nkv, length, d, seed=2)
    kc2, vc2 = kc.clone(), vc.clone()
    lengths = torch.tensor([5, 299, 130, 0])  # a short row, one at the cache's end, the scratch slot
    slots = torch.tensor([2, 0, 1])
    qkv = _rand(rows, (nh + 2 * nkv) * d, seed=3)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    qn, kn = (1 + 0.1 * _rand(d, seed=4), 1 + 0.1 * _rand(d, seed=5)) if qk_norm else (None, None)
    q1 = fast.rope_store(qkv, kc, vc, slots, lengths, inv, qn, kn)
    q2 = ref.rope_store(qkv, kc2, vc2, slots, lengths, inv, qn, kn)
    torch.testing.assert_close(q1, q2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc, kc2, atol=1e-5, rtol=1e-5)  # k and v landed at the same places
    torch.testing.assert_close(vc, vc2)
    out = fast.attend(q1, kc, vc, slots, lengths)
    torch.testing.assert_close(out, ref.attend(q2, kc2, vc2, slots, lengths), atol=1e-5, rtol=1e-5)
