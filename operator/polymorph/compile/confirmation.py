"""Confirming a campaign's winner before it is declared.

A load spike during one measurement can fake a win. So before a winner is declared, the
sandbox writing the result measures the winner once more, paired with the baseline in the
same engine (ABBA passes, adaptive repeats until the ratio's interval is narrow enough),
outside the ledger and the budget. The new paired ratio must clear ``minSpeedup`` again by the
selection rule (``stats.verdict`` is ``better``), or the result is "no improvement" and the
winner becomes ``bestCandidate``. ``CampaignResult.confirmation`` records the re-measured ratio
with its interval and pairs.

It knows nothing about ledgers, budgets or agents: it takes a result and a runner.
"""

from __future__ import annotations

from pathlib import Path

from polymorph.compile.selection import describe, eligible, objective_value, score
from polymorph.contract.api import Objective
from polymorph.contract.documents import CampaignResult, Confirmation
from polymorph.contract.runner import Runner

__all__ = ["confirm"]


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

    ``base_id`` is the content id of ``base_dir`` (what the paired record names as ``against``).
    """
    best, baseline = result.best, result.baseline
    assert best is not None and baseline is not None, "only an improved result is confirmed"
    cand = runner.run(
        winner_dir, description="confirmation: the winner again, paired with the baseline", against=base_dir
    )
    confirmation = Confirmation(confirmed=False, baselineStatus=cand.status, bestStatus=cand.status)
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
                    "speedup": est.value,
                    "speedupNoise": est.half_width,
                    "speedupCi": [est.lo, est.hi],
                    "pairs": est.n,
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
