"""The hot-reload engine: one loaded model, one build at a time, swapped without a restart.

Owns: the current build and the swap. ``Engine.load_build(dir, knobs)`` first releases the
current build (``HotPath.close()``, drops every reference, runs the garbage collector if
reference cycles kept the hot path alive, and returns cached device memory and cuBLAS
workspaces), then imports the new build as a fresh uniquely named
package (``loader.load_hotpath``) and makes it current. A build's package stays in
``sys.modules`` only while its hot path is live (torch.compile re-imports it by name); ``unload``
calls ``loader.forget_build`` so nothing accumulates there across swaps.
Releasing *before* loading keeps memory bounded by one build's derived state: two builds'
fused weight copies of a large model never coexist. If loading fails, the engine holds no
build and the exception propagates to the caller.

Memory contract: after ``unload()`` nothing the old build derived from the model is
reachable from the engine; 20 swaps leave memory where one swap left it (tested).

It knows nothing about verification, benchmarks or processes, and never touches weights
beyond handing the model to the build.
"""

from __future__ import annotations

import gc
import logging
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polymorph.contract.builds import BuildDeclaration
from polymorph.contract.store import build_id
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.loader import forget_build, load_hotpath
from polymorph_engine.runtime.model import LoadedModel

__all__ = ["Engine", "LoadedBuild", "build_id_of"]

log = logging.getLogger(__name__)


def build_id_of(build_dir: Path) -> str:
    """The content id of a build directory (``sha256:...``), as the store computes it."""
    return str(build_id(build_dir))


@dataclass
class LoadedBuild:
    """A build made current by ``Engine.load_build``."""

    id: str
    build_dir: Path
    spec: BuildDeclaration
    knobs: dict[str, Any]
    hotpath: HotPath
    load_s: float

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def parent(self) -> str | None:
        return self.spec.parent


class Engine:
    """Holds one model and at most one current build. Not thread-safe: one owner thread."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self._current: LoadedBuild | None = None
        self.swaps = 0

    @property
    def current(self) -> LoadedBuild | None:
        return self._current

    @property
    def hotpath(self) -> HotPath:
        if self._current is None:
            raise RuntimeError("no build is loaded; call load_build first")
        return self._current.hotpath

    def load_build(
        self, build_dir: str | Path, knobs: dict[str, Any] | None = None, *, keep_workspaces: bool = False
    ) -> LoadedBuild:
        """Release the current build, then import, prepare and make current the build at ``build_dir``.

        ``keep_workspaces``: see ``unload``."""
        build_dir = Path(build_dir).resolve()
        self.unload(keep_workspaces=keep_workspaces)
        started = time.perf_counter()
        hotpath, spec, resolved = load_hotpath(self.model, build_dir, knobs)
        self._synchronize()
        load_s = time.perf_counter() - started
        self._current = LoadedBuild(build_id_of(build_dir), build_dir, spec, dict(resolved), hotpath, load_s)
        self.swaps += 1
        return self._current

    def unload(self, *, keep_workspaces: bool = False) -> None:
        """Close and forget the current build (no-op without one). A failing ``close`` is logged, not raised.

        ``keep_workspaces``: keep cuBLAS's workspaces, because CUDA graphs captured outside the
        current build (a baseline held for pairing, with its cache) replay into them."""
        current, self._current = self._current, None
        if current is None:
            return
        try:
            current.hotpath.close()
        except Exception as exc:
            log.warning("build %s raised in close(): %s", current.id, exc)
        hotpath = current.hotpath
        forget_build(hotpath)
        del current
        try:
            ref: weakref.ref[Any] | None = weakref.ref(hotpath)
        except TypeError:  # no weakref support: assume it survived
            ref = None
        del hotpath
        if ref is None or ref() is not None:
            # Reference cycles keep it (a bound method stored on itself, say): a full collection
            # frees it. Skipped otherwise, since it costs ~100 ms with torch loaded.
            gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            # cuBLAS keeps a workspace (tens of MB on Hopper) per stream it ever ran on, and a build
            # that captures CUDA graphs on side streams leaves one per stream; they are never
            # released otherwise, so 20 swaps would keep ~20 builds' worth.
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None and not keep_workspaces:
                clear()
            torch.cuda.empty_cache()

    def close(self) -> None:
        """Release the current build. The model stays with its owner."""
        self.unload()

    def _synchronize(self) -> None:
        if torch.device(self.model.device).type == "cuda":
            torch.cuda.synchronize()
