"""Choosing a campaign's result: pure functions over experiment records and figures.

``objective_value``, ``violations``, ``compare``, ``eligible``, ``counts``, ``budget_share``,
``summary`` and ``select_result`` take plain records (``ExperimentRecord``, ``Figures``,
``Objective``, ``Gates``) and return plain values or the documents of ``documents``.

The winning rule, noise-aware. Let ``v`` and ``b`` be the candidate's and the baseline's
objective values and ``nv``, ``nb`` their relative noise (``Figures.noise``: (max - min) /
median over benchmark repeats). A candidate wins when, for maximised metrics (tok/s),
``v * (1 - nv) > b * (1 + nb) * minSpeedup``, and for minimised metrics (latency),
``v * (1 + nv) * minSpeedup < b * (1 - nb)``: it must still be ``minSpeedup`` times better
when both measurements sit at the unfavourable edge of their spread. It must also have
passed verification and honour every objective constraint. ``Figures.noise`` is measured on
output tok/s; for the other objective metrics it stands in as their relative spread. Among
winners the highest speedup is the result; otherwise the result is an explicit "no
improvement". ``speedup`` is ``v / b`` (maximised) or ``b / v`` (minimised), reported with
``speedupNoise = nv + nb``.

Several sandboxes. Each sandbox's candidates are compared with that sandbox's own baseline
(figures are only comparable within one engine on one host); the result is chosen across
all of them.

This module is pure: it knows nothing about the store, the ledger, runners, agents' choices
or the clock. ``campaign`` is the shell that gathers records and applies the result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import partial

from polymorph.api import ExperimentRecord, Figures, Gates, Objective
from polymorph.api.common import Constraint
from polymorph.compile.agents.base import Comparison
from polymorph.compile.documents import CampaignResult, Counts, ResultBest, Standing

__all__ = [
    "budget_share",
    "compare",
    "counts",
    "eligible",
    "objective_value",
    "select_result",
    "summary",
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


def compare(
    candidate: Figures, baseline: Figures, objective: Objective, min_speedup: float = 1.0
) -> Comparison:
    """Candidate versus baseline on the objective; ``significant`` applies the module's winning rule."""
    v, b = objective_value(candidate, objective), objective_value(baseline, objective)
    nv, nb = candidate.noise, baseline.noise
    if v <= 0 or b <= 0:
        return Comparison(v, b, 0.0, nv + nb, False)
    if objective.maximize:
        speedup = v / b
        significant = v * (1 - nv) > b * (1 + nb) * min_speedup
    else:
        speedup = b / v
        significant = v * (1 + nv) * min_speedup < b * (1 - nb)
    return Comparison(v, b, speedup, nv + nb, significant)


def eligible(record: ExperimentRecord, objective: Objective) -> bool:
    """Passed, has figures and honours every constraint."""
    return (
        record.status == "passed"
        and record.figures is not None
        and not violations(record.figures, objective.constraints)
    )


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


def budget_share(max_experiments: int, sandboxes: int, sandbox: int) -> int:
    """Sandbox ``sandbox``'s share of the campaign's experiments (shares differ by at most one)."""
    return max_experiments // sandboxes + (1 if sandbox < max_experiments % sandboxes else 0)


def summary(record: ExperimentRecord, objective: Objective) -> Standing:
    """One eligible record as result and progress documents show it (build, value, noise, figures)."""
    assert record.figures is not None
    return Standing(
        build=record.build,
        value=objective_value(record.figures, objective),
        noise=record.figures.noise,
        sandbox=record.sandbox,
        figures=record.figures,
    )


def _ranked(cmp: Comparison, record: ExperimentRecord, objective: Objective) -> ResultBest:
    return ResultBest(
        **dict(summary(record, objective)),
        speedup=cmp.speedup,
        speedupNoise=cmp.noise,
        knobs=record.knobs,
    )


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
        return result(
            state="noBaseline",
            message="the base build did not pass verification and benchmark, so nothing could be compared",
        )
    scored: list[tuple[Comparison, ExperimentRecord, ExperimentRecord]] = []
    for sandbox, records in ledgers.items():
        base = baselines[sandbox]
        if base is None or base.figures is None:
            continue
        for r in records:
            if r.build != base_build and eligible(r, objective) and r.figures is not None:
                scored.append((compare(r.figures, base.figures, objective, gates.minSpeedup), r, base))
    first_base = next(b for b in baselines.values() if b is not None)
    winners = [s for s in scored if s[0].significant]
    if winners:
        cmp, rec, base = max(winners, key=lambda s: s[0].speedup)
        return result(
            state="improved",
            baseline=summary(base, objective),
            best=_ranked(cmp, rec, objective),
            message=(
                f"{rec.build} is {cmp.speedup:.2f}x the baseline on {objective.metric} "
                f"(±{cmp.noise * 100:.0f}% noise, gate {gates.minSpeedup:g}x)"
            ),
        )
    if not scored:
        return result(
            state="noImprovement",
            baseline=summary(first_base, objective),
            message="no improvement: no candidate passed verification, benchmark and constraints",
        )
    cmp, rec, _ = max(scored, key=lambda s: s[0].speedup)
    return result(
        state="noImprovement",
        baseline=summary(first_base, objective),
        bestCandidate=_ranked(cmp, rec, objective),
        message=(
            f"no improvement: the best candidate reached {cmp.speedup:.2f}x ±{cmp.noise * 100:.0f}%, "
            f"not beyond noise and the {gates.minSpeedup:g}x gate"
        ),
    )
