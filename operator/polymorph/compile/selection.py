"""Choosing a campaign's result: pure functions over experiment records and figures.

``objective_value``, ``pass_values``, ``value_ci``, ``estimate``, ``score``, ``eligible``,
``record_of``, ``leaderboard``, ``counts``, ``summary`` and ``select_result`` take plain records
(``ExperimentRecord``, ``Figures``, ``Objective``, ``Gates``) and return plain values or the
documents of ``documents``.

The winning rule: paired, interleaved, with a confidence interval. A candidate can only be
shown faster than a baseline by an experiment that benchmarked both in one engine, pass for
pass in ABBA order (``ExperimentRecord.comparison``, against that baseline's build id). From
the two per-pass lists of the objective metric, ``polymorph.contract.stats.paired_ratio`` gives the
speedup (candidate / baseline for maximised metrics such as tok/s, baseline / candidate for
latencies, so > 1 is always better) with a 95% interval; the candidate wins when
``stats.verdict(estimate, minSpeedup)`` is ``better``: the interval's lower end exceeds
``minSpeedup``. It must also have passed verification and honour every objective constraint.
A comparison of two separately measured builds (no pairing) is reported as a ratio of medians
with a bootstrap interval (``stats.ratio``) but is never significant: drift between two
measurements minutes apart must not masquerade as a win. ``speedupNoise`` is the interval's
relative half-width. Among winners (each cleared the gate in its own record paired with the
baseline), those measured by the full protocol come before those only screened, and then the
one with the highest speedup by all the paired evidence (``rank``: a least-squares fit over
every paired record, races between contenders included) is the result; otherwise the result
is an explicit "no improvement" naming the closest miss.

Several sandboxes. Each sandbox's candidates are compared with that sandbox's own baseline
(figures are only comparable within one engine on one host); the result is chosen across
all of them.

This module is pure: it knows nothing about the store, the ledger, runners, agents' choices
or the clock. ``campaign`` is the shell that gathers records and applies the result.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from polymorph.compile.ranking import Edge, Ranking, log_se, solve
from polymorph.contract import stats
from polymorph.contract.api import ExperimentRecord, Figures, Gates, Objective
from polymorph.contract.api.common import Constraint
from polymorph.contract.documents import CampaignResult, Counts, ResultBest, Speedup, Standing

__all__ = [
    "EdgeMemo",
    "Scored",
    "counts",
    "describe",
    "edge_of",
    "eligible",
    "estimate",
    "leaderboard",
    "objective_value",
    "pass_values",
    "rank",
    "ranked",
    "record_of",
    "score",
    "select_result",
    "summary",
    "value_ci",
    "violations",
]

_OBJECTIVE_FIELD = {
    "outputTokensPerSecond": "outputTokensPerSecond",
    "totalTokensPerSecond": "totalTokensPerSecond",
    "ttftP95": "ttftP95Ms",
    "itlP95": "itlP95Ms",
}


def objective_value(figures: Figures, objective: Objective) -> float:
    """The figure the objective optimises (tok/s, or a p95 latency in ms)."""
    return float(getattr(figures, _OBJECTIVE_FIELD[objective.metric]))


def violations(figures: Figures, constraints: Iterable[Constraint]) -> list[str]:
    """One line per objective constraint ``figures`` breaks (empty when all hold)."""
    broken = []
    for c in constraints:
        value = float(getattr(figures, c.metric))
        if c.max is not None and value > c.max:
            broken.append(f"{c.metric} {value:.3g} > max {c.max:g}")
        if c.min is not None and value < c.min:
            broken.append(f"{c.metric} {value:.3g} < min {c.min:g}")
    return broken


def pass_values(figures: Figures, objective: Objective) -> list[float]:
    """The objective metric of each measured pass (empty when the figures do not carry them).

    Every pass generates the same tokens, so total tok/s is output tok/s times a constant and
    the per-pass output tok/s stand for both throughput metrics.
    """
    if objective.metric in ("outputTokensPerSecond", "totalTokensPerSecond"):
        return list(figures.repeats)
    if objective.metric == "ttftP95":
        return list(figures.ttftP95Repeats)
    return list(figures.itlP95Repeats)


def value_ci(figures: Figures, objective: Objective) -> list[float] | None:
    """The 95% interval of the median objective value over passes (None without per-pass values)."""
    values = pass_values(figures, objective)
    if not values:
        return None
    est = stats.median_ci(values)
    scale = objective_value(figures, objective) / est.value if est.value > 0 else 1.0
    return [est.lo * scale, est.hi * scale]


def _oriented(
    candidate: list[float], baseline: list[float], objective: Objective
) -> tuple[list[float], list[float]]:
    """(numerator, denominator) so that the ratio is > 1 when the candidate is better."""
    return (candidate, baseline) if objective.maximize else (baseline, candidate)


def estimate(
    record: ExperimentRecord, against: ExperimentRecord, objective: Objective
) -> tuple[stats.Estimate, bool] | None:
    """``record``'s speedup over ``against`` with its 95% interval, and whether it was paired.

    Paired when ``record`` was benchmarked interleaved with ``against``'s build; otherwise the
    unpaired ratio of medians (``stats.ratio``). None without figures or per-pass values.
    """
    if record.figures is None or against.figures is None:
        return None
    cand = pass_values(record.figures, objective)
    comparison = record.comparison
    if comparison is not None and comparison.against == against.build:
        base = pass_values(comparison.baseline, objective)
        if cand and len(cand) == len(base) and min(cand + base) > 0:
            return stats.paired_ratio(*_oriented(cand, base, objective)), True
    base = pass_values(against.figures, objective)
    if not cand or not base or min(cand + base) <= 0:
        return None
    return stats.ratio(*_oriented(cand, base, objective)), False


def edge_of(record: ExperimentRecord, objective: Objective) -> Edge | None:
    """The edge of the comparison graph (``ranking``) a paired, eligible record measures: log of
    its oriented paired ratio and a normal-equivalent standard error (None: unpaired, failed, or
    fewer than 2 pairs)."""
    comparison = record.comparison
    if comparison is None or record.figures is None or not eligible(record, objective):
        return None
    cand = pass_values(record.figures, objective)
    base = pass_values(comparison.baseline, objective)
    if len(cand) < 2 or len(cand) != len(base) or min(cand + base) <= 0:
        return None
    est = stats.paired_ratio(*_oriented(cand, base, objective))
    if not (math.isfinite(est.hi) and est.lo > 0):
        return None
    se = max(log_se(est.lo, est.hi), 1e-6)
    return Edge(record.build, comparison.against, math.log(est.value), se, est.n)


EdgeMemo = dict[int, tuple[ExperimentRecord, Edge | None]]
"""id(record) -> (the record, its edge) for one objective: a caller that ranks a growing set of
records again and again computes each edge once (the record is kept beside its edge, so its id
stays its own)."""


def rank(
    records: Iterable[ExperimentRecord], base_build: str, objective: Objective, memo: EdgeMemo | None = None
) -> Ranking:
    """Every build the paired records connect to ``base_build``, ranked by all of them at once."""
    edges = []
    for record in records:
        if memo is None:
            edge = edge_of(record, objective)
        else:
            if id(record) not in memo:
                memo[id(record)] = (record, edge_of(record, objective))
            edge = memo[id(record)][1]
        if edge is not None:
            edges.append(edge)
    return solve(edges, base_build)


def eligible(record: ExperimentRecord, objective: Objective) -> bool:
    """Passed, has figures and honours every constraint."""
    return (
        record.status == "passed"
        and record.figures is not None
        and not violations(record.figures, objective.constraints)
    )


def record_of(
    records: Iterable[ExperimentRecord], build: str, base_build: str, objective: Objective
) -> ExperimentRecord | None:
    """The record that stands for ``build``: full and paired with ``base_build`` when there is one,
    else its most precise eligible record; None when it has no eligible record."""
    own = [r for r in records if r.build == build and eligible(r, objective)]
    if not own:
        return None

    def standing(r: ExperimentRecord) -> tuple[bool, bool, float]:
        against_base = r.comparison is not None and r.comparison.against == base_build
        return (against_base, not r.screen, -(r.halfWidth if r.halfWidth is not None else math.inf))

    return max(own, key=standing)


def leaderboard(
    ranking: Ranking,
    records: Sequence[ExperimentRecord],
    baseline: ExperimentRecord,
    objective: Objective,
    limit: int = 10,
) -> list[ExperimentRecord]:
    """Eligible builds by ``ranking`` (speedup over the baseline), best first, each once: by the
    record that stands for it (``record_of``), the baseline by ``baseline``."""
    board = []
    for build in ranking.order():
        record = baseline if build == ranking.base else record_of(records, build, ranking.base, objective)
        if record is not None:
            board.append(record)
        if len(board) >= limit:
            break
    return board


def counts(records: Iterable[ExperimentRecord]) -> Counts:
    """Experiments by status, plus ``total``."""
    by_status = Counter(r.status for r in records)
    return Counts(
        passed=by_status["passed"],
        rejected=by_status["rejected"],
        failed=by_status["failed"],
        crashed=by_status["crashed"],
        timeout=by_status["timeout"],
        total=sum(by_status.values()),
    )


def summary(record: ExperimentRecord, objective: Objective) -> Standing:
    """One eligible record as result and progress documents show it (build, value ±CI, figures)."""
    assert record.figures is not None
    ci = value_ci(record.figures, objective)
    value = objective_value(record.figures, objective)
    return Standing(
        build=record.build,
        value=value,
        noise=(ci[1] - ci[0]) / 2 / value if ci is not None and value > 0 else record.figures.noise,
        sandbox=record.sandbox,
        figures=record.figures,
        valueCi=ci,
        passes=len(pass_values(record.figures, objective)),
    )


@dataclass(frozen=True)
class Scored:
    """A record's speedup over a baseline (``estimate``, with its 95% interval), whether it was
    paired with that baseline, and the verdict at the gate: the one speedup type of ``compile``.

    ``wins``: paired, and the interval's lower end clears the gate (``stats.verdict`` is
    ``better``); an unpaired ratio of two separate measurements never wins."""

    record: ExperimentRecord
    baseline: ExperimentRecord
    estimate: stats.Estimate
    paired: bool
    verdict: stats.Verdict

    @property
    def wins(self) -> bool:
        return self.paired and self.verdict is stats.Verdict.BETTER


def score(
    record: ExperimentRecord, baseline: ExperimentRecord, objective: Objective, min_speedup: float
) -> Scored | None:
    """``record`` against ``baseline`` by the module's rule (None without figures to compare)."""
    found = estimate(record, baseline, objective)
    if found is None:
        return None
    est, paired = found
    return Scored(record, baseline, est, paired, stats.verdict(est, min_speedup))


def ranked(scored: Scored, objective: Objective) -> ResultBest:
    """A scored record as the result shows it."""
    return ResultBest(
        **dict(summary(scored.record, objective)),
        **dict(Speedup.of(scored.estimate, paired=scored.paired)),
        knobs=scored.record.knobs,
    )


def describe(est: stats.Estimate, paired: bool) -> str:
    """``1.43x [1.40, 1.46] ±2.1% (9 pairs)``: a speedup with its 95% interval, for people."""
    behind = f"{est.n} pairs" if paired else f"unpaired, n={est.n}"
    return f"{est.value:.2f}x [{est.lo:.2f}, {est.hi:.2f}] ±{est.half_width * 100:.1f}% ({behind})"


def _paired_with(record: ExperimentRecord, build: str) -> bool:
    return record.comparison is not None and record.comparison.against == build


def select_result(
    ledgers: dict[int, list[ExperimentRecord]], base_build: str, objective: Objective, gates: Gates
) -> CampaignResult:
    """The campaign's result from the ledgers of all its sandboxes (see ``CampaignResult``)."""
    all_records = [r for records in ledgers.values() for r in records]
    result = partial(
        CampaignResult,
        objective=objective,
        minSpeedup=gates.minSpeedup,
        baseBuild=base_build,
        experiments=counts(all_records),
    )
    baselines = {
        sandbox: next((r for r in records if r.build == base_build and eligible(r, objective)), None)
        for sandbox, records in ledgers.items()
    }
    if not any(baselines.values()):
        ran = any(r.build == base_build for r in all_records)
        return result(
            state="noBaseline",
            message=(
                "the base build did not pass verification and benchmark, so nothing could be compared"
                if ran
                else "no experiment ran: the campaign stopped before the base build was measured"
            ),
        )
    scored: list[Scored] = []
    standing: dict[int, float] = {}  # id(scored record) -> its speedup by all of its sandbox's evidence
    for sandbox, records in ledgers.items():
        base = baselines[sandbox]
        if base is None:
            continue
        graph = rank(records, base_build, objective)
        # One record per build: the one that stands for it (full and paired with the baseline
        # before a screen), so a build's lucky screen cannot speak for it over its own final.
        standing_records = (
            record_of(records, b, base_build, objective) for b in dict.fromkeys(r.build for r in records)
        )
        for r in standing_records:
            if r is not None and r.build != base_build and _paired_with(r, base_build):
                s = score(r, base, objective, gates.minSpeedup)
                if s is not None:
                    scored.append(s)
                    overall = graph.speedup(r.build)
                    standing[id(s)] = overall.value if overall is not None else s.estimate.value
    first_base = next(b for b in baselines.values() if b is not None)
    winners = [s for s in scored if s.wins]
    if winners:
        # Every winner's own record cleared the gate paired with the baseline. A winner measured
        # by the full protocol (the judgement's final pairing, or a race) comes before one only
        # screened: a few screening pairs can read high, and the judgement settled its leader
        # in full. Among those, the best is judged by all the paired evidence (races between
        # contenders included), so a lucky screening pass cannot outrank a build that beat it
        # head to head.
        best = max(winners, key=lambda s: (not s.record.screen, standing[id(s)], s.estimate.lo))
        return result(
            state="improved",
            baseline=summary(best.baseline, objective),
            best=ranked(best, objective),
            message=(
                f"{best.record.build} is {describe(best.estimate, True)} the baseline on {objective.metric}, "
                f"paired and interleaved in one engine (gate {gates.minSpeedup:g}x)"
            ),
        )
    # No winner: the unpaired records may name the closest miss (a bootstrap each, so only now).
    for sandbox, records in ledgers.items():
        base = baselines[sandbox]
        if base is None:
            continue
        for r in records:
            if r.build != base_build and eligible(r, objective) and not _paired_with(r, base_build):
                s = score(r, base, objective, gates.minSpeedup)
                if s is not None:
                    scored.append(s)
    if not scored:
        tried = any(r.build != base_build for r in all_records)
        return result(
            state="noImprovement",
            baseline=summary(first_base, objective),
            message=(
                "no improvement: no candidate passed verification, benchmark and constraints"
                if tried
                else "no improvement: no candidate ran (the budget held only the baseline's measurement)"
            ),
        )
    # The closest miss: paired measurements first (an unpaired ratio cannot win), then the speedup.
    miss = max(scored, key=lambda s: (s.paired, s.estimate.value))
    return result(
        state="noImprovement",
        baseline=summary(first_base, objective),
        bestCandidate=ranked(miss, objective),
        message=(
            f"no improvement: the best candidate reached {describe(miss.estimate, miss.paired)}, "
            f"whose interval does not clear the {gates.minSpeedup:g}x gate"
        ),
    )
