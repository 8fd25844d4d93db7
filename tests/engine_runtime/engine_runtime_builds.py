"""Test helpers for the engine runtime: small wrong or misbehaving variants of the reference build.

Each variant is a copy of ``builds/reference`` with lines patched (the patch target must exist,
so a reference rewrite makes these helpers fail loudly rather than test nothing), or with a
replacement ``load`` appended to the entry module that wraps one hot-path method.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from polymorph_engine.buildspec import REFERENCE_BUILD

MODEL = "qwen2-tiny"
"""Its greedy continuations vary token to token, so token comparisons mean something."""


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
