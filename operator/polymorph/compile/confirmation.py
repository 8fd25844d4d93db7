"""Confirming a campaign's winner before it is declared.

A load spike during one measurement can fake a win that its own spread does not reveal. So
before a winner is declared, the sandbox writing the result runs the baseline and the winner
once more, back to back, outside the ledger and the budget; the winner must pass the same rule
again (``CampaignResult.confirmation``) or the result is "no improvement" and the winner becomes
``bestCandidate``.

It knows nothing about ledgers, budgets or agents: it takes a result and a runner.
"""

from __future__ import annotations

from pathlib import Path

from polymorph.api import Objective
from polymorph.compile.documents import CampaignResult, Confirmation
from polymorph.compile.runner import Runner
from polymorph.compile.selection import compare, eligible

__all__ = ["confirm"]


def confirm(
    result: CampaignResult, runner: Runner, base_dir: Path, winner_dir: Path, objective: Objective
) -> CampaignResult:
    """``result`` with its confirmation; demoted to "no improvement" when the winner does not hold up."""
    best = result.best
    assert best is not None, "only an improved result is confirmed"
    base = runner.run(base_dir, description="confirmation: the baseline again")
    cand = runner.run(winner_dir, description="confirmation: the winner again")
    min_speedup = result.minSpeedup
    confirmation = Confirmation(confirmed=False, baselineStatus=base.status, bestStatus=cand.status)
    if eligible(base, objective) and eligible(cand, objective):
        assert base.figures is not None and cand.figures is not None
        cmp = compare(cand.figures, base.figures, objective, min_speedup)
        confirmation = confirmation.model_copy(
            update={
                "confirmed": cmp.significant,
                "baselineValue": cmp.baselineValue,
                "value": cmp.value,
                "speedup": cmp.speedup,
                "speedupNoise": cmp.noise,
            }
        )
    if confirmation.confirmed:
        return result.model_copy(update={"confirmation": confirmation})
    again = (
        f"{confirmation.speedup:.2f}x ±{(confirmation.speedupNoise or 0.0) * 100:.0f}%"
        if confirmation.speedup is not None
        else cand.status
    )
    return result.model_copy(
        update={
            "confirmation": confirmation,
            "state": "noImprovement",
            "bestCandidate": best,
            "best": None,
            "message": (
                f"no improvement: {best.build} measured {best.speedup:.2f}x but did not hold up when "
                f"re-measured next to the baseline ({again})"
            ),
        }
    )
