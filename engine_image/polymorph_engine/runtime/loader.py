"""Importing builds into the running engine: a fresh module per import, unregistered when done.

The entry module of a build (see ``polymorph.contract.builds`` for ``build.toml``) defines
``load(model, knobs) -> HotPath`` (see ``polymorph_engine.runtime.hotpath``). It is imported as a
fresh package ``polymorph_build_<n>_<hash>`` on every call, so two imports of the same directory
are two distinct modules; sibling modules are reached with relative imports (``from . import
layers``). The package stays in ``sys.modules`` only while it is live, because torch.compile
(dynamo) re-imports the modules it traces by name: ``load_hotpath`` removes it when the hot path it
returned is garbage-collected, and ``forget_build`` removes it at once. So nothing accumulates
across hundreds of hot reloads.

This module knows nothing about what a hot path computes, nor about the artifact store. Every
error is a ``BuildError`` naming the build and the entry module.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import itertools
import sys
import types
import weakref
from collections.abc import Mapping
from pathlib import Path

from polymorph.contract.builds import BuildDeclaration, KnobValue, read_build, resolve_knobs
from polymorph.contract.errors import BuildError
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.model import LoadedModel

__all__ = ["forget_build", "import_build", "load_hotpath", "load_local"]

_import_counter = itertools.count(1)


def import_build(dir: Path, spec: BuildDeclaration | None = None) -> types.ModuleType:
    """Import the build's entry module as a fresh, uniquely named package; returns the entry module.

    The package stays registered in ``sys.modules`` until ``forget_build`` is called with the
    module (or anything defined in it). Import failures (syntax errors, missing siblings,
    exceptions at import time) unregister it and become a BuildError whose ``__cause__`` keeps
    the original exception and traceback.
    """
    dir = Path(dir).resolve()
    spec = spec or read_build(dir)
    digest = hashlib.sha256(str(dir).encode()).hexdigest()[:8]
    pkg_name = f"polymorph_build_{next(_import_counter)}_{digest}"
    pkg = types.ModuleType(pkg_name, f"Build {spec.name!r} from {dir}")
    pkg.__path__ = [str(dir)]
    pkg.__package__ = pkg_name
    pkg.__file__ = None
    sys.modules[pkg_name] = pkg
    # No __pycache__ in a build directory: it would change the build's archive (and its id),
    # and sandboxes mount builds read-only.
    saved_flag = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        return importlib.import_module(f"{pkg_name}.{spec.entry[:-3]}")
    except Exception as e:
        _forget_package(pkg_name)
        raise BuildError(
            f"build {spec.name!r}: importing {spec.entry} failed with {type(e).__name__}: {_first_line(e)}."
        ) from e
    finally:
        sys.dont_write_bytecode = saved_flag


def _package_of(obj: object) -> str:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
    return name.split(".", 1)[0]


def _forget_package(pkg_name: str) -> None:
    for key in [k for k in sys.modules if k == pkg_name or k.startswith(pkg_name + ".")]:
        del sys.modules[key]


def forget_build(obj: object) -> None:
    """Unregister the build package that ``obj`` (its module, or an object it defined) came from.

    A no-op for objects that do not come from an imported build.
    """
    pkg_name = _package_of(obj)
    if pkg_name.startswith("polymorph_build_"):
        _forget_package(pkg_name)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0].rstrip(".") if text else "no message"


def load_hotpath(
    model: LoadedModel, build_dir: Path, knobs: Mapping[str, object] | None = None
) -> tuple[HotPath, BuildDeclaration, dict[str, KnobValue]]:
    """Read, resolve, import and ``load`` a build: the hot path, its spec and the knobs it got.

    The build's modules stay importable (for torch.compile) while the hot path is alive, and are
    unregistered from ``sys.modules`` when it is garbage-collected (or by ``forget_build``).
    On rank 0 of a tensor-parallel model the build is loaded on every rank, and the hot path
    returned mirrors each call to them (``parallel.Leader.load``).
    """
    leader = model.shard.leader if model.shard is not None else None
    if leader is not None:
        loaded: tuple[HotPath, BuildDeclaration, dict[str, KnobValue]] = leader.load(Path(build_dir), knobs)
        return loaded
    return load_local(model, build_dir, knobs)


def load_local(
    model: LoadedModel, build_dir: Path, knobs: Mapping[str, object] | None = None
) -> tuple[HotPath, BuildDeclaration, dict[str, KnobValue]]:
    """``load_hotpath`` in this process alone (a tensor-parallel rank loading its own shard)."""
    spec = read_build(Path(build_dir))
    resolved = resolve_knobs(spec, knobs)
    module = import_build(Path(build_dir), spec)
    load = getattr(module, "load", None)
    if not callable(load):
        forget_build(module)
        raise BuildError(f"build {spec.name!r}: {spec.entry} must define load(model, knobs) -> HotPath.")
    try:
        hotpath = load(model, dict(resolved))
    except BaseException:
        forget_build(module)
        raise
    # The build's modules leave sys.modules with the hot path itself. A hot path that cannot be
    # weakly referenced stays registered until the caller's forget_build(hotpath).
    with contextlib.suppress(TypeError):
        weakref.finalize(hotpath, _forget_package, _package_of(module))
    return hotpath, spec, resolved
