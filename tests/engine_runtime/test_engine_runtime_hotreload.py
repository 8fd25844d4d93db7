"""Hot reload: swaps replace and release the previous build; memory stays bounded over 20 swaps."""

from __future__ import annotations

import gc
import math
import os
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine_support.builds import patched_build, sensitive_model, wrapping_build
from polymorph.contract.api import Gates
from polymorph.contract.builds import REFERENCE_BUILD, knob_variant
from polymorph.contract.errors import BuildError
from polymorph.contract.store import build_id
from polymorph_engine.experiment.verify import default_prompts, golden, verify
from polymorph_engine.runtime.checkpoint import load_model, weight_shapes
from polymorph_engine.runtime.config import SHAPES
from polymorph_engine.runtime.hotreload import Engine
from polymorph_engine.runtime.model import LoadedModel
from polymorph_engine.runtime.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return sensitive_model()


def test_a_swap_closes_the_previous_build_and_releases_it(model: LoadedModel, tmp_path: Path) -> None:
    marker = tmp_path / "closed"
    body = f"        open({str(marker)!r}, 'w').close()\n        return original()"
    first_dir = wrapping_build(tmp_path / "first", "first", "close", body)
    engine = Engine(model)
    first = engine.load_build(first_dir, {"fused_qkv": True})
    assert first.id == build_id(first_dir) and first.name == "first"
    assert first.knobs["fused_qkv"] is True and first.spec.knobs["fused_qkv"].default is False
    hotpath = weakref.ref(first.hotpath)
    variant = knob_variant(REFERENCE_BUILD, {"kv_cache": "static"}, tmp_path / "static")
    second = engine.load_build(variant)
    assert engine.current is second and engine.swaps == 2
    assert second.id == build_id(variant) != first.id and second.knobs["kv_cache"] == "static"
    assert marker.exists(), "the previous build's close() was not called"
    del first
    gc.collect()
    assert hotpath() is None, "the engine kept the old build alive"


def test_a_build_that_fails_to_load_leaves_the_engine_empty_and_usable(
    model: LoadedModel, tmp_path: Path
) -> None:
    engine = Engine(model)
    engine.load_build(REFERENCE_BUILD)
    broken = patched_build(
        tmp_path / "broken", "broken", [("import torch\n", "import torch\nimport no_such_module\n")]
    )
    with pytest.raises(BuildError, match="no_such_module"):
        engine.load_build(broken)
    assert engine.current is None
    with pytest.raises(RuntimeError, match="no build is loaded"):
        _ = engine.hotpath
    assert engine.load_build(REFERENCE_BUILD).hotpath is engine.hotpath


def test_a_build_whose_close_raises_does_not_stop_the_swap(model: LoadedModel, tmp_path: Path) -> None:
    bad_close = wrapping_build(
        tmp_path / "bad-close", "bad-close", "close", "        raise RuntimeError('no')"
    )
    engine = Engine(model)
    engine.load_build(bad_close)
    assert engine.load_build(REFERENCE_BUILD).name == "reference"


def _medium_model() -> LoadedModel:
    """~2M parameters: every swap derives ~8 MB (fused copies), so 20 leaked builds would show at once."""
    config = replace(
        SHAPES["tiny"],
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        head_dim=32,
    )
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for name, shape in weight_shapes(config).items():
        scale = 1.0 if len(shape) == 1 or name == "model.embed_tokens.weight" else 1 / math.sqrt(shape[1])
        weights[name] = torch.randn(shape, generator=gen) * scale
        if name.endswith("norm.weight"):
            weights[name] = 1 + 0.1 * weights[name]
    return LoadedModel(
        config, weights, ByteTokenizer(config.vocab_size), torch.device("cpu"), torch.float32, "medium"
    )


def _live_tensor_bytes() -> int:
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):  # type(), not isinstance: no __class__ lookups
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_stays_bounded_over_20_swaps(tmp_path: Path) -> None:
    model = _medium_model()
    fused = {"fused_qkv": True, "fused_gate_up": True}
    builds = [
        knob_variant(REFERENCE_BUILD, {**fused, "kv_cache": "static"}, tmp_path / "a"),
        knob_variant(REFERENCE_BUILD, {**fused, "attention": "sdpa"}, tmp_path / "b"),
    ]
    reference = golden(model, default_prompts(model.config.vocab_size, n=2), steps=3)
    # What the process holds before any build loads: earlier tests in this worker may leave tensors
    # alive, and they are no build's derived state.
    held = _live_tensor_bytes()
    engine = Engine(model)
    gates = Gates()

    def swap(i: int) -> None:
        loaded = engine.load_build(builds[i % 2])
        assert verify(loaded.hotpath, reference, gates).passed  # exercises caches too

    for i in range(2):
        swap(i)
    derived = _live_tensor_bytes() - held
    assert derived > 5_000_000, "the variants must derive sizeable state for this test to mean anything"
    tensors_before, rss_before = _live_tensor_bytes(), _rss_bytes()
    for i in range(20):
        swap(i)
    tensors_after, rss_after = _live_tensor_bytes(), _rss_bytes()
    assert tensors_after <= tensors_before * 1.01, (tensors_before, tensors_after)
    # 20 leaked builds would add 20 x `derived` bytes; allow one build's worth of allocator slack.
    assert rss_after - rss_before < derived, (rss_before, rss_after, derived)
    engine.close()
    assert _live_tensor_bytes() < tensors_before - derived * 0.9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device memory accounting needs a CUDA device")
def test_cuda_memory_stays_bounded_over_20_swaps(tmp_path: Path) -> None:
    model = load_model("tiny", device="cuda")
    fused = {"fused_qkv": True, "fused_gate_up": True, "kv_cache": "static"}
    builds = [
        knob_variant(REFERENCE_BUILD, {**fused, "decode_capture": "cuda_graph"}, tmp_path / "graphs"),
        knob_variant(REFERENCE_BUILD, {**fused, "attention": "sdpa"}, tmp_path / "sdpa"),
    ]
    reference = golden(model, default_prompts(model.config.vocab_size, n=2), steps=3)
    engine = Engine(model)
    for i in range(2):
        assert verify(
            engine.load_build(builds[i % 2]).hotpath, reference, Gates(), device=model.device
        ).passed
    before = torch.cuda.memory_allocated()
    for i in range(20):
        assert verify(
            engine.load_build(builds[i % 2]).hotpath, reference, Gates(), device=model.device
        ).passed
    assert torch.cuda.memory_allocated() <= before * 1.05 + (1 << 20)
