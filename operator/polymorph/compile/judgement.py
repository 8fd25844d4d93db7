"""Judging one sandbox's campaign: where its builds stand, its budget and the reserve kept from the
agent, the races that settle the best build, and the confirmation of the winner.

Read top to bottom, this is why a campaign stopped and how its best build was settled:

1. ``Standings`` reads the sandbox's ledger: which records are eligible, a record scored against
   another (``selection.score`` at a factor of 1), the ranking of every build by all the paired
   records at once (``selection.rank``: least squares over the comparison graph, so no build is
   ranked by a chain of point ratios), and the leaderboard (one record per build).
2. ``SandboxBudget`` is the sandbox's share of the experiments (``budget_share``) and the
   campaign's deadline, counted across every run of the campaign (each run adds its elapsed time
   to the progress document, so a campaign resumed after a kill neither restarts its clock nor
   loses the time it spent). It is checked before an experiment starts (one that is running may
   finish past the deadline: the runner's experiment timeout bounds it). ``ensure`` raises
   ``BudgetExhausted``, with the ``StopReason``, when no new experiment may start: that is why a
   campaign stops. The agent's budget ends where the reserve begins.
3. The reserve (``reserved_experiments``, ``reserved_seconds``) is what the judgement needs: the
   final pairing, its confirmation and ``MAX_CONTENDERS`` races, from what experiments have cost
   so far.
4. ``judge`` spends it: it races the leader's contenders by the full protocol and pairs the
   leader with the baseline, so a deadline never leaves the best measured build unjudged,
   whatever the agent did. ``selection.select_result`` then chooses the result from every
   sandbox's ledger.
5. ``confirm`` measures the winner once more, paired with the baseline, outside the ledger and
   the budget: a load spike during one measurement can fake a win. The new paired ratio must
   clear ``minSpeedup`` again (``stats.verdict`` is ``better``), or the result is "no
   improvement" and the winner becomes ``bestCandidate``.

It knows nothing about the store, the progress document or agents: ``judge`` runs builds through
the callable it is given, ``confirm`` through a runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Literal

from polymorph.compile.ledger import Ledger
from polymorph.compile.ranking import Ranking
from polymorph.compile.selection import (
    EdgeMemo,
    Scored,
    describe,
    eligible,
    leaderboard,
    objective_value,
    rank,
    record_of,
    score,
)
from polymorph.contract.api import Budget, ExperimentRecord, Objective
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.api.common import parse_duration
from polymorph.contract.documents import CampaignResult, Confirmation, Speedup, StopReason
from polymorph.contract.runner import Runner

__all__ = [
    "MAX_CONTENDERS",
    "MAX_LEADERS",
    "RACE_SLACK",
    "BudgetExhausted",
    "RunBuild",
    "SandboxBudget",
    "Standings",
    "budget_share",
    "confirm",
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


class BudgetExhausted(Exception):
    """The campaign may run no more experiments (``reason`` says which budget ran out).

    Raised by ``SandboxBudget.ensure`` before an experiment starts (and by an agent whose own
    budget, such as tokens, is spent); an agent should let it propagate."""

    def __init__(self, reason: StopReason, message: str) -> None:
        super().__init__(message)
        self.reason: StopReason = reason


# --- 1. where the builds stand ----------------------------------------------------------------


class Standings:
    """Where the builds of one sandbox's ledger stand: eligibility, scores, ranking, leaderboard.

    ``baseline`` is the base build's record once the campaign has run (or read) it.
    """

    def __init__(self, ledger: Ledger, base_id: str, objective: Objective) -> None:
        self.ledger = ledger
        self.base_id = base_id
        self.objective = objective
        self.baseline: ExperimentRecord | None = None
        self._ranking: tuple[int, Ranking] | None = None
        self._edges: EdgeMemo = {}

    def measured_baseline(self) -> ExperimentRecord:
        """The baseline's record, for what runs after it (the agent, the judgement)."""
        if self.baseline is None:
            raise RuntimeError("the baseline has not run yet")
        return self.baseline

    def eligible(self, record: ExperimentRecord) -> bool:
        """Passed verification and benchmark, and honours every objective constraint."""
        return eligible(record, self.objective)

    def compare(self, record: ExperimentRecord, against: ExperimentRecord | None = None) -> Scored | None:
        """``record`` scored against ``against`` (default: the baseline) by the paired rule, at a
        factor of 1 (``wins``: paired, and surely better); None when either is not eligible."""
        other = against if against is not None else self.baseline
        if other is None or not self.eligible(record) or not self.eligible(other):
            return None
        return score(record, other, self.objective, 1.0)

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
        """One eligible record per build (the baseline included), best first by all the paired evidence."""
        if self.baseline is None:
            return []
        return leaderboard(self.ranking(), self.ledger.records, self.baseline, self.objective, limit)

    def best(self) -> ExperimentRecord:
        """The leaderboard's top: the build with the best speedup by all the paired evidence so far
        (the baseline at first)."""
        board = self.leaderboard(1)
        return board[0] if board else self.measured_baseline()

    def raced(self, build: str, other: str) -> bool:
        """Whether ``build`` and ``other`` were measured by the full protocol, paired with each other."""
        return any(
            not r.screen
            and r.comparison is not None
            and {r.build, r.comparison.against} == {build, other}
            and self.eligible(r)
            for r in self.ledger.records
        )


# --- 2. the budget, and 3. the reserve kept from the agent ------------------------------------


def budget_share(max_experiments: int, sandboxes: int, sandbox: int) -> int:
    """Sandbox ``sandbox``'s share of the campaign's experiments (shares differ by at most one)."""
    return max_experiments // sandboxes + (1 if sandbox < max_experiments % sandboxes else 0)


def typical_seconds(standings: Standings) -> float:
    """A typical candidate experiment's seconds: the median of those that did not time out, at
    most the baseline's (the baseline's own before any)."""
    base = standings.baseline
    if base is None:
        return 0.0
    totals = sorted(
        r.timings.totalS
        for r in standings.ledger.records
        if r.build != standings.base_id and r.status != "timeout"
    )
    return min(totals[len(totals) // 2], base.timings.totalS) if totals else base.timings.totalS


def final_seconds(standings: Standings) -> float:
    """About what the final pairing with the baseline and its confirmation take. Each runs the
    baseline's passes beside the leader's: about the baseline's own run plus a typical
    candidate's (four baseline runs when candidates cost as much). A reference many times slower
    than its candidates (qwen3-30b-a3b's MoE loop, 20x) costs its own run, not four: on an H100
    the final pairing took 49 s and the confirmation about 45 s beside a 33 s baseline run."""
    base = standings.baseline
    return _final_seconds(base.timings.totalS, typical_seconds(standings)) if base is not None else 0.0


def _final_seconds(baseline_s: float, typical_s: float) -> float:
    return 2 * (baseline_s + typical_s)


def reserved_experiments(share: int) -> int:
    """Experiments kept from the agent for the judgement: the races and the final pairing."""
    if share < 3:
        return 0  # the baseline and one candidate: nothing to judge it against but the baseline
    return min(1 + MAX_CONTENDERS, max(1, share // 4))


def reserved_seconds(standings: Standings, deadline_s: float) -> float:
    """Seconds kept from the agent for the judgement, from what experiments have cost so far: the
    final pairing with the baseline and its confirmation (``final_seconds``), plus ``MAX_CONTENDERS``
    races (each about a typical experiment that did not time out). At most half the deadline."""
    if standings.baseline is None:
        return 0.0
    typical = typical_seconds(standings)  # one pass over the ledger for both terms
    final = _final_seconds(standings.baseline.timings.totalS, typical)
    return min(0.5 * deadline_s, final + MAX_CONTENDERS * typical)


class SandboxBudget:
    """One sandbox's experiments and seconds left, across every run of the campaign.

    ``budget.maxExperiments`` is for the whole campaign; sandbox ``i`` of ``n`` may run its share
    (``budget_share``). While the judgement runs (``judging``) the reserve is its to spend, and its
    final pairing (``final``) runs even past the deadline.
    """

    def __init__(
        self,
        budget: Budget,
        sandbox: int,
        standings: Standings,
        *,
        clock: Callable[[], float],
        prior_elapsed: float = 0.0,
        tokens: TokenUsage | None = None,
    ) -> None:
        self.deadline = budget.deadline
        self.deadline_s = parse_duration(budget.deadline)
        self.share = budget_share(budget.maxExperiments, budget.sandboxes, sandbox)
        self.standings = standings
        self.clock = clock
        self.prior_elapsed = prior_elapsed
        self.tokens = tokens or TokenUsage()
        """API tokens the agent spent, across every run of this campaign."""
        self._session_start = clock()
        self._judging = False
        self._final = False

    def elapsed(self) -> float:
        """Campaign seconds so far, across every run of it."""
        return self.prior_elapsed + self.session_seconds()

    def session_seconds(self) -> float:
        """Seconds of this run alone."""
        return self.clock() - self._session_start

    def reserved_experiments(self) -> int:
        """Experiments kept from the agent for the judgement (``reserved_experiments``)."""
        return reserved_experiments(self.share)

    def reserved_seconds(self) -> float:
        """Seconds kept from the agent for the judgement (``reserved_seconds``)."""
        return reserved_seconds(self.standings, self.deadline_s)

    def experiments_left(self) -> int:
        """Experiments the agent may still start (the judgement's reserve excluded)."""
        held = 0 if self._judging else self.reserved_experiments()
        return max(0, self.share - held - len(self.standings.ledger))

    def seconds_left(self) -> float:
        """Seconds the agent may still start experiments in (the judgement's reserve excluded)."""
        held = 0.0 if self._judging else self.reserved_seconds()
        return max(0.0, self.deadline_s - held - self.elapsed())

    def ensure(self) -> None:
        """Raise ``BudgetExhausted`` when no new experiment may start (experiments or deadline spent).

        The agent's budget ends where the judgement's reserve begins, so the best build it found
        is always judged before the deadline.
        """
        if self.experiments_left() <= 0:
            held = self.reserved_experiments()
            why = (
                f"the experiment budget ({self.share} for this sandbox) is spent"
                if self._judging or not held
                else f"the agent's share of the experiment budget is spent ({self.share - held} of "
                f"{self.share} for this sandbox; {held} kept for the judgement)"
            )
            raise BudgetExhausted("maxExperiments", why)
        if self.seconds_left() <= 0 and not self._final:
            kept = "" if self._judging else f", less {self.reserved_seconds():.0f} s kept for the judgement"
            raise BudgetExhausted("deadline", f"the deadline ({self.deadline}{kept}) has passed")

    def record_usage(self, usage: TokenUsage) -> None:
        """Add an agent's API token usage to the campaign's total (kept in the progress document)."""
        self.tokens = TokenUsage(
            inputTokens=self.tokens.inputTokens + usage.inputTokens,
            outputTokens=self.tokens.outputTokens + usage.outputTokens,
        )

    def judging(self) -> AbstractContextManager[None]:
        """While open, the reserve is the judgement's to spend."""
        return self._while("_judging")

    def final(self) -> AbstractContextManager[None]:
        """While open, a deadline passed does not stop the experiment: its time was reserved."""
        return self._while("_final")

    @contextmanager
    def _while(self, flag: Literal["_judging", "_final"]) -> Iterator[None]:
        setattr(self, flag, True)
        try:
            yield
        finally:
            setattr(self, flag, False)


# --- 4. the races and the final pairing -------------------------------------------------------

RunBuild = Callable[[str, str, ExperimentRecord | None], ExperimentRecord]
"""``run(build, description, against)``: the campaign runs ``build`` by the full protocol, paired
with ``against``'s build (None: the base build), and records it."""


def judge(standings: Standings, budget: SandboxBudget, run: RunBuild) -> None:
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
    with budget.judging():
        try:
            for _ in range(MAX_LEADERS):
                if not _race(standings, budget, run):
                    break
            lead = standings.ranking().leader()
            if lead != standings.base_id and not standings.raced(lead, standings.base_id):
                with budget.final():
                    run(lead, f"final: {short_id(lead)}, the leader, vs the baseline", None)
        except BudgetExhausted:
            pass  # nothing reserved is left: the selection judges what was measured


def _race(standings: Standings, budget: SandboxBudget, run: RunBuild) -> bool:
    """Race the leader's contenders not yet raced against it; whether one beat it (a new leader)."""
    graph = standings.ranking()
    lead = graph.leader()
    if lead == standings.base_id:
        return False
    for rival in graph.contenders(RACE_SLACK, MAX_CONTENDERS + 1)[1:]:
        if rival == standings.base_id or standings.raced(rival, lead):
            continue
        if budget.experiments_left() <= 1 or budget.seconds_left() <= final_seconds(standings):
            return False  # the final pairing's share stays untouched
        leader = standings.record_of(lead)
        record = run(rival, f"race: {short_id(rival)} vs the leader {short_id(lead)}", leader)
        scored = standings.compare(record, standings.record_of(lead))
        if scored is not None and scored.wins:
            return True
    return False


def short_id(build: str) -> str:
    """A build id short enough for a description: ``sha256:`` and 8 hex digits, or the name."""
    return build[:15] if build.startswith("sha256:") else build


# --- 5. the confirmation ----------------------------------------------------------------------


def confirm(
    result: CampaignResult,
    runner: Runner,
    base_dir: Path,
    winner_dir: Path,
    objective: Objective,
    *,
    base_id: str,
) -> CampaignResult:
    """``result`` with its confirmation; demoted to "no improvement" when the winner does not hold up.

    The sandbox writing the result measures the winner once more, paired with the baseline in
    the same engine (ABBA passes, adaptive repeats until the ratio's interval is narrow enough),
    outside the ledger and the budget. ``base_id`` is the content id of ``base_dir`` (what the
    paired record names as ``against``).
    """
    best, baseline = result.best, result.baseline
    assert best is not None and baseline is not None, "only an improved result is confirmed"
    cand = runner.run(
        winner_dir, description="confirmation: the winner again, paired with the baseline", against=base_dir
    )
    confirmation = Confirmation(
        confirmed=False,
        baselineStatus=cand.status,
        bestStatus=cand.status,
        speedup=None,
        speedupNoise=None,
    )
    again: str = cand.status
    if eligible(cand, objective) and cand.comparison is not None and cand.comparison.against == base_id:
        # The baseline record's figures are replaced by the ones measured beside the winner.
        base_record = cand.model_copy(update={"build": base_id, "figures": cand.comparison.baseline})
        scored = score(
            cand.model_copy(update={"build": best.build}), base_record, objective, result.minSpeedup
        )
        if scored is not None:
            est = scored.estimate
            assert cand.figures is not None
            confirmation = confirmation.model_copy(
                update={
                    "confirmed": scored.wins,
                    "baselineValue": objective_value(cand.comparison.baseline, objective),
                    "value": objective_value(cand.figures, objective),
                    # one paired run: its pairs are the estimate's n
                    **dict(Speedup.of(est, paired=True)),
                }
            )
            again = describe(est, scored.paired)
    if confirmation.confirmed:
        return result.model_copy(update={"confirmation": confirmation})
    return result.model_copy(
        update={
            "confirmation": confirmation,
            "state": "noImprovement",
            "bestCandidate": best,
            "best": None,
            "message": (
                f"no improvement: {best.build} measured {best.speedup:.2f}x but did not hold up when "
                f"re-measured paired with the baseline ({again}, gate {result.minSpeedup:g}x)"
            ),
        }
    )
