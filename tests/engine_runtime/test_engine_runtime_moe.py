"""Mixture-of-Experts models (Qwen3-MoE, Mixtral): config.json, the checkpoint layout, the packed
expert stacks, the reference forward against HF transformers' own model on the same files, and
the reference build's hot path against the cache-free forward."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engine_support.builds import forward
from polymorph.contract.errors import UsageError
from polymorph_engine.runtime.checkpoint import expert_stacks, load_model, save_checkpoint, weight_shapes
from polymorph_engine.runtime.config import SHAPES, ModelConfig
from polymorph_engine.runtime.model import LoadedModel, moe_names

MOE_SHAPES = ["qwen3-moe-tiny", "mixtral-tiny"]

HF_LOGITS_ATOL = 1e-4
"""Largest |logit difference| allowed between the reference forward and HF's model in float32
(measured: about 2e-6 on both tiny shapes; logits are O(4))."""


def _tokens(n: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_qwen3_30b_a3b_is_the_published_shape() -> None:
    c = SHAPES["qwen3-30b-a3b"]
    # Qwen3-30B-A3B: 30.5B parameters, 3.3B of them active per token.
    total = sum(math.prod(s) for s in weight_shapes(c).values())
    assert total == 30_532_122_624
    experts = c.num_hidden_layers * c.num_experts * 3 * c.hidden_size * c.moe_intermediate_size
    active = total - experts + experts * c.num_experts_per_tok // c.num_experts
    assert 3.3e9 < active < 3.4e9
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        48,
        2048,
        32,
        4,
        128,
    )
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.vocab_size) == (
        128,
        8,
        768,
        151936,
    )
    assert c.norm_topk_prob and c.qk_norm and all(c.moe_layer(i) for i in range(48))


def test_sparse_layers_follow_the_config() -> None:
    qwen = SHAPES["qwen3-moe-tiny"]
    assert [qwen.moe_layer(i) for i in range(3)] == [True, False, True]  # mlp_only_layers = [1]
    stepped = replace(qwen, mlp_only_layers=(), decoder_sparse_step=2, num_hidden_layers=4)
    assert [stepped.moe_layer(i) for i in range(4)] == [False, True, False, True]  # HF: (i + 1) % step == 0
    shapes = weight_shapes(qwen)
    assert "model.layers.1.mlp.down_proj.weight" in shapes and "model.layers.0.mlp.gate.weight" in shapes
    assert shapes["model.layers.2.mlp.experts.7.down_proj.weight"] == (64, 32)
    mixtral = weight_shapes(SHAPES["mixtral-tiny"])
    assert mixtral["model.layers.1.block_sparse_moe.gate.weight"] == (4, 64)
    assert mixtral["model.layers.0.block_sparse_moe.experts.3.w2.weight"] == (64, 64)
    assert not any(".mlp." in name for name in mixtral)


@pytest.mark.parametrize("shape", MOE_SHAPES)
def test_config_json_round_trips(shape: str) -> None:
    config = SHAPES[shape]
    doc = config.to_hf(torch.bfloat16)
    assert ModelConfig.from_hf(doc) == config
    if shape == "mixtral-tiny":
        assert doc["num_local_experts"] == 4 and doc["architectures"] == ["MixtralForCausalLM"]
    else:
        assert doc["mlp_only_layers"] == [1] and doc["architectures"] == ["Qwen3MoeForCausalLM"]


@pytest.mark.parametrize("shape", MOE_SHAPES)
@pytest.mark.parametrize("shard_bytes", [None, 60_000])
def test_checkpoint_round_trip_keeps_the_experts_packed(
    tmp_path: Path, shape: str, shard_bytes: int | None
) -> None:
    model = load_model(shape, seed=3)
    save_checkpoint(model, tmp_path, shard_bytes=shard_bytes)
    loaded = load_model(str(tmp_path))
    assert loaded.config == model.config and list(loaded.weights) == list(model.weights)
    tokens = _tokens(13, model.config.vocab_size, seed=5)
    assert torch.equal(forward(loaded, tokens), forward(model, tokens))
    # The loader's experts are views into one [E, 2I, H] and one [E, H, I] per sparse layer:
    # expert_stacks hands those over without a copy.
    names = moe_names(loaded.config, 0)
    w13, w2 = expert_stacks(loaded.config, loaded.weights, 0)
    assert w13.data_ptr() == loaded.weights[names.gate[0]].data_ptr()
    assert w2.data_ptr() == loaded.weights[names.down[0]].data_ptr()
    assert torch.equal(w13[1, model.config.moe_intermediate_size :], loaded.weights[names.up[1]])
    # Unpacked weights (a model built by hand) are stacked into copies with the same values.
    plain = {k: v.clone() for k, v in loaded.weights.items()}
    s13, s2 = expert_stacks(loaded.config, plain, 0)
    assert s13.data_ptr() != w13.data_ptr() and torch.equal(s13, w13) and torch.equal(s2, w2)
    assert loaded.weights_bytes() == model.weights_bytes() == sum(t.nbytes for t in plain.values())


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda cfg: cfg.update(model_type="qwen2_moe"), "qwen3_moe (Qwen3MoeForCausalLM), mixtral"),
        (lambda cfg: cfg.pop("num_experts"), "num_experts"),
        (lambda cfg: cfg.update(num_experts_per_tok=9), "num_experts_per_tok"),
        (lambda cfg: cfg.update(mlp_only_layers="1"), "mlp_only_layers"),
        (lambda cfg: cfg.update(decoder_sparse_step=0), "decoder_sparse_step"),
        (lambda cfg: cfg.update(shared_expert_intermediate_size=64), "shared experts"),
    ],
)
def test_bad_moe_configs_give_one_sentence(tmp_path: Path, mutate: Any, expect: str) -> None:
    save_checkpoint(load_model("qwen3-moe-tiny"), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    mutate(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError) as e:
        load_model(str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith(".") and expect in msg, msg


def test_mixtral_sliding_window_is_refused() -> None:
    doc = SHAPES["mixtral-tiny"].to_hf()
    doc["sliding_window"] = 4096
    with pytest.raises(UsageError, match="sliding_window"):
        ModelConfig.from_hf(doc)


def test_an_unsupported_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    doc = SHAPES["tiny"].to_hf()
    doc["model_type"] = "gpt_oss"
    with pytest.raises(UsageError) as e:
        ModelConfig.from_hf(doc)
    assert str(e.value) == (
        "config.json: model_type 'gpt_oss' is not supported; the supported architectures are "
        "llama (LlamaForCausalLM), qwen2 (Qwen2ForCausalLM), qwen3 (Qwen3ForCausalLM), "
        "qwen3_moe (Qwen3MoeForCausalLM), mixtral (MixtralForCausalLM)."
    )
    with pytest.raises(UsageError) as e:
        load_model(str(tmp_path / "nowhere"))
    assert "qwen3-moe-tiny" in str(e.value) and "mixtral (MixtralForCausalLM)" in str(e.value)


# --- against HF transformers (a test dependency only) ------------------------------------------


def _hf(dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(str(dir), dtype=torch.float32).eval()


def _greedy(step: Any, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    seq, logits = list(prompt), []
    for _ in range(steps):
        last = step(torch.tensor(seq))
        logits.append(last)
        seq.append(int(last.argmax()))
    return seq[len(prompt) :], logits


@pytest.mark.parametrize(
    "config",
    [
        SHAPES["qwen3-moe-tiny"],
        SHAPES["mixtral-tiny"],
        # Qwen3-MoE without renormalisation, and with decoder_sparse_step's dense layers.
        replace(SHAPES["qwen3-moe-tiny"], norm_topk_prob=False, mlp_only_layers=(), decoder_sparse_step=2),
    ],
    ids=["qwen3-moe-tiny", "mixtral-tiny", "qwen3-moe-unnormalised-stepped"],
)
def test_reference_forward_matches_transformers_on_the_same_files(
    tmp_path: Path, config: ModelConfig
) -> None:
    # The checkpoint is written in the hub's layout (one tensor per expert, HF's names); HF reads
    # it through its own loader (transformers 5 stacks the experts on load), the engine through its own.
    save_checkpoint(_random(config, seed=4), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert set(tensors) == set(weight_shapes(config))
    ours = load_model(str(tmp_path))
    hf = _hf(tmp_path)
    assert (
        type(hf).__name__
        == {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}[config.architecture]
    )

    def hf_step(seq: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return hf(seq[None]).logits[0, -1].float()

    prompt = _tokens(11, config.vocab_size, seed=6).tolist()
    with torch.no_grad():
        full = hf(torch.tensor(prompt)[None]).logits[0].float()
    torch.testing.assert_close(forward(ours, torch.tensor(prompt)), full, atol=HF_LOGITS_ATOL, rtol=0)
    want, want_logits = _greedy(hf_step, prompt, 12)
    got, got_logits = _greedy(lambda seq: forward(ours, seq)[-1], prompt, 12)
    assert got == want  # greedy tokens agree 1.0
    for a, b in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(a, b, atol=HF_LOGITS_ATOL, rtol=0)


def _random(config: ModelConfig, seed: int) -> LoadedModel:
    """Plain random weights for a config outside SHAPES, as load_model makes them for a shape."""
    from polymorph_engine.runtime import checkpoint

    base = load_model("qwen3-moe-tiny" if config.architecture == "qwen3_moe" else "mixtral-tiny", seed=seed)
    weights = checkpoint._random_weights(config, torch.device("cpu"), torch.float32, seed, stable=False)
    return replace(base, config=config, weights=weights, source="")
