"""``.pre-commit-config.yaml`` runs what ``make lint typecheck`` runs, with the venv's tools.

The hooks are local (``language: system``) and take no file names, so each is one command line;
``make -n`` prints the Makefile's lines with ``$(BIN)`` expanded (``-o venv``: nothing installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
# Run under `make test`, the outer make's flags (its jobserver, -n, -k) must not reach this run.
ENV = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


@pytest.mark.skipif(MAKE is None, reason="no make on PATH")
def test_the_hooks_are_the_commands_of_make_lint_and_typecheck() -> None:
    assert MAKE is not None
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    [repo] = config["repos"]
    assert repo["repo"] == "local"
    hooks = repo["hooks"]
    for hook in hooks:
        assert hook["language"] == "system" and hook["pass_filenames"] is False, hook
        assert hook["entry"].startswith(".venv/bin/"), hook
    done = subprocess.run(
        [MAKE, "-n", "-o", "venv", "lint", "typecheck"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [hook["entry"] for hook in hooks] == done.stdout.splitlines()
