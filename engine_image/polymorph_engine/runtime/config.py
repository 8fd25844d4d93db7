"""Model configurations: the shape table, ``config.json`` parsing and the dtypes an engine accepts.

``ModelConfig`` describes a Llama-family decoder (RMSNorm, RoPE with optional llama3 scaling, GQA,
SwiGLU, tied or untied embeddings) plus the Qwen2 (q/k/v projection biases) and Qwen3 (per-head
q/k RMSNorm) variants, and the Mixture-of-Experts decoders Qwen3-MoE (``qwen3_moe``: Qwen3's
attention, a top-k router over SwiGLU experts in the layers ``moe_layer`` names) and Mixtral
(``mixtral``: Llama's attention, every layer a top-k MoE, the top-k weights renormalised);
``ModelConfig.from_hf`` reads an HF ``config.json`` and ``to_hf`` writes one. ``ARCHITECTURES``
lists the ``model_type`` values supported. ``SHAPES`` names the shapes an engine can build with
random weights (``tiny`` and the other ``-tiny`` shapes for tests and the demo, ``llama-1b``,
``llama-8b`` and ``qwen3-30b-a3b`` for GPU benchmarks). ``dtype_name`` checks a dtype name and
``parse_dtype`` turns one into a torch dtype.

It knows nothing about weights, tokenizers or the forward pass, and imports torch only in
``parse_dtype``: a command refuses a bad flag without loading it (about 2 CPU-seconds).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from polymorph.contract.errors import UsageError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ARCHITECTURES",
    "DTYPES",
    "SHAPES",
    "ModelConfig",
    "RopeScaling",
    "dtype_name",
    "parse_dtype",
    "supported_architectures",
]

DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
"""The dtypes an engine accepts, by their torch names (``torch.bfloat16``...)."""
_DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
"""The supported ``model_type`` values of ``config.json`` and the HF class each one names."""
MOE_ARCHITECTURES = frozenset({"qwen3_moe", "mixtral"})


def supported_architectures() -> str:
    """The supported architectures in words, for one-sentence errors."""
    return ", ".join(f"{k} ({v})" for k, v in ARCHITECTURES.items())


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

    architecture: str  # a key of ARCHITECTURES
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
    # Mixture of Experts (qwen3_moe, mixtral); num_experts = 0 is a dense model. Qwen3-MoE's
    # dense layers (mlp_only_layers, or off the decoder_sparse_step) use intermediate_size;
    # Mixtral's experts are intermediate_size wide (moe_intermediate_size holds it too).
    num_experts: int = 0  # qwen3_moe num_experts, mixtral num_local_experts
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the top-k router probabilities to sum to 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    @property
    def eos_token_id(self) -> int:
        """The first end-of-sequence id (a config may list several)."""
        return self.eos_token_ids[0] if self.eos_token_ids else 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def moe_layer(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a sparse MoE block (HF's rule for Qwen3-MoE; every layer of Mixtral)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def to_hf(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        """A ``config.json`` document that HF-layout readers (and ``from_hf``) understand."""
        doc: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.architecture]],
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
        if self.architecture in ("llama", "qwen3", "qwen3_moe"):
            doc["attention_bias"] = self.o_bias
        if self.architecture == "qwen3_moe":
            doc.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        elif self.architecture == "mixtral":
            doc.update(
                num_local_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                sliding_window=None,
            )
        if dtype is not None:
            doc["torch_dtype"] = str(dtype).removeprefix("torch.")
        return doc

    @classmethod
    def from_hf(cls, doc: dict[str, Any], where: str = "config.json") -> ModelConfig:
        """Read an HF ``config.json`` document; an unsupported one raises UsageError naming the field."""
        arch = doc.get("model_type")
        if arch not in ARCHITECTURES:
            raise UsageError(
                f"{where}: model_type {arch!r} is not supported; the supported architectures are "
                f"{supported_architectures()}."
            )
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
        moe = _read_moe(arch, doc, where)
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
            qkv_bias=arch == "qwen2" or (arch != "mixtral" and attention_bias),
            o_bias=arch not in ("qwen2", "mixtral") and attention_bias,
            qk_norm=arch in ("qwen3", "qwen3_moe"),
            bos_token_id=doc.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **moe,
        )


def _read_moe(arch: str, doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The MoE fields of a qwen3_moe or mixtral ``config.json`` ({} for a dense architecture)."""
    if arch not in MOE_ARCHITECTURES:
        return {}
    experts_key = "num_experts" if arch == "qwen3_moe" else "num_local_experts"
    width_key = "moe_intermediate_size" if arch == "qwen3_moe" else "intermediate_size"
    for key in (experts_key, "num_experts_per_tok", width_key):
        if not isinstance(doc.get(key), int) or doc[key] <= 0:
            raise UsageError(f"{where}: {key} must be a positive integer; got {doc.get(key)!r}.")
    if doc["num_experts_per_tok"] > doc[experts_key]:
        raise UsageError(
            f"{where}: num_experts_per_tok ({doc['num_experts_per_tok']}) must be at most "
            f"{experts_key} ({doc[experts_key]})."
        )
    if arch == "mixtral":
        if doc.get("sliding_window") is not None:
            raise UsageError(
                f"{where}: sliding_window must be null; sliding-window attention is not supported."
            )
        # Mixtral always renormalises its top-k probabilities; every layer is sparse.
        return {
            "num_experts": doc[experts_key],
            "num_experts_per_tok": doc["num_experts_per_tok"],
            "moe_intermediate_size": doc[width_key],
            "norm_topk_prob": True,
        }
    step = doc.get("decoder_sparse_step", 1)
    if not isinstance(step, int) or step <= 0:
        raise UsageError(f"{where}: decoder_sparse_step must be a positive integer; got {step!r}.")
    dense = doc.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
        raise UsageError(f"{where}: mlp_only_layers must be a list of layer indices; got {dense!r}.")
    if doc.get("shared_expert_intermediate_size"):
        raise UsageError(f"{where}: shared experts (shared_expert_intermediate_size) are not supported.")
    return {
        "num_experts": doc[experts_key],
        "num_experts_per_tok": doc["num_experts_per_tok"],
        "moe_intermediate_size": doc[width_key],
        "norm_topk_prob": bool(doc.get("norm_topk_prob", False)),
        "decoder_sparse_step": step,
        "mlp_only_layers": tuple(sorted(set(dense))),
    }


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

# Qwen3 flavour: q/k norm, head dim decoupled from hidden/heads (4 x 32 != 64), untied.
_QWEN3_TINY = ModelConfig(
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
    "qwen3-tiny": _QWEN3_TINY,
    # Qwen3-MoE flavour: qwen3-tiny's attention, 8 experts of width 32, top 2 renormalised, and
    # layer 1 dense (mlp_only_layers), so dense and sparse layers alternate in one model.
    "qwen3-moe-tiny": replace(
        _QWEN3_TINY,
        architecture="qwen3_moe",
        num_hidden_layers=3,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=(1,),
    ),
    # Mixtral flavour: Llama's attention, every layer 4 experts of width 64, top 2 renormalised.
    "mixtral-tiny": ModelConfig(
        architecture="mixtral",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=256,
        eos_token_ids=(257,),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        norm_topk_prob=True,
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
    # Exactly the Qwen3-30B-A3B shape: 128 experts of width 768, 8 per token, renormalised.
    "qwen3-30b-a3b": ModelConfig(
        architecture="qwen3_moe",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        qk_norm=True,
        bos_token_id=151643,
        eos_token_ids=(151645,),
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
    ),
}


def dtype_name(dtype: str) -> str:
    """``"bfloat16"`` for ``bf16``, ``torch.bfloat16``... (one of ``DTYPES``); anything else is a UsageError."""
    name = _DTYPE_ALIASES.get(str(dtype), str(dtype)).removeprefix("torch.")
    if name not in DTYPES:
        raise UsageError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}.")
    return name


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"`` (or ``bf16``, ``torch.bfloat16``...) as a torch dtype; anything else is a UsageError."""
    import torch  # here only: the rest of the module serves commands that never load it

    if isinstance(dtype, torch.dtype):
        if str(dtype).removeprefix("torch.") not in DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype}.")
        return dtype
    parsed: torch.dtype = getattr(torch, dtype_name(dtype))
    return parsed
