"""What one run of a compile campaign did, and the exit rule every command applies to it.

``CampaignOutcome`` is what ``Campaign.run`` returns to its caller (the documents it wrote plus
this run's counters); ``exit_status`` is the one exit rule of ``polymorph compile`` and
``polymorph sandbox agent``. It knows nothing about how the campaign ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from polymorph.contract.api import ExperimentRecord
from polymorph.contract.documents import CampaignResult, Progress, StopReason

__all__ = ["CampaignOutcome", "exit_status"]


@dataclass
class CampaignOutcome:
    """What one run of a campaign did, for the caller's report."""

    result: CampaignResult
    progress: Progress
    stopReason: StopReason
    message: str
    ranThisSession: int
    fromLedger: int
    sessionSeconds: float
    records: list[ExperimentRecord]
    bestUri: str | None = None


def exit_status(outcome: CampaignOutcome) -> int:
    """The exit rule of ``polymorph compile`` and ``polymorph sandbox agent``: 1 when nothing could be
    compared (the baseline failed) or the agent failed, else 0 (improved or not)."""
    failed = outcome.stopReason in ("agentError", "baselineFailed") or outcome.result.state == "noBaseline"
    return 1 if failed else 0
