"""Builds shipped inside the engine image, as plain directories (package data).

Each subdirectory is a build (``build.toml`` plus Python modules) that ``polymorph.contract.builds``
reads and ``polymorph_engine.runtime.loader`` imports under a fresh module name; nothing here is imported as a regular package module.
``reference/`` is the plain, obviously-correct build that produces golden outputs and whose knobs
span the offline search space.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BUILDS_DIR"]

BUILDS_DIR: Path = Path(__file__).resolve().parent
