"""The reference build on Mixture-of-Experts models: the hot path against the cache-free forward,
and every MoE knob value (``moe_routing``, ``moe_experts``), alone, under the fused step and with
a bucketed prefill, against the default knobs' golden outputs, in float32 on CPU."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from test_fast_knobs import _assert_agrees, run_scenario  # a sibling test module (rootdir imports)

from engine_support.builds import forward
from polymorph.contract.builds import REFERENCE_BUILD, read_build
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel

MOE_SHAPES = ["qwen3-moe-tiny", "mixtral-tiny"]
STATIC = {"kv_cache": "static", "fused_qkv": True, "attention": "sdpa", "sampling": "device"}
FUSED = {**STATIC, "decode_step": "fused"}


def _moe_variants() -> list[dict[str, Any]]:
    spec = read_build(REFERENCE_BUILD)
    out: list[dict[str, Any]] = []
    for name in ("moe_routing", "moe_experts"):
        knob = spec.knobs[name]
        out += [{name: value} for value in knob.choices if value != knob.default]
    for experts in spec.knobs["moe_experts"].choices:
        out.append({**FUSED, "moe_experts": experts, "moe_routing": "fused"})
    out.append({**STATIC, "moe_experts": "grouped", "prefill": "bucketed"})
    out.append({**FUSED, "moe_experts": "grouped", "prefill": "bucketed", "capture_buckets": "max"})
    return out


@pytest.fixture(scope="module", params=MOE_SHAPES)
def moe_model(request: pytest.FixtureRequest) -> LoadedModel:
    return load_model(request.param, seed=5)


@pytest.fixture(scope="module")
def golden(moe_model: LoadedModel) -> list[tuple[list[int], torch.Tensor]]:
    return run_scenario(moe_model, {}, seed=3)


def test_the_default_hot_path_matches_the_cache_free_forward(
    moe_model: LoadedModel, golden: list[tuple[list[int], torch.Tensor]]
) -> None:
    for seq, logits in golden:
        torch.testing.assert_close(logits, forward(moe_model, torch.tensor(seq))[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("knobs", _moe_variants(), ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_every_moe_knob_value_agrees_with_the_defaults(
    moe_model: LoadedModel, golden: list[tuple[list[int], torch.Tensor]], knobs: dict[str, Any]
) -> None:
    _assert_agrees(run_scenario(moe_model, knobs, seed=3), golden)


def _moe_module(hotpath: Any) -> Any:
    return sys.modules[type(hotpath).__module__.rsplit(".", 1)[0] + ".moe"]


def test_the_loop_without_host_syncs_agrees(
    moe_model: LoadedModel, golden: list[tuple[list[int], torch.Tensor]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a captured or compiled step runs (every expert over every row, zero weight where not
    # chosen): forced here, since CPU never captures.
    hotpath, _, _ = load_hotpath(moe_model, REFERENCE_BUILD, {})
    moe = _moe_module(hotpath)
    calls = []
    monkeypatch.setattr(moe, "_syncless", lambda: calls.append(1) or True)
    flat = torch.randn(5, moe_model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    block = next(lw.moe for lw in hotpath.layers if lw.moe is not None)
    weights, chosen = block.route(flat)
    got = block._loop(flat, weights, chosen)
    monkeypatch.setattr(moe, "_syncless", lambda: False)
    torch.testing.assert_close(got, block._loop(flat, weights, chosen), atol=1e-6, rtol=1e-6)
    assert calls
    hotpath.close()


def test_routing_plain_and_fused_pick_the_same_experts_and_weights(moe_model: LoadedModel) -> None:
    hotpath, _, _ = load_hotpath(moe_model, REFERENCE_BUILD, {})
    block = next(lw.moe for lw in hotpath.layers if lw.moe is not None)
    flat = torch.randn(64, moe_model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    for norm in (True, False):
        block.norm_topk = norm
        block.routing = "plain"
        w_plain, c_plain = block.route(flat)
        block.routing = "fused"
        w_fused, c_fused = block.route(flat)
        assert torch.equal(c_plain, c_fused)
        torch.testing.assert_close(w_plain, w_fused, atol=1e-6, rtol=1e-5)
        assert torch.allclose(w_plain.sum(-1), torch.ones(64)) == norm
    hotpath.close()


def test_stacked_experts_are_the_models_own_tensors(moe_model: LoadedModel) -> None:
    # grouped and triton read the loader's packed stacks: no second copy of the experts.
    hotpath, _, _ = load_hotpath(moe_model, REFERENCE_BUILD, {"moe_experts": "grouped"})
    blocks = [lw.moe for lw in hotpath.layers if lw.moe is not None]
    assert blocks and all(b.mode == "grouped" for b in blocks)  # torch._grouped_mm runs on this CPU
    weights = set(t.untyped_storage().data_ptr() for t in moe_model.weights.values())
    assert all(b.w13.untyped_storage().data_ptr() in weights for b in blocks)
    hotpath.close()


def test_grouped_degrades_to_gather_where_grouped_mm_cannot_run(
    moe_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(torch, "_grouped_mm")
    hotpath, _, knobs = load_hotpath(moe_model, REFERENCE_BUILD, {"moe_experts": "grouped"})
    assert knobs["moe_experts"] == "grouped"
    blocks = [lw.moe for lw in hotpath.layers if lw.moe is not None]
    assert {b.mode for b in blocks} == {"gather"}
    flat = torch.randn(37, moe_model.config.hidden_size, generator=torch.Generator().manual_seed(4))
    for rows in (1, 37):  # a decode row, and more rows than one einsum gathers for
        weights, chosen = blocks[0].route(flat[:rows])
        torch.testing.assert_close(
            blocks[0](flat[:rows]), blocks[0]._loop(flat[:rows], weights, chosen), atol=1e-5, rtol=1e-5
        )
    hotpath.close()


def test_a_dense_model_ignores_the_moe_knobs() -> None:
    model = load_model("tiny", seed=2)
    knobs = {"moe_routing": "fused", "moe_experts": "grouped"}
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD, knobs)
    assert all(lw.moe is None and lw.down_proj is not None for lw in hotpath.layers)
    hotpath.close()
    _assert_agrees(run_scenario(model, knobs, seed=1), run_scenario(model, {}, seed=1))
