"""The build a candidate is paired against, kept loaded beside the engine's current build.

``BaselineSlot`` holds at most one hot path besides the ``Engine``'s current one, over the
same weights (a build derives its state from the shared ``LoadedModel``; fused copies are its
own). ``hotpath(build_dir)`` returns the loaded hot path when the slot already holds that
build (by content id), and otherwise releases the old one and loads the new one: pairing a
stream of candidates against one baseline costs one load, and every pair of passes is a swap
of a pointer, not a reload. The slot also remembers whether an experiment has warmed the held
baseline (``warm``). It keeps no cache for it: ``Engine.unload`` clears cuBLAS's workspaces at
every swap, so a CUDA graph captured in an earlier experiment's cache would replay into freed
memory; each experiment gives the baseline a fresh cache, prepared in its unmeasured warm-up
pass. Memory is bounded by two builds' derived state (the candidate's and this one's).
``close()`` releases it; so does a load that fails.

It knows nothing about measurement policy, verification or processes.
"""

from __future__ import annotations

import logging
from pathlib import Path

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

    def close(self) -> None:
        """Release the held hot path (no-op when empty); a failing ``close`` is logged, not raised."""
        hotpath, self._hotpath, self.build = self._hotpath, None, None
        self.warm = False
        if hotpath is None:
            return
        try:
            hotpath.close()
        except Exception as exc:
            log.warning("baseline build raised in close(): %s", exc)
        forget_build(hotpath)
