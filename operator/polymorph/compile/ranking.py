"""Ranking builds by every paired comparison at once: a least-squares fit over the comparison graph.

A paired experiment measures one edge: ``log(build / against)`` on the objective (oriented so
that > 0 is better), with a standard error from its interval. A campaign pairs builds with
whatever comparator was cheapest at the time: the baseline, a fast anchor, the current best.
Multiplying point ratios along a chain of anchors ignores that each link is uncertain, and
ranking by such a chain is how a noisy link hides the best build. Here every edge goes into
one weighted least-squares problem (the Thurstone / Bradley-Terry model of paired
comparisons): each build gets a log speedup over the baseline, ``u[base] = 0``, that best
explains all edges (weights ``1 / se**2``), and the inverse of the graph's reduced Laplacian is
the covariance of those estimates. For a chain this is exactly the product of the ratios with
their variances added; where two paths join the same builds (a build screened against an
anchor and later raced against the leader) the precise path dominates.

``versus(a, b)`` is the comparison the ranking implies between any two connected builds, with
its interval from the covariance: two builds never paired directly can still be told apart,
and builds measured against the same comparator share its error, which then cancels.

Intervals are normal-equivalent: an edge's ``se`` is its 95% interval's log-width over
``2 * Z95`` (``log_se``), so a small-sample t interval (wide) stays wide here, never narrower.

Pure: edges in, estimates out (``selection.edges`` turns records into edges). It knows nothing
about records, the ledger, runners or agents.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from polymorph.contract import stats

__all__ = ["Z95", "Edge", "Ranking", "log_se", "solve"]

Z95 = 1.959963984540054
"""The normal quantile of a two-sided 95% interval."""


def log_se(lo: float, hi: float) -> float:
    """The normal-equivalent standard error of a log ratio whose 95% interval is ``[lo, hi]`` (> 0)."""
    return (math.log(hi) - math.log(lo)) / (2 * Z95)


@dataclass(frozen=True)
class Edge:
    """One paired measurement: ``log(build / against)`` (> 0 is better) and its standard error."""

    build: str
    against: str
    log_ratio: float
    se: float
    pairs: int


@dataclass(frozen=True)
class Ranking:
    """Log speedups over ``base`` for every build the comparison graph connects to it."""

    base: str
    builds: tuple[str, ...] = ()
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cov: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    pairs: dict[str, int] = field(default_factory=dict)

    def _index(self, build: str) -> int | None:
        """Row of ``build`` in ``mean``; -1 for the base; None when it is not connected."""
        if build == self.base:
            return -1
        try:
            return self.builds.index(build)
        except ValueError:
            return None

    def __contains__(self, build: object) -> bool:
        return isinstance(build, str) and self._index(build) is not None

    def _log(self, build: str) -> tuple[float, np.ndarray] | None:
        """(log speedup, its row of loadings on the estimates) for a connected build."""
        i = self._index(build)
        if i is None:
            return None
        row = np.zeros(len(self.builds))
        if i < 0:
            return 0.0, row
        row[i] = 1.0
        return float(self.mean[i]), row

    def versus(self, a: str, b: str) -> stats.Estimate | None:
        """``a`` over ``b`` (> 1: ``a`` is better) as the whole graph implies it, with a 95% interval."""
        ea, eb = self._log(a), self._log(b)
        if ea is None or eb is None:
            return None
        diff = ea[1] - eb[1]
        mu = ea[0] - eb[0]
        sd = math.sqrt(max(float(diff @ self.cov @ diff), 0.0))
        n = max(
            1,
            min(
                self.pairs.get(a, 1) if a != self.base else 10**6,
                self.pairs.get(b, 1) if b != self.base else 10**6,
            ),
        )
        return stats.Estimate(math.exp(mu), math.exp(mu - Z95 * sd), math.exp(mu + Z95 * sd), n, 0.95)

    def speedup(self, build: str) -> stats.Estimate | None:
        """``build`` over the base."""
        return self.versus(build, self.base)

    def order(self) -> list[str]:
        """Connected builds (the base included), best first by estimated speedup."""
        values = {b: float(self.mean[i]) for i, b in enumerate(self.builds)} | {self.base: 0.0}
        return sorted(values, key=lambda b: -values[b])

    def leader(self) -> str:
        return self.order()[0]

    def contenders(self, slack: float = 0.0, limit: int | None = None) -> list[str]:
        """Builds, the leader first, that may be the best: the interval of build / leader reaches ``1 - slack``."""
        ordered = self.order()
        lead = ordered[0]
        out = [lead]
        for b in ordered[1:]:
            est = self.versus(b, lead)
            if est is not None and est.hi >= 1.0 - slack:
                out.append(b)
        return out[:limit] if limit is not None else out


def solve(all_edges: Iterable[Edge], base: str) -> Ranking:
    """The least-squares ranking of every build that ``all_edges`` connect to ``base``."""
    edges = [e for e in all_edges if e.build != e.against]
    # Keep the component that holds the base: a build paired only with a disconnected one says nothing.
    neighbours: dict[str, set[str]] = {}
    for e in edges:
        neighbours.setdefault(e.build, set()).add(e.against)
        neighbours.setdefault(e.against, set()).add(e.build)
    seen, todo = {base}, [base]
    while todo:
        for nxt in neighbours.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    builds = tuple(sorted(seen - {base}))
    if not builds:
        return Ranking(base)
    index = {b: i for i, b in enumerate(builds)}
    n = len(builds)
    laplacian = np.zeros((n, n))
    rhs = np.zeros(n)
    pairs: dict[str, int] = {}
    for e in edges:
        if e.build not in seen:
            continue
        w = 1.0 / (e.se * e.se)
        i, j = index.get(e.build), index.get(e.against)
        for k, sign in ((i, 1.0), (j, -1.0)):
            if k is not None:
                laplacian[k, k] += w
                rhs[k] += sign * w * e.log_ratio
        if i is not None and j is not None:
            laplacian[i, j] -= w
            laplacian[j, i] -= w
        for b in (e.build, e.against):
            pairs[b] = pairs.get(b, 0) + e.pairs
    cov = np.linalg.inv(laplacian)
    return Ranking(base, builds, cov @ rhs, cov, pairs)
