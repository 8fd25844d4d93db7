"""A compile campaign: an agent proposes builds, a runner measures them, a ledger remembers them.

``Campaign`` is the shell of one sandbox's share of a campaign: it runs the baseline, hands
itself to the agent, appends every experiment to the ledger, keeps the progress document
current, stores each eligible candidate build with its manifest, has the best build judged and
confirmed (``judgement.judge``, ``judgement.confirm``), and finally writes ``result.json``.
Why it stopped and how the best build was settled is ``judgement`` (the standings, the budget
and its reserve, the races, the confirmation); what wins is ``selection``; the ranking's
arithmetic is ``ranking``.

What an agent sees. An ``Agent`` is handed the ``Campaign`` and uses its ``settings`` (sandbox,
base build, workload, objective, gates, hardware), its ``standings`` (baseline, scores,
leaderboard, best build), its ``budget`` (experiments and seconds left, tokens), its
``workdir``, ``dir_of`` and ``log``, and one verb: ``run_experiment``. The ledger, the store and
the progress document are the shell's. When the budget or the deadline is spent,
``run_experiment`` raises ``judgement.BudgetExhausted`` and the agent should let it propagate;
an agent that cannot go on (its API failed for good) raises ``AgentError`` with one sentence
for people.

Resuming. An experiment whose ``(build id, workload hash)`` is already in the ledger is never
run again: its recorded result is returned, which lets a deterministic agent replay its path
for free. The budget's clock counts campaign time across runs (``judgement.SandboxBudget``).
A campaign run again after it finished on the same budget reports its result as it was.

Pairing. Every candidate is benchmarked paired with a baseline in the same engine
(``Runner.run(build, against=...)``): by default the base build, or the build an agent names
(``run_experiment(dir, against=record)``: the search pairs its screens with a fast
comparator), by the full protocol or the short screening one (``screen=True``). An
experiment is identified by ``(build id, workload hash, the build it was paired against, the
protocol)``: the same build paired against another baseline, or measured again by the full
protocol, is a new experiment. A timeout counts as "not ready yet" once: the same experiment
may run once more. The base build itself runs alone first.

Every eligible candidate build is stored with its manifest (parent, knobs, the workload it
was tuned for, figures) when its experiment is recorded, so any sandbox can fetch a winner.

Several sandboxes. Each sandbox measures its own baseline (figures are only comparable
within one engine on one host) and compares its candidates with it. The result is chosen
from every ledger of the campaign, so whichever sandbox finishes last writes the full
result.

It knows nothing about how an experiment runs (the runner does) or how agents decide.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from polymorph.compile.judgement import BudgetExhausted, SandboxBudget, Standings, confirm, judge
from polymorph.compile.ledger import CampaignPaths, Ledger
from polymorph.compile.outcome import CampaignOutcome
from polymorph.compile.selection import counts, eligible, score, select_result, summary
from polymorph.contract.api import Budget, BuildManifest, ExperimentRecord, Gates, Objective, WorkloadProfile
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.builds import KnobValue, read_build
from polymorph.contract.documents import (
    CampaignResult,
    Progress,
    ProgressBest,
    ProgressBudget,
    SandboxState,
    Speedup,
    StopReason,
)
from polymorph.contract.errors import BuildError
from polymorph.contract.runner import Runner
from polymorph.contract.store import Store, build_archive_key, build_id

__all__ = ["Agent", "AgentError", "Campaign", "CampaignSettings"]


class AgentError(Exception):
    """The agent cannot go on; the message is one sentence for people and holds no secret."""


class Agent(Protocol):
    """Proposes builds until it is done or the campaign stops it."""

    name: str

    def run(self, campaign: Campaign) -> str:
        """Explore; return a one-line summary when finished. May raise BudgetExhausted or AgentError."""
        ...


@dataclass
class CampaignSettings:
    """Everything that defines one sandbox's share of a campaign."""

    paths: CampaignPaths
    base_dir: Path
    base_build: str
    """``reference`` or a build id: how the campaign's spec names its base build (ledgers use the content id)."""
    workload: WorkloadProfile | None
    """The profile the campaign tunes for (None for a trace without one); goes into manifests."""
    workload_hash: str
    """Identifies the benchmark workload in the ledger (the profile digest or the trace hash)."""
    objective: Objective = field(default_factory=Objective)
    gates: Gates = field(default_factory=Gates)
    budget: Budget = field(default_factory=Budget)
    sandbox: int = 0
    model: str = ""
    hardware: str = ""
    agent: str = ""
    confirm: bool = True
    """Re-measure the winner next to the baseline before declaring it (outside the budget)."""


def _now() -> datetime:
    return datetime.now(UTC)


class Campaign:
    """One sandbox of a campaign. ``run(agent)`` is resumable: run it again after a kill."""

    def __init__(
        self,
        settings: CampaignSettings,
        store: Store,
        runner: Runner,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_record: Callable[[ExperimentRecord, bool, Progress], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.runner = runner
        self.on_record = on_record
        self._log = log or (lambda _msg: None)
        self.ledger = Ledger(store, settings.paths.ledger(settings.sandbox))
        self.workload_hash = settings.workload_hash
        self.base_id = build_id(settings.base_dir)
        previous = self._read_progress()
        self._previous = previous
        self.started_at = previous.startedAt if previous else _now()
        self.standings = Standings(self.ledger, self.base_id, settings.objective)
        self.budget = SandboxBudget(
            settings.budget,
            settings.sandbox,
            self.standings,
            clock=clock,
            prior_elapsed=previous.elapsedS if previous else 0.0,
            tokens=previous.tokens if previous else None,
        )
        self._ran = 0
        self._cached = 0
        self._dirs: dict[str, Path] = {}
        self._stored: set[str] = set()
        self._tmp = Path(tempfile.mkdtemp(prefix="polymorph-campaign-"))
        self.workdir = self._tmp / "work"
        self.workdir.mkdir()
        self.state: SandboxState = "running"
        self.stop_reason: StopReason | None = None
        self.message = ""

    # --- experiments ------------------------------------------------------------------------

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
        the ledger's record of that same pairing (by the same protocol) when it already ran on
        this workload.

        ``usage`` (tokens spent to propose this build) goes into the experiment's record.
        ``screen``: the short screening protocol (a few pairs, a wider interval), for ranking
        many candidates; the judgement races what may be the best by the full protocol before
        the result is chosen.

        Raises ``BudgetExhausted`` when no new experiment may start.
        """
        bid = build_id(build_dir)
        self._dirs.setdefault(bid, build_dir)
        against_id: str | None = None
        against_dir: Path | None = None
        if bid != self.base_id:
            against_id = against.build if against is not None else self.base_id
            against_dir = self.dir_of(against_id)
        recorded = self._recorded(bid, against_id, screen)
        if recorded is not None:
            self._cached += 1
            if self.on_record is not None:
                self.on_record(recorded, True, self.progress())
            return recorded
        self.budget.ensure()
        started = datetime.now(UTC)
        record = self.runner.run(build_dir, description=description, against=against_dir, screen=screen)
        knobs = record.knobs or self._knobs_of(build_dir)
        record = record.model_copy(
            update={
                "build": bid,
                "workloadHash": self.workload_hash,
                "description": description or record.description,
                "sandbox": self.settings.sandbox,
                "agent": self.settings.agent,
                "usage": usage,
                "knobs": knobs,
                "startedAt": started,
                "screen": screen,
            }
        )
        # Store the build before its ledger line: a kill in between reruns it, never loses it.
        if bid != self.base_id and eligible(record, self.settings.objective):
            self._put_build(record, build_dir)
        self.ledger.append(record)
        self._ran += 1
        self._write_progress()
        if self.on_record is not None:
            self.on_record(record, False, self.progress())
        return record

    def _recorded(self, build: str, against: str | None, screen: bool = False) -> ExperimentRecord | None:
        """The ledger's record of ``build`` on this workload, paired with ``against`` (None: alone),
        by the same protocol. A record that timed out while preparing is not one: the build gets
        one more try, warm (see ``retry``)."""
        same = [
            r
            for r in self.ledger.records
            if r.build == build
            and r.workloadHash == self.workload_hash
            and (r.comparison.against if r.comparison is not None else None) == against
            and r.screen == screen
        ]
        settled = [r for r in same if r.status != "timeout"]
        if settled:
            return settled[-1]
        return same[-1] if len(same) >= 2 else None

    def _run_build(self, build: str, description: str, against: ExperimentRecord | None) -> ExperimentRecord:
        """``run_experiment`` by build id, by the full protocol (how the judgement runs builds)."""
        return self.run_experiment(self.dir_of(build), description=description, against=against)

    def dir_of(self, build: str) -> Path:
        """A directory holding ``build`` (the base, one this campaign ran, or fetched from the store;
        read-only for agents: copy it)."""
        if build == self.base_id:
            return self.settings.base_dir
        if build not in self._dirs:
            dest = self._tmp / "fetched" / build.replace(":", "-")
            self._dirs[build] = self.store.get_build(build, dest)
        return self._dirs[build]

    def _knobs_of(self, build_dir: Path) -> dict[str, KnobValue]:
        try:
            spec = read_build(build_dir)
            return {name: knob.default for name, knob in spec.knobs.items()}
        except BuildError:  # a malformed agent-written build: the runner reports why
            return {}

    def _put_build(self, record: ExperimentRecord, build_dir: Path) -> None:
        """Store ``build_dir`` with its manifest: parent, knobs, the workload it was tuned for, figures."""
        if record.build in self._stored:
            return
        name, parent = record.name, record.parent
        try:
            spec = read_build(build_dir)
            name, parent = name or spec.name, parent or spec.parent
        except BuildError:
            pass
        manifest = BuildManifest(
            id=record.build,
            name=name or "candidate",
            parent=parent or self.base_id,
            description=record.description,
            knobs=record.knobs,
            model=self.settings.model,
            hardware=self.settings.hardware,
            workload=self.settings.workload,
            figures=record.figures,
        )
        self.store.put_build(build_dir, manifest)
        self._stored.add(record.build)

    def log(self, message: str) -> None:
        """A line for people (the campaign's display)."""
        self._log(message)

    # --- progress and result ----------------------------------------------------------------

    def _read_progress(self) -> Progress | None:
        key = self.settings.paths.progress(self.settings.sandbox)
        if not self.store.exists(key):
            return None
        return Progress.model_validate(self.store.get_json(key))

    def progress(self) -> Progress:
        """The progress document of this sandbox (what the operator shows in CompileJob status)."""
        objective = self.settings.objective
        base = self.standings.baseline
        best: ProgressBest | None = None
        top = self.standings.best() if base is not None else None
        if top is not None and base is not None and top.figures is not None and top is not base:
            # Paired with the baseline: the selection's own verdict; otherwise the ranking's
            # estimate over the baseline, not yet a verdict (never significant).
            against_base = top.comparison is not None and top.comparison.against == self.base_id
            scored = score(top, base, objective, self.settings.gates.minSpeedup) if against_base else None
            est = scored.estimate if scored is not None else self.standings.ranking().speedup(top.build)
            if est is not None:
                best = ProgressBest(
                    **dict(summary(top, objective)),
                    **dict(Speedup.of(est, paired=scored is not None)),
                    significant=scored is not None and scored.wins,
                )
        return Progress(
            sandbox=self.settings.sandbox,
            sandboxes=self.settings.budget.sandboxes,
            agent=self.settings.agent,
            state=self.state,
            stopReason=self.stop_reason,
            message=self.message,
            counts=counts(self.ledger.records),
            baseline=summary(base, objective) if base is not None and self.standings.eligible(base) else None,
            best=best,
            startedAt=self.started_at,
            updatedAt=_now(),
            elapsedS=round(self.budget.elapsed(), 3),
            budget=ProgressBudget(
                maxExperiments=self.budget.share,
                experimentsLeft=self.budget.experiments_left(),
                deadlineS=self.budget.deadline_s,
                secondsLeft=round(max(0.0, self.budget.deadline_s - self.budget.elapsed()), 3),
            ),
            tokens=self.budget.tokens,
            workloadHash=self.workload_hash,
        )

    def _write_progress(self) -> None:
        key = self.settings.paths.progress(self.settings.sandbox)
        self.store.put_json(key, self.progress().model_dump(mode="json"))

    def _all_ledgers(self) -> dict[int, list[ExperimentRecord]]:
        ledgers: dict[int, list[ExperimentRecord]] = {self.settings.sandbox: list(self.ledger.records)}
        for i in range(self.settings.budget.sandboxes):
            key = self.settings.paths.ledger(i)
            if i != self.settings.sandbox and self.store.exists(key):
                ledgers[i] = [ExperimentRecord.model_validate(x) for x in self.store.read_jsonl(key)]
        return ledgers

    # --- the campaign -----------------------------------------------------------------------

    def run(self, agent: Agent) -> CampaignOutcome:
        """Baseline, then the agent, until it finishes or a budget runs out; then the result."""
        try:
            return self._run(agent)
        except KeyboardInterrupt:  # SIGINT, or SIGTERM (polymorph.cli raises it as Interrupted)
            self._record_interrupted()
            raise
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _record_interrupted(self) -> None:
        """Leave the progress document saying ``interrupted``, with the counts so far (a re-run resumes)."""
        self.state, self.stop_reason = "interrupted", "interrupted"
        self.message = f"interrupted after {len(self.ledger)} experiments ({self._ran} in this run); run it again to resume"
        try:
            self._ran += self.ledger.reload()  # a signal may have landed between its two writes
            self.message = f"interrupted after {len(self.ledger)} experiments ({self._ran} in this run); run it again to resume"
            self._write_progress()
        except Exception as exc:  # the interruption is what must reach the user; this is a footnote
            self._log(f"could not record the interruption in the progress document: {exc}")

    def _finished_before(self) -> CampaignOutcome | None:
        """The outcome of an earlier run that finished this sandbox on the same budget, or None.

        Running a finished campaign again changes nothing: its result stands (what it ran, why
        it stopped, what it kept), so it is reported as it was rather than replayed. A bigger
        budget or a later deadline makes it a campaign with more to do: it resumes.
        """
        previous = self._previous
        key = self.settings.paths.result
        if previous is None or previous.state != "finished" or previous.stopReason is None:
            return None
        budget = previous.budget
        if (
            budget.maxExperiments != self.budget.share
            or budget.deadlineS != self.budget.deadline_s
            or not self.store.exists(key)
        ):
            return None
        result = CampaignResult.model_validate(self.store.get_json(key))
        self.standings.baseline = next((r for r in self.ledger.records if r.build == self.base_id), None)
        self.state, self.stop_reason, self.message = "finished", previous.stopReason, previous.message
        self._cached = len(self.ledger)
        best_uri = _build_uri(self.store, result.best.build) if result.best is not None else None
        return CampaignOutcome(
            result=result,
            progress=self.progress(),
            stopReason=previous.stopReason,
            message=previous.message,
            ranThisSession=0,
            fromLedger=len(self.ledger),
            sessionSeconds=self.budget.session_seconds(),
            records=list(self.ledger.records),
            bestUri=best_uri,
        )

    def _run(self, agent: Agent) -> CampaignOutcome:
        done = self._finished_before()
        if done is not None:
            return done
        stop: StopReason = "finished"
        message = ""
        try:
            base = self.run_experiment(
                self.settings.base_dir, description="baseline: the base build as it is"
            )
            self.standings.baseline = base
            if not self.standings.eligible(base):
                stop = "baselineFailed"
                why = base.error or base.status
                message = f"the base build did not pass ({why}), so no candidate can be compared with it"
            else:
                message = agent.run(self) or "the agent finished"
        except BudgetExhausted as exc:
            stop, message = exc.reason, str(exc)
        except AgentError as exc:
            stop, message = "agentError", str(exc)
        baseline = self.standings.baseline
        if baseline is not None and self.standings.eligible(baseline):
            judge(self.standings, self.budget, self._run_build)
        # "failed" only when nothing could be compared; an agent that failed after the baseline
        # still leaves a valid result (its best so far).
        self.state = "failed" if stop == "baselineFailed" or baseline is None else "finished"
        self.stop_reason = stop
        self.message = message
        self._write_progress()
        result = select_result(
            self._all_ledgers(), self.base_id, self.settings.objective, self.settings.gates
        ).model_copy(
            update={
                "baseBuildName": self.settings.base_build,
                "stopReason": stop,
                "stopMessage": message,
                "workload": self.settings.workload,
                "workloadHash": self.workload_hash,
            }
        )
        if result.state == "improved" and self.settings.confirm:
            best = result.best
            assert best is not None
            self._log(f"confirming {best.build}: re-measuring it next to the baseline")
            result = confirm(
                result,
                self.runner,
                self.settings.base_dir,
                self.dir_of(best.build),
                self.settings.objective,
                base_id=self.base_id,
            )
        best_uri = None
        if result.best is not None:
            best_uri = _build_uri(self.store, result.best.build)
            result = result.model_copy(update={"best": result.best.model_copy(update={"uri": best_uri})})
        self.store.put_json(self.settings.paths.result, result.model_dump(mode="json"))
        return CampaignOutcome(
            result=result,
            progress=self.progress(),
            stopReason=stop,
            message=message,
            ranThisSession=self._ran,
            fromLedger=self._cached,
            sessionSeconds=self.budget.session_seconds(),
            records=list(self.ledger.records),
            bestUri=best_uri,
        )


def _build_uri(store: Store, build: str) -> str:
    return store.uri_for(build_archive_key(build))
