"""Test helpers for the engine runtime: small wrong or misbehaving variants of the reference build.

Each variant is a copy of ``builds/reference`` with lines patched (the patch target must exist,
so a reference rewrite makes these helpers fail loudly rather than test nothing), or with a
replacement ``load`` appended to the entry module that wraps one hot-path method.
"""

from __future__ import annotations

import functools
import math
import shutil
import sys
import types
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.runtime.checkpoint import save_checkpoint, weight_shapes
from polymorph_engine.runtime.config import SHAPES
from polymorph_engine.runtime.loader import import_build
from polymorph_engine.runtime.model import LoadedModel
from polymorph_engine.runtime.tokenizer import ByteTokenizer

MODEL = "tiny"
"""A model shape for tests where the weights do not matter (crash containment, CLI errors)."""


def sensitive_model(seed: int = 0) -> LoadedModel:
    """A tiny Qwen2-shaped model with plain random init that makes verification tests sharp.

    Every matrix ~ N(0, 1/fan_in), an untied head, no residual down-scaling: attention, RoPE
    and every norm move the logits a lot and greedy tokens vary step to step, so a wrong
    build lands far outside the gates whatever init ``load_model``'s shapes use.
    """
    config = replace(SHAPES["qwen2-tiny"], tie_word_embeddings=False)
    gen = torch.Generator().manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes(config).items():
        t = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * t
        elif name.endswith(".bias"):
            t = 0.1 * t
        elif name != "model.embed_tokens.weight":
            t = t / math.sqrt(shape[1])
        weights[name] = t
    tokenizer = ByteTokenizer(config.vocab_size, config.bos_token_id or 256, config.eos_token_id)
    return LoadedModel(config, weights, tokenizer, torch.device("cpu"), torch.float32, "sensitive-test-model")


def sensitive_checkpoint(dest: Path) -> Path:
    """``sensitive_model()`` saved as an HF checkpoint directory (a ``--model`` / Supervisor source)."""
    return save_checkpoint(sensitive_model(), dest)


def patched_build(
    dest: Path,
    name: str,
    replacements: Sequence[tuple[str, str]] = (),
    append: str = "",
    file: str = "hotpath.py",
) -> Path:
    """A copy of the reference build at ``dest`` named ``name``, with ``file`` patched."""
    shutil.copytree(REFERENCE_BUILD, dest, ignore=shutil.ignore_patterns("__pycache__"))
    toml = dest / "build.toml"
    toml.write_text(toml.read_text().replace('name = "reference"', f'name = "{name}"', 1))
    path = dest / file
    text = path.read_text()
    for old, new in replacements:
        assert old in text, f"patch target {old!r} is not in the reference {file}"
        text = text.replace(old, new)
    path.write_text(text + append)
    return dest


def wrapping_build(dest: Path, name: str, method: str, body: str) -> Path:
    """A reference copy whose hot path's ``method`` is replaced by a function running ``body``.

    ``body`` is Python source indented by 8 spaces; it may call ``original(*args)``.
    """
    append = f"""

_reference_load = load


def load(model, knobs):
    hotpath = _reference_load(model, knobs)
    original = hotpath.{method}

    def replacement(*args):
{body}

    hotpath.{method} = replacement
    return hotpath
"""
    return patched_build(dest, name, append=append)


CRASHES: dict[str, tuple[str, str]] = {
    # name -> (method, body)
    "raises": ("decode", "        raise RuntimeError('decode exploded on purpose')"),
    "exits": ("decode", "        import os\n        os._exit(7)"),
    "segfaults": ("decode", "        import ctypes\n        ctypes.string_at(0)"),
    "hangs": ("decode", "        import time\n        time.sleep(3600)"),
    "nan": ("decode", "        return original(*args) * float('nan')"),
}


@functools.cache
def _reference_model() -> types.ModuleType:
    """The reference build's model.py, imported once for the test session (it stays registered)."""
    entry = import_build(REFERENCE_BUILD)
    return sys.modules[f"{entry.__package__}.model"]


def forward(model: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [S, V] of the reference model (builds/reference/model.py, the code of the golden
    outputs) for every position of ``tokens`` [S], with no cache."""
    logits: torch.Tensor = _reference_model().forward(model, tokens)
    return logits
