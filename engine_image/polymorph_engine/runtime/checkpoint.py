"""Loading a model once: random weights for a named shape, or an HF-layout checkpoint; and saving one.

``load_model(source)`` takes a shape name from ``SHAPES`` (random weights, built directly on the
target device in the target dtype) or an HF-layout checkpoint directory (``config.json``,
``model.safetensors`` or sharded ``model.safetensors.index.json``, and ``tokenizer.json``).
``save_checkpoint`` writes the same layout back. ``weight_shapes`` lists every weight a config has.

A sparse (MoE) layer's experts are held packed: one [E, 2I, H] tensor of every expert's gate and
up rows and one [E, H, I] of their down projections, allocated once per layer; each expert's
HF-named weights are views into them (``expert_stacks`` hands a build the stacks themselves, so
stacked-expert kernels need no second copy of the experts: most of a MoE model's bytes).

It knows nothing about the forward pass, builds or the store.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from polymorph.contract.errors import UsageError
from polymorph_engine.runtime.config import SHAPES, ModelConfig, parse_dtype, supported_architectures
from polymorph_engine.runtime.model import LoadedModel, moe_names
from polymorph_engine.runtime.tokenizer import ByteTokenizer, load_tokenizer

__all__ = [
    "STABLE_INIT_SHAPES",
    "expert_stacks",
    "load_model",
    "save_checkpoint",
    "weight_names",
    "weight_shapes",
]


def _parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(
            f"device must be a torch device such as 'cpu' or 'cuda:0'; got {device!r}."
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"device {device!r} is not available here: torch sees no CUDA device; use 'cpu'."
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a model of this config has, by HF name, in a fixed order, with its shape."""
    c = config
    q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (c.hidden_size,)
        shapes[f"{p}.self_attn.q_proj.weight"] = (q_out, c.hidden_size)
        shapes[f"{p}.self_attn.k_proj.weight"] = (kv_out, c.hidden_size)
        shapes[f"{p}.self_attn.v_proj.weight"] = (kv_out, c.hidden_size)
        if c.qkv_bias:
            shapes[f"{p}.self_attn.q_proj.bias"] = (q_out,)
            shapes[f"{p}.self_attn.k_proj.bias"] = (kv_out,)
            shapes[f"{p}.self_attn.v_proj.bias"] = (kv_out,)
        if c.qk_norm:
            shapes[f"{p}.self_attn.q_norm.weight"] = (c.head_dim,)
            shapes[f"{p}.self_attn.k_norm.weight"] = (c.head_dim,)
        shapes[f"{p}.self_attn.o_proj.weight"] = (c.hidden_size, q_out)
        if c.o_bias:
            shapes[f"{p}.self_attn.o_proj.bias"] = (c.hidden_size,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (c.hidden_size,)
        if c.moe_layer(i):
            names, width = moe_names(c, i), c.moe_intermediate_size
            shapes[names.router] = (c.num_experts, c.hidden_size)
            for gate, up, down in zip(names.gate, names.up, names.down, strict=True):
                shapes[gate] = (width, c.hidden_size)
                shapes[up] = (width, c.hidden_size)
                shapes[down] = (c.hidden_size, width)
            continue
        shapes[f"{p}.mlp.gate_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[f"{p}.mlp.up_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[f"{p}.mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def weight_names(config: ModelConfig) -> list[str]:
    return list(weight_shapes(config))


def _expert_slots(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every expert weight's name -> its view into its layer's packed stacks, freshly allocated
    (uninitialised): gate = w13[e, :I], up = w13[e, I:], down = w2[e]."""
    c, width = config, config.moe_intermediate_size
    slots: dict[str, torch.Tensor] = {}
    for i in range(c.num_hidden_layers):
        if not c.moe_layer(i):
            continue
        names = moe_names(c, i)
        w13 = torch.empty(c.num_experts, 2 * width, c.hidden_size, device=device, dtype=dtype)
        w2 = torch.empty(c.num_experts, c.hidden_size, width, device=device, dtype=dtype)
        for e in range(c.num_experts):
            slots[names.gate[e]] = w13[e, :width]
            slots[names.up[e]] = w13[e, width:]
            slots[names.down[e]] = w2[e]
    return slots


def expert_stacks(
    config: ModelConfig, weights: dict[str, torch.Tensor], layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse layer ``layer``'s experts as w13 [E, 2I, H] (each expert's gate rows, then its up
    rows) and w2 [E, H, I]: the packed tensors the loader allocated when the weights are its views
    (no copy), else freshly stacked copies."""
    names, width = moe_names(config, layer), config.moe_intermediate_size
    gate0, down0 = weights[names.gate[0]], weights[names.down[0]]
    w13, w2 = gate0._base, down0._base
    if (
        w13 is not None
        and w2 is not None
        and w13.shape == (config.num_experts, 2 * width, config.hidden_size)
        and w2.shape == (config.num_experts, config.hidden_size, width)
        and all(
            weights[names.gate[e]].data_ptr() == w13[e, :width].data_ptr()
            and weights[names.up[e]].data_ptr() == w13[e, width:].data_ptr()
            and weights[names.down[e]].data_ptr() == w2[e].data_ptr()
            and weights[names.gate[e]].stride() == w13[e, :width].stride()
            and weights[names.up[e]].stride() == w13[e, width:].stride()
            and weights[names.down[e]].stride() == w2[e].stride()
            for e in range(config.num_experts)
        )
    ):
        return w13, w2
    w13 = torch.stack(
        [torch.cat([weights[g], weights[u]]) for g, u in zip(names.gate, names.up, strict=True)]
    )
    return w13, torch.stack([weights[d] for d in names.down])


STABLE_INIT_SHAPES = frozenset({"llama-1b", "llama-8b", "qwen3-30b-a3b"})
"""Random shapes whose weights use the rounding-stable init (see ``_random_weights``).

The tiny shapes keep the plain init: they run in float32, where rounding never flips a greedy
token, and there the plain init makes verification sharpest (a RoPE off by one moves the logits
by several times the default tolerance instead of just past it)."""


def _random_weights(
    config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int, *, stable: bool
) -> dict[str, torch.Tensor]:
    """Seeded random weights, created on the device in the target dtype (an 8B model takes
    seconds on a GPU, with no host copy).

    Plain init keeps activations O(1): matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm
    weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2), and an untied head ~ N(0, 1/H).

    ``stable`` adds two changes for large shapes served in bf16: the residual-branch outputs
    (o_proj, down_proj) are scaled by 1/sqrt(2 * layers), as in GPT-2, so the residual stream does
    not grow with depth; and an untied ``lm_head`` is a randomly permuted copy of the embedding over
    sqrt(H), so greedy decoding follows a random bigram map with a wide margin. Builds that differ
    only in rounding (bf16, fused matmuls) then agree on tokens while attention still moves every
    logit; with pure noise heads near-ties are common in bf16 and token-agreement gates would
    measure rounding (10-40% agreement on llama-8b). A tied head makes the current token the argmax.
    A stable MoE router is scaled by ``STABLE_ROUTER_SCALE`` too, so the top k experts stand
    apart from the rest: a rounding-level change then rarely swaps an expert in or out.

    Expert weights are written into their layer's packed stacks (see the module docstring), one
    expert matrix of scratch at a time.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    residual_scale = 1.0 / math.sqrt(2 * config.num_hidden_layers) if stable else 1.0
    slots = _expert_slots(config, device, dtype)
    routers = {moe_names(config, i).router for i in range(config.num_hidden_layers) if config.moe_layer(i)}
    weights: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes(config).items():
        if name == "lm_head.weight" and stable:
            perm = torch.randperm(shape[0], generator=gen, device=device)
            weights[name] = weights["model.embed_tokens.weight"][perm] / math.sqrt(shape[1])
            continue
        t = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        if name.endswith("norm.weight"):
            t.mul_(0.1).add_(1.0)
        elif name.endswith(".bias"):
            t.mul_(0.1)
        elif name.endswith(("o_proj.weight", "down_proj.weight", ".w2.weight")):
            t.mul_(residual_scale / math.sqrt(shape[1]))
        elif name in routers and stable:
            t.mul_(STABLE_ROUTER_SCALE / math.sqrt(shape[1]))
        elif name != "model.embed_tokens.weight":
            t.mul_(1.0 / math.sqrt(shape[1]))
        if name in slots:
            weights[name] = slots[name].copy_(t)
            del t
        else:
            weights[name] = t
    return weights


STABLE_ROUTER_SCALE = 8.0
"""Router logits of a stable-init MoE shape have this standard deviation (instead of 1)."""


def load_model(
    source: str, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32", seed: int = 0
) -> LoadedModel:
    """A shape name from ``SHAPES`` (random weights from ``seed``) or an HF checkpoint directory."""
    dev, dt = _parse_device(device), parse_dtype(dtype)
    if source in SHAPES:
        config = SHAPES[source]
        tokenizer = ByteTokenizer(config.vocab_size, config.bos_token_id or 256, config.eos_token_id)
        weights = _random_weights(config, dev, dt, seed, stable=source in STABLE_INIT_SHAPES)
        return LoadedModel(config, weights, tokenizer, dev, dt, source)
    path = Path(source)
    if not path.is_dir():
        raise UsageError(
            f"model source {source!r} is neither a shape ({', '.join(SHAPES)}) nor a checkpoint directory "
            f"of a supported architecture ({supported_architectures()})."
        )
    return _load_checkpoint(path, dev, dt)


def _load_checkpoint(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UsageError(f"checkpoint {path} has no config.json.")
    try:
        doc = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"{config_file} is not valid JSON ({e.msg} at line {e.lineno}).") from None
    if not isinstance(doc, dict):
        raise UsageError(f"checkpoint {path}: config.json must be a JSON object.")
    config = ModelConfig.from_hf(doc, where=str(config_file))

    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise UsageError(f"checkpoint {path} has neither model.safetensors nor model.safetensors.index.json.")

    expected = weight_shapes(config)
    slots = _expert_slots(config, device, dtype)  # experts land in their layer's packed stacks
    weights: dict[str, torch.Tensor] = {}
    # safe_open(device=...) reads straight onto the device: no second host copy of an 8B model.
    sf_device = "cpu" if device.type == "cpu" else str(device)
    for file in files:
        with safe_open(str(path / file), framework="pt", device=sf_device) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name not in expected:
                    continue
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != expected[name]:
                    raise UsageError(
                        f"checkpoint {path}: weight {name!r} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {expected[name]}."
                    )
                weights[name] = slots[name].copy_(tensor) if name in slots else tensor.to(dtype)
    for name in expected:
        if name not in weights:
            raise UsageError(f"checkpoint {path} is missing weight {name!r}.")
    try:
        tokenizer = load_tokenizer(path, config.eos_token_id)
    except ValueError as exc:  # a malformed tokenizer_config.json or generation_config.json
        raise UsageError(f"checkpoint {path}: {exc}") from None
    if tokenizer is None:
        raise UsageError(f"checkpoint {path} has no tokenizer.json.")
    return LoadedModel(config, {k: weights[k] for k in expected}, tokenizer, device, dtype, str(path))


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t`` in storage of its own: safetensors refuses tensors that share memory (packed experts)."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def save_checkpoint(model: LoadedModel, dir: Path, shard_bytes: int | None = None) -> Path:
    """Write ``config.json``, safetensors (sharded with an index when ``shard_bytes`` is given) and
    the tokenizer's files into ``dir``; returns ``dir``."""
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "config.json").write_text(json.dumps(model.config.to_hf(model.dtype), indent=2) + "\n")
    tensors = {k: _own(v.detach().to("cpu")) for k, v in model.weights.items()}
    if shard_bytes is None:
        save_file(tensors, str(dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if shards[-1] and size + nbytes > shard_bytes:
                shards.append({})
                size = 0
            shards[-1][name] = t
            size += nbytes
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(dir / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        index = {"metadata": {"total_size": model.weights_bytes()}, "weight_map": weight_map}
        (dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    model.tokenizer.save(dir)
    return dir
