"""What an agent may do in a campaign, and how it learns that it must stop.

An agent is handed a ``CampaignContext``: the base build, the workload, the objective, the
gates and one verb, ``run_experiment(build_dir, against=record)``. The campaign behind it
owns the ledger, the budget, the deadline, resuming and the choice of the result; the agent
only proposes builds. When the budget or the deadline is spent, ``run_experiment`` raises
``BudgetExhausted`` and the agent should let it propagate. An agent that cannot go on
(its API failed for good) raises ``AgentError`` with one sentence for people.

This module knows nothing about how experiments run, or about the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from polymorph.contract.api import ExperimentRecord, Gates, Objective, WorkloadProfile
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.documents import StopReason
from polymorph.contract.stats import Estimate

__all__ = ["Agent", "AgentError", "BudgetExhausted", "CampaignContext", "Comparison", "StopReason"]


class BudgetExhausted(Exception):
    """The campaign may run no more experiments (``reason`` says which budget ran out)."""

    def __init__(self, reason: StopReason, message: str) -> None:
        super().__init__(message)
        self.reason: StopReason = reason


class AgentError(Exception):
    """The agent cannot go on; the message is one sentence for people and holds no secret."""


@dataclass(frozen=True)
class Comparison:
    """A candidate against a baseline on the objective, noise included.

    ``speedup`` > 1 means better (for latency objectives it is baseline / candidate).
    ``noise`` is the relative half-width of the speedup's 95% interval (``Estimate.half_width``;
    inf when no interval could be formed). ``significant`` says the comparison is paired (the
    candidate was benchmarked interleaved with this baseline's build in one engine) and the
    interval's lower bound exceeds the factor (``stats.verdict`` is ``better``); an unpaired
    comparison of two separate measurements is never significant.
    """

    value: float
    baselineValue: float
    speedup: float
    noise: float
    significant: bool


class CampaignContext(Protocol):
    """The campaign as an agent sees it."""

    @property
    def sandbox(self) -> int: ...
    @property
    def sandboxes(self) -> int: ...
    @property
    def base_dir(self) -> Path: ...
    @property
    def workdir(self) -> Path:
        """A private scratch folder for candidate builds (kept until the campaign ends)."""
        ...

    @property
    def workload(self) -> WorkloadProfile | None: ...
    @property
    def objective(self) -> Objective: ...
    @property
    def gates(self) -> Gates: ...
    @property
    def hardware(self) -> str: ...
    @property
    def baseline(self) -> ExperimentRecord: ...

    def run_experiment(
        self,
        build_dir: Path,
        *,
        description: str = "",
        usage: TokenUsage | None = None,
        against: ExperimentRecord | None = None,
        screen: bool = False,
    ) -> ExperimentRecord:
        """Run ``build_dir`` paired with ``against``'s build (default: the base build), or return
        the recorded result of that same pairing when it already ran on this workload.

        ``usage`` (tokens spent to propose this build) goes into the experiment's record.
        ``screen``: the short screening protocol (a few pairs, a wider interval), for ranking
        many candidates; the campaign races what may be the best by the full protocol before
        the result is chosen.

        Raises ``BudgetExhausted`` when no new experiment may start.
        """
        ...

    def compare(self, record: ExperimentRecord, against: ExperimentRecord | None = None) -> Comparison | None:
        """``record`` against ``against`` (default: the baseline) without the minSpeedup factor.

        None when either did not pass or misses figures.
        """
        ...

    def versus(self, record: ExperimentRecord, against: ExperimentRecord) -> Estimate | None:
        """``record``'s build over ``against``'s (> 1: better) by all the paired evidence at once
        (every paired record of the campaign, composed with its uncertainty); None when no
        chain of paired records joins them."""
        ...

    def eligible(self, record: ExperimentRecord) -> bool:
        """Passed verification and benchmark, and honours every objective constraint."""
        ...

    def best(self) -> ExperimentRecord:
        """The record of the build with the best speedup by all the paired evidence so far (the
        baseline at first)."""
        ...

    def best_dir(self) -> Path:
        """A directory holding the best build so far (read-only for agents: copy it)."""
        ...

    def leaderboard(self, limit: int = 10) -> list[ExperimentRecord]:
        """One eligible record per build (the baseline included), best first by all the paired evidence."""
        ...

    def experiments_left(self) -> int:
        """Experiments the agent may still start (what the campaign keeps for its judgement excluded)."""
        ...

    def seconds_left(self) -> float:
        """Seconds the agent may still start experiments in (the judgement's reserve excluded)."""
        ...

    def ensure_budget(self) -> None:
        """Raise ``BudgetExhausted`` when no new experiment may start (so an agent can stop thinking early)."""
        ...

    def record_usage(self, usage: TokenUsage) -> None:
        """Count API tokens the agent spent (the campaign's total goes in the progress document)."""
        ...

    def token_usage(self) -> TokenUsage:
        """Tokens spent so far, across every run of this campaign."""
        ...

    def log(self, message: str) -> None: ...


class Agent(Protocol):
    """Proposes builds until it is done or the campaign stops it."""

    name: str

    def run(self, ctx: CampaignContext) -> str:
        """Explore; return a one-line summary when finished. May raise BudgetExhausted or AgentError."""
        ...
