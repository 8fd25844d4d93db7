"""The ranking and the judgement of one sandbox: where its builds stand, and how the best is settled.

``Standings`` reads one sandbox's ledger: which records are eligible, the paired comparison
of two records, the ranking of every build by all the paired records at once
(``selection.rank``: least squares over the comparison graph, so no build is ranked by a chain
of point ratios), and the leaderboard (one record per build, ``selection.leaderboard``). The
campaign's progress, the agent's context and the judgement all read it.

The judgement. The agent's budget ends where a reserve begins (``reserved_experiments``,
``reserved_seconds``: the final pairing, its confirmation and ``MAX_CONTENDERS`` races, from
what experiments have cost so far). Then ``judge`` races the leader's contenders by the full
protocol and pairs the leader with the baseline, so a deadline never leaves the best measured
build unjudged, whatever the agent did.

It knows nothing about how an experiment runs, the store or the progress document; ``judge``
runs experiments through the campaign (``Judged``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from polymorph.compile.agents.base import BudgetExhausted, Comparison
from polymorph.compile.ledger import Ledger
from polymorph.compile.ranking import Ranking
from polymorph.compile.selection import EdgeMemo, compare, eligible, leaderboard, rank, record_of
from polymorph.contract.api import ExperimentRecord, Objective

__all__ = [
    "MAX_CONTENDERS",
    "MAX_LEADERS",
    "RACE_SLACK",
    "Judged",
    "JudgementBudget",
    "Standings",
    "final_seconds",
    "judge",
    "reserved_experiments",
    "reserved_seconds",
    "short_id",
]

MAX_CONTENDERS = 4
"""The judgement races at most this many contenders against the leader (each once per leader)."""
RACE_SLACK = 0.01
"""A build is a contender when its interval over the leader reaches 1 - this (1%)."""
MAX_LEADERS = 3
"""Leader changes the judgement follows (a contender that beats the leader is raced in turn)."""


class Standings:
    """Where the builds of one sandbox's ledger stand: eligibility, comparisons, ranking, leaderboard.

    ``baseline`` is the base build's record once the campaign has run (or read) it.
    """

    def __init__(self, ledger: Ledger, base_id: str, objective: Objective) -> None:
        self.ledger = ledger
        self.base_id = base_id
        self.objective = objective
        self.baseline: ExperimentRecord | None = None
        self._ranking: tuple[int, Ranking] | None = None
        self._edges: EdgeMemo = {}

    def eligible(self, record: ExperimentRecord) -> bool:
        return eligible(record, self.objective)

    def compare(self, record: ExperimentRecord, against: ExperimentRecord | None = None) -> Comparison | None:
        """``record`` against ``against`` (default: the baseline) by the paired rule, at a factor of 1."""
        other = against if against is not None else self.baseline
        if other is None or not self.eligible(record) or not self.eligible(other):
            return None
        return compare(record, other, self.objective)

    def ranking(self) -> Ranking:
        """Every build this sandbox measured, ranked by all its paired records at once (recomputed
        only when the ledger has grown, each record's edge computed once)."""
        if self._ranking is None or self._ranking[0] != len(self.ledger):
            ranked = rank(self.ledger.records, self.base_id, self.objective, self._edges)
            self._ranking = (len(self.ledger), ranked)
        return self._ranking[1]

    def record_of(self, build: str) -> ExperimentRecord | None:
        """The record that stands for ``build`` (``selection.record_of``)."""
        return record_of(self.ledger.records, build, self.base_id, self.objective)

    def leaderboard(self, limit: int = 10) -> list[ExperimentRecord]:
        """Eligible builds by speedup over the baseline, best first, one record each."""
        if self.baseline is None:
            return []
        return leaderboard(self.ranking(), self.ledger.records, self.baseline, self.objective, limit)

    def best(self) -> ExperimentRecord | None:
        """The leaderboard's top (the baseline at first); None before the baseline ran."""
        board = self.leaderboard(1)
        return board[0] if board else self.baseline

    def raced(self, build: str, other: str) -> bool:
        """Whether ``build`` and ``other`` were measured by the full protocol, paired with each other."""
        return any(
            not r.screen
            and r.comparison is not None
            and {r.build, r.comparison.against} == {build, other}
            and self.eligible(r)
            for r in self.ledger.records
        )


def final_seconds(baseline: ExperimentRecord | None) -> float:
    """About what the final pairing with the baseline and its confirmation take: each pairs the
    leader with the baseline by the full protocol, about twice the baseline's own run."""
    return 4 * baseline.timings.totalS if baseline is not None else 0.0


def reserved_experiments(share: int) -> int:
    """Experiments kept from the agent for the judgement: the races and the final pairing."""
    if share < 3:
        return 0  # the baseline and one candidate: nothing to judge it against but the baseline
    return min(1 + MAX_CONTENDERS, max(1, share // 4))


def reserved_seconds(standings: Standings, deadline_s: float) -> float:
    """Seconds kept from the agent for the judgement, from what experiments have cost so far: the
    final pairing with the baseline and its confirmation (``final_seconds``), plus ``MAX_CONTENDERS``
    races (each about a typical experiment that did not time out). At most half the deadline."""
    base = standings.baseline
    if base is None:
        return 0.0
    totals = sorted(
        r.timings.totalS
        for r in standings.ledger.records
        if r.build != standings.base_id and r.status != "timeout"
    )
    typical = min(totals[len(totals) // 2], base.timings.totalS) if totals else base.timings.totalS
    return min(0.5 * deadline_s, final_seconds(base) + MAX_CONTENDERS * typical)


class JudgementBudget(Protocol):
    """The budget as the judgement spends it (``budget.SandboxBudget``)."""

    def experiments_left(self) -> int: ...
    def seconds_left(self) -> float: ...
    def judging(self) -> AbstractContextManager[None]:
        """While open, the reserve is the judgement's to spend."""
        ...

    def final(self) -> AbstractContextManager[None]:
        """While open, a deadline passed does not stop the experiment (its time was reserved)."""
        ...


class Judged(Protocol):
    """What the judgement needs of the campaign: its standings and budget, and experiments."""

    @property
    def standings(self) -> Standings: ...
    @property
    def budget(self) -> JudgementBudget: ...

    def dir_of(self, build: str) -> Path: ...
    def run_experiment(
        self, build_dir: Path, *, description: str = "", against: ExperimentRecord | None = None
    ) -> ExperimentRecord: ...


def judge(campaign: Judged) -> None:
    """Settle the best build by the full protocol, whatever the agent did, in the reserve kept for it.

    1. Race: every contender (``Ranking.contenders``: its interval over the leader reaches
       ``1 - RACE_SLACK``) that was not yet measured by the full protocol against the leader
       is, paired with it. A contender that beats the leader becomes the leader, and its own
       contenders are raced in turn (at most ``MAX_LEADERS`` times).
    2. The leader, when it has no full record paired with the baseline, gets one: the
       record the selection judges it by.
    Races stop when the budget is spent; the final pairing runs even then (its time and one
    experiment are reserved), so a deadline never leaves the best measured build unjudged.
    """
    standings = campaign.standings
    budget = campaign.budget
    with budget.judging():
        try:
            for _ in range(MAX_LEADERS):
                if not _race(campaign):
                    break
            lead = standings.ranking().leader()
            if lead != standings.base_id and not standings.raced(lead, standings.base_id):
                with budget.final():
                    campaign.run_experiment(
                        campaign.dir_of(lead),
                        description=f"final: {short_id(lead)}, the leader, vs the baseline",
                    )
        except BudgetExhausted:
            pass  # nothing reserved is left: the selection judges what was measured


def _race(campaign: Judged) -> bool:
    """Race the leader's contenders not yet raced against it; whether one beat it (a new leader)."""
    standings = campaign.standings
    graph = standings.ranking()
    lead = graph.leader()
    if lead == standings.base_id:
        return False
    for rival in graph.contenders(RACE_SLACK, MAX_CONTENDERS + 1)[1:]:
        if rival == standings.base_id or standings.raced(rival, lead):
            continue
        budget = campaign.budget
        if budget.experiments_left() <= 1 or budget.seconds_left() <= final_seconds(standings.baseline):
            return False  # the final pairing's share stays untouched
        record = campaign.run_experiment(
            campaign.dir_of(rival),
            description=f"race: {short_id(rival)} vs the leader {short_id(lead)}",
            against=standings.record_of(lead),
        )
        cmp = standings.compare(record, standings.record_of(lead))
        if cmp is not None and cmp.significant:
            return True
    return False


def short_id(build: str) -> str:
    """A build id short enough for a description: ``sha256:`` and 8 hex digits, or the name."""
    return build[:15] if build.startswith("sha256:") else build
