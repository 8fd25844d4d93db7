"""The build a candidate is paired against, kept loaded beside the engine's current build.

``BaselineSlot`` holds at most one hot path besides the ``Engine``'s current one, over the
same weights (a build derives its state from the shared ``LoadedModel``; fused copies are its
own). ``hotpath(build_dir)`` returns the loaded hot path when the slot already holds that
build (by content id), and otherwise releases the old one and loads the new one: pairing a
stream of candidates against one baseline costs one load, and every pair of passes is a swap
of a pointer, not a reload. The slot also remembers whether an experiment has warmed the held
baseline (``warm``).

It keeps the baseline's KV cache too (``cache``: a ``bench.ReusedCache`` of the benchmark's
shape) and whatever pass state was built on it (``passes``: a sampled pass keeps a decode
state of up to tens of thousands of positions, which costs seconds of prefill to fill), so an
experiment against a held baseline neither captures its graphs nor fills its state again. The
graphs in that cache were captured with cuBLAS workspaces that ``Engine.unload`` would
otherwise free at each swap; ``keeps_graphs`` tells the engine to keep them while the slot
holds a cache (they are bounded by torch's stream pool, and freed at the next swap after the
baseline changes). Memory is bounded by two builds' derived state and two caches (the
candidate's and this one's). ``close()`` releases it all; so does a load that fails.

It knows nothing about measurement policy, verification or processes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from polymorph_engine.experiment.bench import ReusedCache
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.hotreload import build_id_of
from polymorph_engine.runtime.loader import forget_build, load_hotpath
from polymorph_engine.runtime.model import LoadedModel

__all__ = ["BaselineSlot"]

log = logging.getLogger(__name__)


class BaselineSlot:
    """One baseline hot path, loaded on demand and kept until another baseline is asked for."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.build: str | None = None
        self._hotpath: HotPath | None = None
        self._cache: ReusedCache | None = None
        self._passes: dict[Hashable, Any] = {}
        self.warm = False
        """Whether an experiment has measured the held baseline (its passes reached a steady state)."""
        self.loads = 0

    def hotpath(self, build_dir: Path) -> tuple[str, HotPath]:
        """``(build id, hot path)`` of ``build_dir`` at its default knobs, loading it if the slot holds another."""
        ident = build_id_of(Path(build_dir))
        if self._hotpath is not None and self.build == ident:
            return ident, self._hotpath
        self.close()
        hotpath, _, _ = load_hotpath(self.model, Path(build_dir))
        self._hotpath, self.build = hotpath, ident
        self.warm = False
        self.loads += 1
        return ident, hotpath

    def cache(self, shape: tuple[int, int]) -> ReusedCache:
        """The held baseline's cache of ``shape``, kept across experiments (a new one for a new shape)."""
        if self._hotpath is None:
            raise RuntimeError("the slot holds no baseline; call hotpath first")
        if self._cache is None or self._cache.shape != shape:
            self._passes.clear()
            self._cache = ReusedCache(self._hotpath, shape)
        return self._cache

    def passes(self, key: Hashable, make: Callable[[ReusedCache], Any], shape: tuple[int, int]) -> Any:
        """The pass runner ``make(cache)`` built for ``key`` on the held cache of ``shape``, kept
        with it: a sampled pass's decode state survives from one experiment to the next."""
        cache = self.cache(shape)
        if key not in self._passes:
            self._passes[key] = make(cache)
        return self._passes[key]

    @property
    def keeps_graphs(self) -> bool:
        """Whether a swap of the engine's build must keep the device's cuBLAS workspaces (see the module docstring)."""
        return self._cache is not None

    def close(self) -> None:
        """Release the held hot path and its cache (no-op when empty); a failing ``close`` is logged, not raised."""
        hotpath, self._hotpath, self.build = self._hotpath, None, None
        self._passes.clear()
        if self._cache is not None:
            self._cache.release()
            self._cache = None
        self.warm = False
        if hotpath is None:
            return
        try:
            hotpath.close()
        except Exception as exc:
            log.warning("baseline build raised in close(): %s", exc)
        forget_build(hotpath)
