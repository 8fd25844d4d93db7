"""Test support for the compile tests: a ``PairedComparison`` computed from two builds' figures."""

from __future__ import annotations

from polymorph.contract import stats
from polymorph.contract.api import Figures
from polymorph.contract.api.build import PairedComparison

__all__ = ["paired"]


def paired(cand: Figures, base: Figures, against: str) -> PairedComparison:
    """``cand`` paired pass for pass with ``base`` (the build ``against``), as an engine would record it."""
    est = stats.paired_ratio(cand.repeats, base.repeats)
    return PairedComparison(
        against=against,
        ratio=est.value,
        lo=est.lo,
        hi=est.hi,
        pairs=est.n,
        halfWidth=est.half_width,
        baseline=base,
    )
