"""Builds for the tests that run ``polymorph compile`` on the real engine for its mechanics.

``eager_reference_build`` is the reference build less its torch.compile values: a campaign on a
CPU then proposes no candidate that inductor compiles (g++, many CPU-seconds each, more on a cold
compile cache). For the tests of what a campaign does around its experiments (the report, resume,
signals, corrupt documents, a campaign on a MoE model), which hold whichever candidates the search
proposes; compiled candidates run end to end in the tests that are about them
(``tests/engine_builds``, ``tests/engine_runtime``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from polymorph.contract.builds import REFERENCE_BUILD, read_build

__all__ = ["COMPILED", "eager_reference_build"]

COMPILED = "compile"
"""The knob value that puts a step under torch.compile (``decode_capture``, ``kernels``)."""


def eager_reference_build(folder: Path) -> Path:
    """A copy of the reference build at ``folder`` whose knobs declare no ``compile`` value; every
    other knob, value, default, requirement and ``accelerator_only`` list is the reference's
    (``slow_prepare``, which lists only ``compile``, goes with it)."""
    shutil.copytree(REFERENCE_BUILD, folder, ignore=shutil.ignore_patterns("__pycache__"))
    toml = folder / "build.toml"
    text = re.sub(rf'(choices = \[[^\]\n]*), "{COMPILED}"', r"\1", toml.read_text())
    toml.write_text(re.sub(rf'\nslow_prepare = \["{COMPILED}"\]', "", text))
    reference, eager = read_build(REFERENCE_BUILD).knobs, read_build(folder).knobs
    assert eager.keys() == reference.keys()
    for name, knob in reference.items():
        kept = tuple(c for c in knob.choices if c != COMPILED)
        assert eager[name].choices == kept and eager[name].default == knob.default, (name, eager[name])
    assert any(COMPILED in k.choices for k in reference.values()), "the reference declares no compile value"
    return folder
