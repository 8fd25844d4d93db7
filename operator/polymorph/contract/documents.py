"""The documents a compile campaign writes to the store, one pydantic model each.

``Progress`` is ``compilejobs/<ns>/<name>-<uid>/progress-<i>.json``: sandbox ``i``'s state, counts,
budget left, baseline and best so far; it is rewritten after every experiment. ``CampaignResult``
is ``result.json``: the campaign's outcome across every sandbox's ledger (best build or an
explicit "no improvement"). Each is written with ``model_dump(mode="json")`` and read back with
``model_validate`` by the campaign, the sandbox summary and the operator (which maps them onto
CompileJob status). Ledger lines are ``polymorph.contract.api.ExperimentRecord``.

It is torch-free and knows nothing about how the documents are computed (``selection``,
``campaign``) or where they are stored (``ledger.CampaignPaths``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from polymorph.contract.api import ExperimentStatus, Figures, Objective, WorkloadProfile
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.stats import Estimate

__all__ = [
    "CampaignResult",
    "Confirmation",
    "Counts",
    "Progress",
    "ProgressBest",
    "ProgressBudget",
    "ResultBest",
    "ResultState",
    "SandboxState",
    "Speedup",
    "Standing",
    "StopReason",
]

StopReason = Literal[
    "maxExperiments", "deadline", "tokens", "finished", "agentError", "baselineFailed", "interrupted"
]
"""Why a sandbox's campaign stopped (``interrupted``: SIGINT or SIGTERM; a re-run resumes it)."""

SandboxState = Literal["running", "finished", "failed", "interrupted"]
ResultState = Literal["improved", "noImprovement", "noBaseline"]


class _Document(BaseModel):
    """Unknown keys are errors: a document is written and read by this same class."""

    model_config = ConfigDict(extra="forbid")


class Counts(_Document):
    """Experiments by status, plus ``total``."""

    passed: int = 0
    rejected: int = 0
    failed: int = 0
    crashed: int = 0
    timeout: int = 0
    total: int = 0


class Standing(_Document):
    """One eligible experiment as documents show it: its build, objective value, noise and figures.

    ``value`` is the median objective value over the build's measured passes, ``valueCi`` its 95%
    distribution-free interval and ``noise`` that interval's relative half-width (never a range);
    ``passes`` counts the measured passes behind them.
    """

    build: str
    value: float
    noise: float
    sandbox: int
    figures: Figures
    valueCi: list[float] | None = None
    passes: int = 0


Value = TypeVar("Value", float, float | None)


class Speedup(_Document, Generic[Value]):
    """A build's speedup over its sandbox's baseline, with its interval: the fields every document
    that compares a build with the baseline carries (``ProgressBest``, ``ResultBest``, ``Confirmation``).

    ``speedup`` is the candidate / baseline ratio (oriented so that > 1 is better), ``speedupCi``
    its 95% interval, ``speedupNoise`` the interval's relative half-width and ``pairs`` the
    interleaved pairs behind it (0: not paired with the baseline, so the speedup is a ratio of
    medians and never significant). ``Value`` is ``float | None`` where a document may hold no
    speedup (a confirmation whose re-measurement failed).
    """

    speedup: Value
    speedupNoise: Value
    speedupCi: list[float] | None = None
    pairs: int = 0

    @staticmethod
    def of(est: Estimate, *, paired: bool) -> Speedup[float]:
        """The speedup of ``est`` (``pairs`` 0 when it is not a paired ratio); a document takes its
        fields as ``**dict(Speedup.of(...))``."""
        return Speedup[float](
            speedup=est.value,
            speedupNoise=est.half_width,
            speedupCi=[est.lo, est.hi],
            pairs=est.n if paired else 0,
        )


class ProgressBest(Speedup[float], Standing):
    """The best build so far in a sandbox, compared with that sandbox's baseline (``Speedup``).

    ``significant``: paired, and the interval's lower end clears ``minSpeedup``
    (``polymorph.contract.stats.verdict`` is ``better``).
    """

    significant: bool


class ResultBest(Speedup[float], Standing):
    """The campaign's winner (or closest miss), compared with its sandbox's baseline (``Speedup``:
    from the interleaved comparison with the baseline in one engine)."""

    knobs: dict[str, str | bool | int | float]
    uri: str | None = None
    """Where the store keeps the build (set for ``best`` once it is stored)."""


class ProgressBudget(_Document):
    """What is left of this sandbox's share of the budget."""

    maxExperiments: int
    experimentsLeft: int
    deadlineS: float
    secondsLeft: float


class Progress(_Document):
    """``progress-<i>.json``: one sandbox's campaign as it runs."""

    sandbox: int
    sandboxes: int
    agent: str
    state: SandboxState
    stopReason: StopReason | None
    message: str
    counts: Counts
    baseline: Standing | None
    best: ProgressBest | None
    startedAt: datetime
    updatedAt: datetime
    elapsedS: float
    """Campaign seconds across every run of it (the deadline's clock)."""
    budget: ProgressBudget
    tokens: TokenUsage
    workloadHash: str


class Confirmation(Speedup[float | None]):
    """The winner re-measured paired with the baseline (interleaved in one engine) before it is declared.

    Its ``Speedup`` is the new paired ratio (None when the re-measurement gave none); ``confirmed``
    means the interval's lower end clears ``minSpeedup`` again. ``baselineStatus`` and
    ``bestStatus`` are the statuses of the runs behind the two sides (one paired run: the same run).
    """

    confirmed: bool
    baselineStatus: ExperimentStatus
    bestStatus: ExperimentStatus
    baselineValue: float | None = None
    value: float | None = None


class CampaignResult(_Document):
    """``result.json``: the campaign's outcome, chosen from the ledgers of all its sandboxes.

    ``state`` is ``improved`` (``best`` set), ``noImprovement`` (``best`` null; ``bestCandidate``
    names the closest miss) or ``noBaseline`` (no sandbox's baseline passed).
    """

    state: ResultState
    message: str
    objective: Objective
    minSpeedup: float
    baseBuild: str
    """The base build's content id (ledgers key experiments by it)."""
    experiments: Counts
    baseline: Standing | None = None
    best: ResultBest | None = None
    bestCandidate: ResultBest | None = None
    baseBuildName: str = ""
    """How the spec names the base build: ``reference`` or a build id."""
    stopReason: StopReason | None = None
    stopMessage: str = ""
    workload: WorkloadProfile | None = None
    workloadHash: str = ""
    confirmation: Confirmation | None = None
