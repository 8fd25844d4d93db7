"""``moe_experts = "triton"`` (moe_kernels.py) against the default knobs and against a plain
computation, on CPU through the triton interpreter (test_fast_knobs' fixture sets it up for this
module alone); without triton it is checked to degrade to ``grouped``."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from test_fast_knobs import (  # a sibling test module (rootdir imports)
    HAVE_TRITON,
    _assert_agrees,
    _triton_interpreter,  # noqa: F401  (the module's autouse fixture: TRITON_INTERPRET=1 on CPU)
    run_scenario,
)

from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
FUSED = {"kv_cache": "static", "decode_step": "fused", "sampling": "device"}


@needs_triton
@pytest.mark.parametrize("shape", ["qwen3-moe-tiny", "mixtral-tiny"])
@pytest.mark.parametrize(
    "knobs",
    [{"moe_experts": "triton"}, {**FUSED, "moe_experts": "triton", "moe_routing": "fused"}],
    ids=["layered", "fused"],
)
def test_triton_experts_agree_with_the_defaults(shape: str, knobs: dict[str, Any]) -> None:
    model = load_model(shape, seed=5)
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD, knobs)
    assert {lw.moe.mode for lw in hotpath.layers if lw.moe is not None} == {"triton"}
    hotpath.close()
    _assert_agrees(run_scenario(model, knobs, seed=3), run_scenario(model, {}, seed=3))


@needs_triton
@pytest.mark.parametrize("rows", [1, 7])
def test_fused_moe_matches_a_plain_loop(rows: int) -> None:
    hotpath, _, _ = load_hotpath(
        load_model("qwen3-moe-tiny", seed=1), REFERENCE_BUILD, {"moe_experts": "triton"}
    )
    kernels = sys.modules[type(hotpath).__module__.rsplit(".", 1)[0] + ".moe_kernels"]
    g = torch.Generator().manual_seed(rows)
    t, h, width, e, k = rows, 72, 40, 6, 3  # not multiples of the tiles: every mask is exercised
    x = torch.randn(t, h, generator=g)
    w13, w2 = (
        torch.randn(e, 2 * width, h, generator=g) / h**0.5,
        torch.randn(e, h, width, generator=g) / width**0.5,
    )
    chosen = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=g)
    want = torch.zeros_like(x)
    for r in range(t):
        for j in range(k):
            gate, up = (w13[chosen[r, j]] @ x[r]).chunk(2)
            want[r] += weights[r, j] * (w2[chosen[r, j]] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(kernels.fused_moe(x, w13, w2, weights, chosen), want, atol=1e-5, rtol=1e-5)
    # Every tile the CUDA tuning may choose (at decode: one row here, the interpreter is slow)
    # computes the same (the masks cover each edge; tiles wider than these dimensions are
    # pruned there, and still correct here).
    tiles = {(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in kernels.moe_configs()}
    assert kernels.FIXED_BLOCKS in tiles
    for blocks in sorted(tiles) if rows == 1 else []:
        got = kernels.fused_moe(x, w13, w2, weights, chosen, blocks=blocks)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"tile {blocks}")
    hotpath.close()


@needs_triton
def test_a_prompt_runs_grouped_and_decode_runs_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    hotpath, _, _ = load_hotpath(
        load_model("qwen3-moe-tiny", seed=1), REFERENCE_BUILD, {"moe_experts": "triton"}
    )
    block = next(lw.moe for lw in hotpath.layers if lw.moe is not None)
    assert block.mode == "triton" and block.prompts_grouped  # torch._grouped_mm runs on this CPU
    kernels, grouped = block.kernels, block._grouped
    calls: list[str] = []
    monkeypatch.setattr(block, "_grouped", lambda *a: calls.append("grouped") or grouped(*a))
    fused_moe = kernels.fused_moe
    monkeypatch.setattr(kernels, "fused_moe", lambda *a, **k: calls.append("kernels") or fused_moe(*a, **k))
    g = torch.Generator().manual_seed(4)
    decode_rows, prompt_rows = kernels.TUNED_MAX_PAIRS // block.k, kernels.TUNED_MAX_PAIRS // block.k + 1
    for rows, path in ((decode_rows, "kernels"), (prompt_rows, "grouped")):
        flat = torch.randn(rows, block.router.shape[1], generator=g)
        weights, chosen = block.route(flat)
        got = block._triton(flat, weights, chosen)
        assert calls[-1] == path, (rows, calls)
        torch.testing.assert_close(got, block._loop(flat, weights, chosen), atol=1e-5, rtol=1e-5)
    hotpath.close()


@needs_triton
@pytest.mark.parametrize("renormalise", [True, False])
def test_the_routing_kernel_matches_the_reference_routing(renormalise: bool) -> None:
    hotpath, _, _ = load_hotpath(
        load_model("qwen3-moe-tiny", seed=1),
        REFERENCE_BUILD,
        {"moe_experts": "triton", "moe_routing": "fused"},
    )
    kernels = sys.modules[type(hotpath).__module__.rsplit(".", 1)[0] + ".moe_kernels"]
    reference = sys.modules[type(hotpath).__module__.rsplit(".", 1)[0] + ".model"]
    g = torch.Generator().manual_seed(int(renormalise))
    t, h, e, k = 5, 24, 12, 3  # E not a power of two: the padded lanes must never be chosen
    flat, router = torch.randn(t, h, generator=g), torch.randn(e, h, generator=g)
    want_weights, want_chosen = reference.route(flat, router, k, renormalise)
    weights, chosen = kernels.route(torch.nn.functional.linear(flat, router), k, renormalise, flat.dtype)
    assert torch.equal(chosen, want_chosen)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    hotpath.close()


def test_triton_experts_degrade_to_grouped_where_triton_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("triton runs on CUDA")
    hotpath, _, _ = load_hotpath(
        load_model("mixtral-tiny", seed=1), REFERENCE_BUILD, {"moe_experts": "triton"}
    )
    assert {lw.moe.mode for lw in hotpath.layers if lw.moe is not None} == {"grouped"}
    hotpath.close()
