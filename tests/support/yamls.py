"""YAML for the tests, through libyaml when PyYAML was built with it.

The suite parses the CRDs and the rendered chart hundreds of times (each control plane creates
the CRDs, each chart test renders): pure-Python PyYAML takes 0.3 s for the rendered chart,
libyaml 0.02 s. The same documents either way; ``yaml.safe_dump`` stays as it is.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["load", "load_all"]

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str | bytes) -> Any:
    """One document, as ``yaml.safe_load`` reads it."""
    return yaml.load(text, Loader=_LOADER)


def load_all(text: str | bytes) -> list[Any]:
    """Every document, as ``yaml.safe_load_all`` reads them (empty ones as None)."""
    return list(yaml.load_all(text, Loader=_LOADER))
