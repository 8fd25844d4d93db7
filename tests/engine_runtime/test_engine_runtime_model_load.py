"""Model runtime: shapes, random weights, checkpoints through the real loader, tokenizers, RoPE."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from engine_support.builds import forward
from polymorph.contract.errors import UsageError
from polymorph_engine.runtime.checkpoint import load_model, save_checkpoint, weight_shapes
from polymorph_engine.runtime.config import SHAPES, ModelConfig
from polymorph_engine.runtime.model import rope_inv_freq
from polymorph_engine.runtime.tokenizer import ByteTokenizer, HFTokenizer


def _tokens(n: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _params(config: ModelConfig) -> int:
    return sum(math.prod(s) for s in weight_shapes(config).values())


def test_llama_shapes_match_the_published_models() -> None:
    one, eight = SHAPES["llama-1b"], SHAPES["llama-8b"]
    # Parameter counts of Llama-3.2-1B and Llama-3.1-8B as published.
    assert _params(one) == 1_235_814_400
    assert _params(eight) == 8_030_261_248
    assert one.tie_word_embeddings and not eight.tie_word_embeddings
    for c in (one, eight):
        assert (c.vocab_size, c.num_attention_heads, c.num_key_value_heads) == (128256, 32, 8)
        assert c.rope_scaling is not None and c.rope_theta == 500000.0
        assert c.rope_scaling.original_max_position_embeddings == 8192
    assert (one.hidden_size, one.intermediate_size, one.num_hidden_layers, one.head_dim) == (
        2048,
        8192,
        16,
        64,
    )
    assert (eight.hidden_size, eight.intermediate_size, eight.num_hidden_layers, eight.head_dim) == (
        4096,
        14336,
        32,
        128,
    )
    assert one.rope_scaling is not None and one.rope_scaling.factor == 32.0
    assert eight.rope_scaling is not None and eight.rope_scaling.factor == 8.0


def test_random_weights_are_seeded_and_typed() -> None:
    a, b, c = load_model("tiny", seed=0), load_model("tiny", seed=0), load_model("tiny", seed=1)
    assert list(a.weights) == list(weight_shapes(a.config))
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert not torch.equal(a.weights["model.embed_tokens.weight"], c.weights["model.embed_tokens.weight"])
    half = load_model("tiny", dtype="bf16")
    assert {t.dtype for t in half.weights.values()} == {torch.bfloat16}
    assert half.weights_bytes() * 2 == a.weights_bytes()
    assert isinstance(a.tokenizer, ByteTokenizer) and a.tokenizer.vocab_size == a.config.vocab_size
    assert "lm_head.weight" in a.weights and "lm_head.weight" not in load_model("qwen2-tiny").weights


@pytest.mark.parametrize("shape", ["tiny", "qwen2-tiny", "qwen3-tiny"])
@pytest.mark.parametrize("shard_bytes", [None, 40_000])
def test_checkpoint_round_trip_through_the_real_loader(
    tmp_path: Path, shape: str, shard_bytes: int | None
) -> None:
    model = load_model(shape, seed=3)
    save_checkpoint(model, tmp_path, shard_bytes=shard_bytes)
    if shard_bytes is None:
        assert (tmp_path / "model.safetensors").is_file()
    else:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
        assert set(index["weight_map"]) == set(model.weights)
    loaded = load_model(str(tmp_path))
    assert loaded.config == model.config
    assert repr(loaded.tokenizer) == repr(model.tokenizer)
    tokens = _tokens(17, model.config.vocab_size, seed=5)
    assert torch.equal(forward(loaded, tokens), forward(model, tokens))


def test_checkpoint_loads_in_another_dtype_and_ignores_extra_tensors(tmp_path: Path) -> None:
    model = load_model("tiny", seed=2)
    save_checkpoint(model, tmp_path)
    # Older HF checkpoints carry buffers such as rotary inv_freq, and tied models may keep lm_head.
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_model(str(tmp_path), dtype="bfloat16")
    assert set(loaded.weights) == set(model.weights)
    assert loaded.weights["model.norm.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(
        loaded.weights["model.norm.weight"].float(), model.weights["model.norm.weight"], atol=1e-2, rtol=1e-2
    )


def test_hf_tokenizer_is_saved_and_loaded(tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, "<eos>": 1, "hello": 2, "world": 3}
    impl = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    impl.pre_tokenizer = pre_tokenizers.Whitespace()
    model = replace(load_model("tiny"), tokenizer=HFTokenizer(impl, eos_id=1))
    save_checkpoint(model, tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = load_model(str(tmp_path))
    assert isinstance(loaded.tokenizer, HFTokenizer)
    assert loaded.tokenizer.encode("hello world") == [2, 3]
    assert loaded.tokenizer.decode([2, 3]) == "hello world"
    assert loaded.tokenizer.vocab_size == 4
    assert loaded.tokenizer.eos_id == 257  # from config.json's eos_token_id


def test_byte_tokenizer_round_trips_text_and_drops_non_bytes() -> None:
    tok = ByteTokenizer(vocab_size=128256, bos_id=128000, eos_id=128001)
    ids = tok.encode("héllo ✓")
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == "héllo ✓"
    assert tok.decode([128000, *ids, 9999, 128001]) == "héllo ✓"
    with pytest.raises(ValueError):
        ByteTokenizer(vocab_size=100)


def _one_sentence(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and msg.endswith("."), msg
    return msg


def test_bad_sources_give_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        load_model("llama-70b")
    assert "tiny" in _one_sentence(e.value)
    with pytest.raises(UsageError) as e:
        load_model("tiny", dtype="int8")
    assert "dtype" in _one_sentence(e.value)
    with pytest.raises(UsageError) as e:
        load_model(str(tmp_path))
    assert "config.json" in _one_sentence(e.value)
    if not torch.cuda.is_available():
        with pytest.raises(UsageError) as e:
            load_model("tiny", device="cuda")
        assert "device" in _one_sentence(e.value)
    with pytest.raises(UsageError) as e:
        load_model("tiny", device="tpu-please")
    assert "device" in _one_sentence(e.value)


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda cfg, ts: cfg.update(model_type="gpt2"), "model_type"),
        (lambda cfg, ts: cfg.update(hidden_act="gelu"), "hidden_act"),
        (lambda cfg, ts: cfg.update(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_scaling"),
        (lambda cfg, ts: ts.pop("model.layers.1.mlp.up_proj.weight"), "model.layers.1.mlp.up_proj.weight"),
        (lambda cfg, ts: ts.update({"model.norm.weight": torch.ones(3)}), "shape"),
    ],
)
def test_bad_checkpoints_name_the_field(tmp_path: Path, mutate: object, expect: str) -> None:
    save_checkpoint(load_model("tiny"), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    mutate(cfg, tensors)  # type: ignore[operator]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(UsageError) as e:
        load_model(str(tmp_path))
    assert expect in _one_sentence(e.value)


def test_checkpoint_without_tokenizer_is_refused(tmp_path: Path) -> None:
    save_checkpoint(load_model("tiny"), tmp_path)
    (tmp_path / "polymorph_tokenizer.json").unlink()
    with pytest.raises(UsageError) as e:
        load_model(str(tmp_path))
    assert "tokenizer.json" in _one_sentence(e.value)


def _llama3_inv_freq_straightforward(config: ModelConfig) -> list[float]:
    """Llama 3 RoPE scaling, one frequency at a time, as the Llama 3 reference code writes it."""
    s = config.rope_scaling
    assert s is not None
    out = []
    for i in range(0, config.head_dim, 2):
        freq = 1.0 / (config.rope_theta ** (i / config.head_dim))
        wavelen = 2 * math.pi / freq
        low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        if wavelen < high_freq_wavelen:
            out.append(freq)
        elif wavelen > low_freq_wavelen:
            out.append(freq / s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor
            )
            out.append((1 - smooth) * freq / s.factor + smooth * freq)
    return out


@pytest.mark.parametrize("shape", ["tiny", "llama-1b", "llama-8b"])
def test_llama3_rope_scaling_matches_a_straightforward_implementation(shape: str) -> None:
    config = SHAPES[shape]
    expected = torch.tensor(_llama3_inv_freq_straightforward(config), dtype=torch.float64)
    torch.testing.assert_close(rope_inv_freq(config).double(), expected, rtol=2e-6, atol=0.0)
    unscaled = rope_inv_freq(replace(config, rope_scaling=None)).double()
    # Every band is exercised: kept, divided by the factor, and smoothed in between.
    ratio = unscaled / expected
    assert config.rope_scaling is not None
    factor = config.rope_scaling.factor
    assert (ratio - 1).abs().min() < 1e-6
    assert (ratio - factor).abs().min() < 1e-4
    assert ((ratio > 1 + 1e-3) & (ratio < factor - 1e-3)).any()
