"""The model runtime, loaded once: config, weights with HF names, tokenizer, device and dtype.

A Llama-family decoder (RMSNorm, RoPE with optional llama3 scaling, GQA, SwiGLU, tied or untied
embeddings) plus the Qwen2 (q/k/v projection biases) and Qwen3 (per-head q/k RMSNorm) variants.

``load_model(source)`` takes a shape name from ``SHAPES`` (random weights, built directly on the
target device in the target dtype) or an HF-layout checkpoint directory (``config.json``,
``model.safetensors`` or sharded ``model.safetensors.index.json``, and ``tokenizer.json``).
``save_checkpoint`` writes the same layout back. ``forward`` is the plain, cache-free, full-sequence
forward pass: the obviously-correct twin that hot paths are tested against.

This module knows nothing about builds, knobs, KV caches, batching or sampling: those belong to the
hot path a build derives from a ``LoadedModel``.

Shapes: S = sequence length, H = hidden size, V = vocab size, D = head dim.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from polymorph.errors import UsageError
from polymorph_engine.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "DTYPES",
    "SHAPES",
    "LoadedModel",
    "ModelConfig",
    "RopeScaling",
    "forward",
    "load_model",
    "parse_dtype",
    "rope_cos_sin",
    "rope_inv_freq",
    "save_checkpoint",
    "weight_names",
    "weight_shapes",
]

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
_DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 frequency-dependent RoPE scaling (``rope_type: llama3`` in ``config.json``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder; field names follow HF ``config.json`` where one exists."""

    architecture: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # biases on q/k/v projections (Qwen2 always; Llama/Qwen3 via attention_bias)
    o_bias: bool = False  # bias on o_proj (Llama/Qwen3 attention_bias)
    qk_norm: bool = False  # Qwen3: RMSNorm over D on each head of q and k, before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def eos_token_id(self) -> int:
        """The first end-of-sequence id (a config may list several)."""
        return self.eos_token_ids[0] if self.eos_token_ids else 0

    def to_hf(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        """A ``config.json`` document that HF-layout readers (and ``from_hf``) understand."""
        doc: dict[str, Any] = {
            "architectures": [_ARCHITECTURES[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_id,
        }
        if self.rope_scaling is not None:
            doc["rope_scaling"] = {"rope_type": "llama3", **asdict(self.rope_scaling)}
        if self.architecture in ("llama", "qwen3"):
            doc["attention_bias"] = self.o_bias
        if dtype is not None:
            doc["torch_dtype"] = str(dtype).removeprefix("torch.")
        return doc

    @classmethod
    def from_hf(cls, doc: dict[str, Any], where: str = "config.json") -> ModelConfig:
        """Read an HF ``config.json`` document; an unsupported one raises UsageError naming the field."""
        arch = doc.get("model_type")
        if arch not in _ARCHITECTURES:
            raise UsageError(f"{where}: model_type must be one of {', '.join(_ARCHITECTURES)}; got {arch!r}.")
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        ):
            if not isinstance(doc.get(key), int) or doc[key] <= 0:
                raise UsageError(f"{where}: {key} must be a positive integer; got {doc.get(key)!r}.")
        if doc.get("hidden_act", "silu") != "silu":
            raise UsageError(f"{where}: hidden_act must be 'silu'; got {doc['hidden_act']!r}.")
        if doc.get("mlp_bias", False):
            raise UsageError(f"{where}: mlp_bias=true is not supported; only bias-free MLPs are.")
        heads = doc["num_attention_heads"]
        attention_bias = bool(doc.get("attention_bias", False))
        eos = doc.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            architecture=arch,
            vocab_size=doc["vocab_size"],
            hidden_size=doc["hidden_size"],
            intermediate_size=doc["intermediate_size"],
            num_hidden_layers=doc["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=int(doc.get("num_key_value_heads") or heads),
            head_dim=int(doc.get("head_dim") or doc["hidden_size"] // heads),
            rms_norm_eps=float(doc.get("rms_norm_eps", 1e-6)),
            rope_theta=float(doc.get("rope_theta", 10000.0)),
            rope_scaling=_read_rope_scaling(doc.get("rope_scaling"), where),
            max_position_embeddings=int(doc.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or attention_bias,
            o_bias=arch != "qwen2" and attention_bias,
            qk_norm=arch == "qwen3",
            bos_token_id=doc.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _read_rope_scaling(doc: Any, where: str) -> RopeScaling | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: rope_scaling must be a table or null; got {doc!r}.")
    kind = doc.get("rope_type", doc.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise UsageError(f"{where}: rope_scaling.rope_type must be 'llama3' or 'default'; got {kind!r}.")
    try:
        return RopeScaling(
            factor=float(doc["factor"]),
            low_freq_factor=float(doc["low_freq_factor"]),
            high_freq_factor=float(doc["high_freq_factor"]),
            original_max_position_embeddings=int(doc["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise UsageError(f"{where}: rope_scaling needs {e.args[0]!r} for rope_type 'llama3'.") from None


_LLAMA3_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

SHAPES: dict[str, ModelConfig] = {
    # CPU tests: seconds. Its llama3 scaling (original context 32, head dim 16) puts RoPE
    # frequencies in all three bands: kept, smoothed and divided by the factor.
    "tiny": ModelConfig(
        architecture="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rope_scaling=RopeScaling(
            factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32
        ),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=256,
        eos_token_ids=(257,),
    ),
    # Qwen2 flavour: q/k/v biases, tied embeddings (as Qwen2.5-0.5B).
    "qwen2-tiny": ModelConfig(
        architecture="qwen2",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        qkv_bias=True,
        bos_token_id=256,
        eos_token_ids=(257,),
    ),
    # Qwen3 flavour: q/k norm, head dim decoupled from hidden/heads (4 x 32 != 64), untied.
    "qwen3-tiny": ModelConfig(
        architecture="qwen3",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        qk_norm=True,
        bos_token_id=256,
        eos_token_ids=(257,),
    ),
    # Exactly the Llama-3.2-1B shape.
    "llama-1b": ModelConfig(
        architecture="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_ids=(128001,),
    ),
    # Exactly the Llama-3.1-8B shape.
    "llama-8b": ModelConfig(
        architecture="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=replace(_LLAMA3_ROPE, factor=8.0),
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_ids=(128001,),
    ),
}


@dataclass
class LoadedModel:
    """Everything loaded once per engine process; hot paths derive their state from it."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF names, e.g. "model.layers.0.self_attn.q_proj.weight"
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    source: str = ""

    def weights_bytes(self) -> int:
        """Bytes held by the weights (the tied embedding counts once)."""
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def __repr__(self) -> str:
        return (
            f"LoadedModel(source={self.source!r}, architecture={self.config.architecture!r}, "
            f"layers={self.config.num_hidden_layers}, hidden={self.config.hidden_size}, "
            f"device={self.device}, dtype={self.dtype}, weights={self.weights_bytes() / 2**20:.1f} MiB)"
        )


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` (or ``bf16``, ``torch.bfloat16``...) as a torch dtype; anything else is a UsageError."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise UsageError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype}.")
        return dtype
    name = _DTYPE_ALIASES.get(str(dtype), str(dtype)).removeprefix("torch.")
    if name not in DTYPES:
        raise UsageError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}.")
    return DTYPES[name]


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
        shapes[f"{p}.mlp.gate_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[f"{p}.mlp.up_proj.weight"] = (c.intermediate_size, c.hidden_size)
        shapes[f"{p}.mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def weight_names(config: ModelConfig) -> list[str]:
    return list(weight_shapes(config))


STABLE_INIT_SHAPES = frozenset({"llama-1b", "llama-8b"})
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
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    residual_scale = 1.0 / math.sqrt(2 * config.num_hidden_layers) if stable else 1.0
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
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            t.mul_(residual_scale / math.sqrt(shape[1]))
        elif name != "model.embed_tokens.weight":
            t.mul_(1.0 / math.sqrt(shape[1]))
        weights[name] = t
    return weights


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
            f"model source {source!r} is neither a shape ({', '.join(SHAPES)}) nor a checkpoint directory."
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
    weights: dict[str, torch.Tensor] = {}
    # safe_open(device=...) reads straight onto the device: no second host copy of an 8B model.
    sf_device = "cpu" if device.type == "cpu" else str(device)
    for file in files:
        with safe_open(str(path / file), framework="pt", device=sf_device) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name in expected:
                    weights[name] = f.get_tensor(name).to(dtype)
    for name, shape in expected.items():
        if name not in weights:
            raise UsageError(f"checkpoint {path} is missing weight {name!r}.")
        if tuple(weights[name].shape) != shape:
            raise UsageError(
                f"checkpoint {path}: weight {name!r} has shape {tuple(weights[name].shape)}, config.json implies {shape}."
            )
    tokenizer = load_tokenizer(path, config.eos_token_id)
    if tokenizer is None:
        raise UsageError(f"checkpoint {path} has no tokenizer.json.")
    return LoadedModel(config, {k: weights[k] for k in expected}, tokenizer, device, dtype, str(path))


def save_checkpoint(model: LoadedModel, dir: Path, shard_bytes: int | None = None) -> Path:
    """Write ``config.json``, safetensors (sharded with an index when ``shard_bytes`` is given) and
    the tokenizer's files into ``dir``; returns ``dir``."""
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "config.json").write_text(json.dumps(model.config.to_hf(model.dtype), indent=2) + "\n")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.weights.items()}
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


# --- RoPE: part of the model's definition, shared by the reference forward and builds. ---


def rope_inv_freq(config: ModelConfig, device: str | torch.device = "cpu") -> torch.Tensor:
    """Inverse frequencies [D/2] (float32), with llama3 scaling applied when the config has it."""
    d = config.head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
    inv_freq = 1.0 / (config.rope_theta**exponents)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3: long wavelengths are divided by `factor`, short ones kept, the band between
    # interpolated smoothly in 1/wavelength.
    old_ctx = s.original_max_position_embeddings
    low_freq_wavelen = old_ctx / s.low_freq_factor
    high_freq_wavelen = old_ctx / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [*positions.shape, D] for integer ``positions``, computed in float32 then cast."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [..., D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


# --- The reference forward pass: no cache, whole sequence, one obvious step at a time. ---


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _linear(x: torch.Tensor, w: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return torch.nn.functional.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))


@torch.no_grad()
def forward(model: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [S, V] (float32) for every position of ``tokens`` [S], positions 0..S-1."""
    c, w = model.config, model.weights
    seq = tokens.shape[0]
    nh, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    x = w["model.embed_tokens.weight"][tokens.to(model.device)]  # [S, H]
    positions = torch.arange(seq, device=model.device)
    cos, sin = rope_cos_sin(rope_inv_freq(c, model.device), positions, model.dtype)  # [S, D]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=model.device).tril()  # [S, S]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        h = _rms_norm(x, w[f"{p}.input_layernorm.weight"], c.rms_norm_eps)
        q = _linear(h, w, f"{p}.self_attn.q_proj").view(seq, nh, d)
        k = _linear(h, w, f"{p}.self_attn.k_proj").view(seq, nkv, d)
        v = _linear(h, w, f"{p}.self_attn.v_proj").view(seq, nkv, d)
        if c.qk_norm:
            q = _rms_norm(q, w[f"{p}.self_attn.q_norm.weight"], c.rms_norm_eps)
            k = _rms_norm(k, w[f"{p}.self_attn.k_norm.weight"], c.rms_norm_eps)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, S, D]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=0)  # [nh, S, D]
        v = v.repeat_interleave(nh // nkv, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(d)  # [nh, S, S]
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(model.dtype)
        attn = (probs @ v).transpose(0, 1).reshape(seq, nh * d)  # [S, nh*D]
        x = x + _linear(attn, w, f"{p}.self_attn.o_proj")
        h = _rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], c.rms_norm_eps)
        gate = _linear(h, w, f"{p}.mlp.gate_proj")
        up = _linear(h, w, f"{p}.mlp.up_proj")
        x = x + _linear(torch.nn.functional.silu(gate) * up, w, f"{p}.mlp.down_proj")
    x = _rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    return (x @ head.T).float()
