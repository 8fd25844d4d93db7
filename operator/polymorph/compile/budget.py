"""A sandbox's budget: its share of the experiments, the campaign's deadline, and the judgement's reserve.

``budget.maxExperiments`` is for the whole campaign; sandbox ``i`` of ``n`` may run its share
(``selection.budget_share``). The deadline counts campaign time across runs (each run adds its
elapsed time to the progress document), so a campaign resumed after a kill neither restarts
its clock nor loses the time it already spent. The budget is checked before an experiment
starts; one that is running may finish past the deadline (the runner's experiment timeout
bounds it).

The agent's budget ends where the judgement's reserve begins (``judgement.reserved_experiments``
and ``judgement.reserved_seconds``); while the judgement runs (``judging``) the reserve is its
to spend, and its final pairing (``final``) runs even past the deadline.

It knows nothing about how experiments run or what agents do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from polymorph.compile.agents.base import BudgetExhausted
from polymorph.compile.judgement import Standings, reserved_experiments, reserved_seconds
from polymorph.compile.selection import budget_share
from polymorph.contract.api import Budget
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.api.common import parse_duration

__all__ = ["SandboxBudget"]


class SandboxBudget:
    """One sandbox's experiments and seconds left, across every run of the campaign."""

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
        """Experiments kept from the agent for the judgement (``judgement.reserved_experiments``)."""
        return reserved_experiments(self.share)

    def reserved_seconds(self) -> float:
        """Seconds kept from the agent for the judgement (``judgement.reserved_seconds``)."""
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

    @contextmanager
    def judging(self) -> Iterator[None]:
        """While open, the reserve is the judgement's to spend."""
        self._judging = True
        try:
            yield
        finally:
            self._judging = False

    @contextmanager
    def final(self) -> Iterator[None]:
        """While open, a deadline passed does not stop the experiment: its time was reserved."""
        self._final = True
        try:
            yield
        finally:
            self._final = False
