"""The build a candidate is paired against, kept loaded beside the engine's current build.

``BaselineSlot`` holds at most one hot path besides the ``Engine``'s current one, over the
same weights (a build derives its state from the shared ``LoadedModel``; fused copies are its
own). ``hotpath(build_dir)`` returns the loaded hot path when the slot already holds that
build (by content id), and otherwise releases the old one and loads the new one: pairing a
stream of candidates against one baseline costs one load, and every pair of passes is a swap
of a pointer, not a reload. The slot also keeps the baseline's benchmark cache
(``bench.ReusedCache``) and whether an experiment has warmed it (``warm``). The cache must be
dropped (``drop_cache``) whenever the engine swaps its build: ``Engine.unload`` clears cuBLAS's
workspaces, and a CUDA graph captured before that (in the baseline's cache) would replay into
freed memory. The baseline hot path itself stays; its next pass prepares a new cache, in the
unmeasured warm-up pass. Memory is bounded by two
builds' derived state (the candidate's and this one's) and their caches. ``close()`` releases
it; so does a load that fails.

It knows nothing about measurement policy, verification or processes.
"""

from __future__ import annotations

import logging
from pathlib import Path

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
        self.cache: ReusedCache | None = None
        """The held baseline's benchmark cache, shared by every experiment paired with it."""
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
        self.cache, self.warm = ReusedCache(hotpath), False
        self.loads += 1
        return ident, hotpath

    def drop_cache(self) -> None:
        """Replace the held baseline's cache by an empty one (call after every engine swap; see the module docstring)."""
        if self.cache is not None and self._hotpath is not None:
            self.cache.release()
            self.cache = ReusedCache(self._hotpath)

    def close(self) -> None:
        """Release the held hot path (no-op when empty); a failing ``close`` is logged, not raised."""
        hotpath, self._hotpath, self.build = self._hotpath, None, None
        if self.cache is not None:
            self.cache.release()
        self.cache, self.warm = None, False
        if hotpath is None:
            return
        try:
            hotpath.close()
        except Exception as exc:
            log.warning("baseline build raised in close(): %s", exc)
        forget_build(hotpath)
