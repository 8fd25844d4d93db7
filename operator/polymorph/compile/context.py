"""The campaign as an agent sees it: ``AgentContext`` is the campaign's ``CampaignContext``.

An agent reads the campaign's settings (sandbox, base build, workload, objective, gates,
hardware), its standings (baseline, comparisons, leaderboard, best build) and its budget, and
runs experiments through it. Nothing else of the campaign reaches an agent: the ledger, the
store and the progress document stay the shell's.

It knows nothing about how experiments run or how agents decide.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from polymorph.compile.agents.base import Comparison
from polymorph.contract.api import ExperimentRecord, Gates, Objective, WorkloadProfile
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.stats import Estimate

if TYPE_CHECKING:  # the campaign builds its context; typing only, so no import cycle
    from polymorph.compile.campaign import Campaign

__all__ = ["AgentContext"]


class AgentContext:
    """One sandbox's campaign, as ``polymorph.compile.agents.base.CampaignContext`` describes it."""

    def __init__(self, campaign: Campaign) -> None:
        self._campaign = campaign
        self._settings = campaign.settings
        self._standings = campaign.standings
        self._budget = campaign.budget

    # --- settings ---------------------------------------------------------------------------

    @property
    def sandbox(self) -> int:
        return self._settings.sandbox

    @property
    def sandboxes(self) -> int:
        return self._settings.budget.sandboxes

    @property
    def base_dir(self) -> Path:
        return self._settings.base_dir

    @property
    def workdir(self) -> Path:
        return self._campaign.workdir

    @property
    def workload(self) -> WorkloadProfile | None:
        return self._settings.workload

    @property
    def objective(self) -> Objective:
        return self._settings.objective

    @property
    def gates(self) -> Gates:
        return self._settings.gates

    @property
    def hardware(self) -> str:
        return self._settings.hardware

    # --- standings --------------------------------------------------------------------------

    @property
    def baseline(self) -> ExperimentRecord:
        if self._standings.baseline is None:
            raise RuntimeError("the baseline has not run yet")
        return self._standings.baseline

    def eligible(self, record: ExperimentRecord) -> bool:
        return self._standings.eligible(record)

    def compare(self, record: ExperimentRecord, against: ExperimentRecord | None = None) -> Comparison | None:
        return self._standings.compare(record, against)

    def versus(self, record: ExperimentRecord, against: ExperimentRecord) -> Estimate | None:
        return self._standings.ranking().versus(record.build, against.build)

    def leaderboard(self, limit: int = 10) -> list[ExperimentRecord]:
        return self._standings.leaderboard(limit)

    def best(self) -> ExperimentRecord:
        return self._standings.best() or self.baseline

    def best_dir(self) -> Path:
        return self._campaign.dir_of(self.best().build)

    # --- budget and experiments -------------------------------------------------------------

    def experiments_left(self) -> int:
        return self._budget.experiments_left()

    def seconds_left(self) -> float:
        return self._budget.seconds_left()

    def ensure_budget(self) -> None:
        self._budget.ensure()

    def record_usage(self, usage: TokenUsage) -> None:
        self._budget.record_usage(usage)

    def token_usage(self) -> TokenUsage:
        return self._budget.tokens

    def run_experiment(
        self,
        build_dir: Path,
        *,
        description: str = "",
        usage: TokenUsage | None = None,
        against: ExperimentRecord | None = None,
        screen: bool = False,
    ) -> ExperimentRecord:
        return self._campaign.run_experiment(
            build_dir, description=description, usage=usage, against=against, screen=screen
        )

    def log(self, message: str) -> None:
        self._campaign.log(message)
