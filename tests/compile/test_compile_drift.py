"""Drift that changes the answer: one base build, two traffic shapes, two different builds kept.

The base build (``shape_tuned_build``) is the reference with one knob, ``tuned_for``, whose best
value depends on the traffic by construction: ``both`` (the default) computes every decode step
four times, ``single`` only steps of two rows or more, ``batch`` only one-row steps (the three
extra caches take a slot's prompt at its first repeated step, so a build that repeats nothing
prefills once). On single-stream traffic every decode step has one row, so ``single`` is about
4x faster than ``both`` and ``batch`` gains nothing; at concurrency 4 nearly every step has four
rows, and it is the other way round. A gap that wide stays clear of the gate under a loaded
machine's noise: at 3x, with the prefills repeated too, one run's final pairing read 2.42x
[1.04, 5.65] in 5 pairs and kept nothing. A ``polymorph compile`` per shape (what a CompileJob opened on each runs) keeps
``single`` on the first and ``batch`` on the second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import open_store

_ENTRY = '''"""A shape-tuned test build: the reference, with decode steps repeated by occupancy."""

from __future__ import annotations

from typing import Any

from .reference.hotpath import load as load_base

REPEAT = 3


class TunedCache:
    """The reference's cache, and REPEAT more that wasted decode steps run on. A slot's prompt
    fills them at its first wasted step, so a build that wastes none prefills once."""

    def __init__(self, caches: list[Any]) -> None:
        self.main, self.extras = caches[0], caches[1:]
        self.prompts: dict[int, Any] = {}
        self.filled: set[int] = set()


class ShapeTuned:
    def __init__(self, model: Any, knobs: dict[str, Any]) -> None:
        knobs = dict(knobs)
        self.tuned_for = knobs.pop("tuned_for", "both")
        self.inner = load_base(model, knobs)

    def new_cache(self, max_batch: int, max_seq_len: int) -> TunedCache:
        return TunedCache([self.inner.new_cache(max_batch, max_seq_len) for _ in range(REPEAT + 1)])

    def prefill(self, cache: TunedCache, slot: int, tokens: Any) -> Any:
        self._free_extras(cache, slot)
        cache.prompts[slot] = tokens
        return self.inner.prefill(cache.main, slot, tokens)

    def decode(self, cache: TunedCache, slots: Any, tokens: Any) -> Any:
        if self.tuned_for == "both" or (self.tuned_for == "single") == (len(slots) > 1):
            for slot in [int(s) for s in slots]:
                if slot not in cache.filled:
                    for extra in cache.extras:
                        self.inner.prefill(extra, slot, cache.prompts[slot])
                    cache.filled.add(slot)
            for extra in cache.extras:
                self.inner.decode(extra, slots, tokens)
        return self.inner.decode(cache.main, slots, tokens)

    def sample(self, logits: Any) -> Any:
        return self.inner.sample(logits)

    def free(self, cache: TunedCache, slot: int) -> None:
        self._free_extras(cache, slot)
        cache.prompts.pop(slot, None)
        self.inner.free(cache.main, slot)

    def _free_extras(self, cache: TunedCache, slot: int) -> None:
        if slot in cache.filled:
            for extra in cache.extras:
                self.inner.free(extra, slot)
            cache.filled.discard(slot)

    def close(self) -> None:
        self.inner.close()


def load(model: Any, knobs: dict[str, Any]) -> ShapeTuned:
    return ShapeTuned(model, knobs)
'''

_TOML = """[build]
name = "shape-tuned"
parent = ""
entry = "tuned.py"
description = "The reference, decode steps repeated by batch occupancy (a test build)."

[knobs.tuned_for]
choices = ["both", "single", "batch"]
default = "both"
description = "both: every decode step computed four times. single: only steps of two rows or more. batch: only one-row steps."
"""


def shape_tuned_build(folder: Path) -> Path:
    """The test build: its own build.toml (the one knob) and entry, the reference inside it as a
    package with its own build.toml (which the reference reads its knobs from)."""
    folder.mkdir()
    shutil.copytree(REFERENCE_BUILD, folder / "reference", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "build.toml").write_text(_TOML)
    (folder / "tuned.py").write_text(_ENTRY)
    return folder


def _profile(path: Path, concurrency: int) -> Path:
    path.write_text(
        "inputTokens: {bounds: [16, 48], counts: [50, 50]}\n"
        "outputTokens: {bounds: [8, 16], counts: [50, 50]}\n"
        f"concurrency: {concurrency}\n"
    )
    return path


@pytest.mark.slow
def test_two_traffic_shapes_keep_different_builds(tmp_path: Path) -> None:
    base = shape_tuned_build(tmp_path / "base")
    kept = {}
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ANTHROPIC_API_KEY", None)
    for concurrency in (1, 4):
        workload = _profile(tmp_path / f"c{concurrency}.yaml", concurrency)
        proc = subprocess.run(
            [sys.executable, "-m", "polymorph.cli", "compile", "--store", str(tmp_path / f"store-{concurrency}"),
             "--base-build", str(base), "--workload", str(workload), "--max-experiments", "5", "--json"],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["state"] == "improved", doc["message"]
        kept[concurrency] = doc["best"]["knobs"]["tuned_for"]
        # Every report names the shape measured, and on a CPU what the scaling changed.
        assert re.search(rf"measured at: \d+ requests at concurrency {concurrency},", proc.stderr)
        shape = doc["measuredShape"]
        assert shape["concurrency"] == concurrency and shape["method"] == "replay"
        assert shape["scaled"].startswith("workload scaled down for --device cpu: 64 requests")
        manifest = open_store(str(tmp_path / f"store-{concurrency}")).get_manifest(doc["best"]["build"])
        assert manifest.figures is not None and manifest.figures.shape is not None
        assert manifest.figures.shape.model_dump(mode="json") == shape
    assert kept == {1: "single", 4: "batch"}
