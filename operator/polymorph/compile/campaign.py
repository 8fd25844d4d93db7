"""A compile campaign: an agent proposes builds, a runner measures them, a ledger remembers them.

The functional core (``objective_value``, ``violations``, ``compare``, ``select_result``,
``counts``, ``budget_share``) lives in ``polymorph.compile.selection``, which also states the
paired winning rule. ``Campaign`` is the shell: it runs the baseline, hands the agent a
``CampaignContext``, appends every experiment to the ledger, keeps the progress document
current, stores each eligible candidate build with its manifest, confirms the winner and
finally writes ``result.json``.

Budget and resuming. ``budget.maxExperiments`` is for the whole campaign; sandbox ``i`` of
``n`` may run its share (``budget_share``). The deadline counts campaign time across runs
(each run adds its elapsed time to the progress document), so a campaign resumed after a
kill neither restarts its clock nor loses the time it already spent. An experiment whose
``(build id, workload hash)`` is already in the ledger is never run again: its recorded
result is returned, which lets a deterministic agent replay its path for free.

Pairing. Every candidate is benchmarked paired with a baseline in the same engine
(``Runner.run(build, against=...)``): by default the base build, or the build an agent names
(``run_experiment(dir, against=record)``: the search pairs its screens with a fast
comparator), by the full protocol or the short screening one (``screen=True``). An
experiment is identified by ``(build id, workload hash, the build it was paired against, the
protocol)``: the same build paired against another baseline, or measured again by the full
protocol, is a new experiment. A timeout counts as "not ready yet" once: the same experiment
may run once more. The base build itself runs alone first. The budget is checked before an
experiment starts; one that is running may finish past the deadline (the runner's experiment
timeout bounds it).

Ranking. ``ranking()`` ranks every build by all the paired records at once
(``selection.rank``: least squares over the comparison graph); the leaderboard, ``best`` and
``versus`` read it, so no build is ranked by a chain of point ratios.

Judgement. The agent's budget ends where a reserve begins (``reserved_experiments``,
``reserved_seconds``: the final pairing, its confirmation and ``MAX_CONTENDERS`` races, from
what experiments have cost so far). Then ``_judge`` races the leader's contenders by the full
protocol and pairs the leader with the baseline, so a deadline never leaves the best measured
build unjudged, whatever the agent did.

Confirmation: ``confirmation.confirm`` re-measures the winner, paired with the baseline, before
it is declared.

A campaign run again after it finished on the same budget reports its result as it was.

Every eligible candidate build is stored with its manifest (parent, knobs, the workload it
was tuned for, figures) when its experiment is recorded, so any sandbox can fetch a winner.

Several sandboxes. Each sandbox measures its own baseline (figures are only comparable
within one engine on one host) and compares its candidates with it. The result is chosen
from every ledger of the campaign, so whichever sandbox finishes last writes the full
result.

It knows nothing about how an experiment runs (the runner does) or how agents decide.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from polymorph.api import Budget, BuildManifest, ExperimentRecord, Gates, Objective, WorkloadProfile
from polymorph.api.build import TokenUsage
from polymorph.api.common import parse_duration
from polymorph.builds import KnobValue, read_build
from polymorph.compile.agents.base import Agent, AgentError, BudgetExhausted, Comparison
from polymorph.compile.confirmation import confirm
from polymorph.compile.documents import (
    CampaignResult,
    Progress,
    ProgressBest,
    ProgressBudget,
    SandboxState,
    StopReason,
)
from polymorph.compile.ledger import CampaignPaths, Ledger
from polymorph.compile.outcome import CampaignOutcome
from polymorph.compile.ranking import Ranking
from polymorph.compile.runner import Runner
from polymorph.compile.selection import (
    budget_share,
    compare,
    counts,
    eligible,
    rank,
    score,
    select_result,
    summary,
)
from polymorph.errors import BuildError
from polymorph.stats import Estimate
from polymorph.store import Store, build_archive_key, build_id

__all__ = ["MAX_CONTENDERS", "Campaign", "CampaignSettings"]

MAX_CONTENDERS = 4
"""The judgement races at most this many contenders against the leader (each once per leader)."""
RACE_SLACK = 0.01
"""A build is a contender when its interval over the leader reaches 1 - this (1%)."""
MAX_LEADERS = 3
"""Leader changes the judgement follows (a contender that beats the leader is raced in turn)."""


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
        self.clock = clock
        self.on_record = on_record
        self._log = log or (lambda _msg: None)
        self.ledger = Ledger(store, settings.paths.ledger(settings.sandbox))
        self.share = budget_share(settings.budget.maxExperiments, settings.budget.sandboxes, settings.sandbox)
        self.deadline_s = parse_duration(settings.budget.deadline)
        self.workload_hash = settings.workload_hash
        self.base_id = build_id(settings.base_dir)
        previous = self._read_progress()
        self._previous = previous
        self.prior_elapsed = previous.elapsedS if previous else 0.0
        self.started_at = previous.startedAt if previous else _now()
        self.tokens = previous.tokens if previous else TokenUsage()
        self._session_start = clock()
        self._ran = 0
        self._cached = 0
        self._dirs: dict[str, Path] = {}
        self._stored: set[str] = set()
        self._tmp = Path(tempfile.mkdtemp(prefix="polymorph-campaign-"))
        self.workdir = self._tmp / "work"
        self.workdir.mkdir()
        self._baseline: ExperimentRecord | None = None
        self._ranking: tuple[int, Ranking] | None = None
        self._judging = False
        self._final = False
        self.state: SandboxState = "running"
        self.stop_reason: StopReason | None = None
        self.message = ""

    # --- clock and budget -------------------------------------------------------------------

    def elapsed(self) -> float:
        """Campaign seconds so far, across every run of it."""
        return self.prior_elapsed + (self.clock() - self._session_start)

    def reserved_experiments(self) -> int:
        """Experiments kept from the agent for the judgement: the races and the final pairing."""
        if self.share < 3:
            return 0  # the baseline and one candidate: nothing to judge it against but the baseline
        return min(1 + MAX_CONTENDERS, max(1, self.share // 4))

    def reserved_seconds(self) -> float:
        """Seconds kept from the agent for the judgement, from what experiments have cost so far:
        the final pairing with the baseline and its confirmation (``_final_seconds``), plus
        ``MAX_CONTENDERS`` races (each about a typical experiment that did not time out). At most
        half the deadline."""
        base = self._baseline
        if base is None:
            return 0.0
        totals = sorted(
            r.timings.totalS for r in self.ledger.records if r.build != self.base_id and r.status != "timeout"
        )
        typical = min(totals[len(totals) // 2], base.timings.totalS) if totals else base.timings.totalS
        need = self._final_seconds() + MAX_CONTENDERS * typical
        return min(0.5 * self.deadline_s, need)

    def experiments_left(self) -> int:
        """Experiments the agent may still start (the judgement's reserve excluded)."""
        held = 0 if self._judging else self.reserved_experiments()
        return max(0, self.share - held - len(self.ledger))

    def seconds_left(self) -> float:
        """Seconds the agent may still start experiments in (the judgement's reserve excluded)."""
        held = 0.0 if self._judging else self.reserved_seconds()
        return max(0.0, self.deadline_s - held - self.elapsed())

    def record_usage(self, usage: TokenUsage) -> None:
        """Add an agent's API token usage to the campaign's total (kept in the progress document)."""
        self.tokens = TokenUsage(
            inputTokens=self.tokens.inputTokens + usage.inputTokens,
            outputTokens=self.tokens.outputTokens + usage.outputTokens,
        )

    def token_usage(self) -> TokenUsage:
        """Tokens the agent has used so far, across every run of this campaign."""
        return self.tokens

    def ensure_budget(self) -> None:
        """Raise ``BudgetExhausted`` when no new experiment may start (experiments or deadline spent).

        The agent's budget ends where the judgement's reserve begins (``reserved_experiments``,
        ``reserved_seconds``), so the best build it found is always judged before the deadline.
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
            raise BudgetExhausted(
                "deadline", f"the deadline ({self.settings.budget.deadline}{kept}) has passed"
            )

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
        the ledger's record of that same pairing (by the same protocol: ``screen`` or full)."""
        bid = build_id(build_dir)
        self._dirs.setdefault(bid, build_dir)
        against_id: str | None = None
        against_dir: Path | None = None
        if bid != self.base_id:
            against_id = against.build if against is not None else self.base_id
            against_dir = self._dir_of(against_id)
        recorded = self._recorded(bid, against_id, screen)
        if recorded is not None:
            self._cached += 1
            if self.on_record is not None:
                self.on_record(recorded, True, self.progress())
            return recorded
        self.ensure_budget()
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

    def _dir_of(self, build: str) -> Path:
        """A directory holding ``build`` (the base, one this campaign ran, or fetched from the store)."""
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

    # --- what agents see --------------------------------------------------------------------

    @property
    def baseline(self) -> ExperimentRecord:
        if self._baseline is None:
            raise RuntimeError("the baseline has not run yet")
        return self._baseline

    def eligible(self, record: ExperimentRecord) -> bool:
        return eligible(record, self.settings.objective)

    def compare(self, record: ExperimentRecord, against: ExperimentRecord | None = None) -> Comparison | None:
        """``record`` against ``against`` (default: the baseline) by the paired rule, at a factor of 1."""
        other = against if against is not None else self._baseline
        if other is None or not self.eligible(record) or not self.eligible(other):
            return None
        return compare(record, other, self.settings.objective)

    def ranking(self) -> Ranking:
        """Every build this sandbox measured, ranked by all its paired records at once
        (``selection.rank``: a least-squares fit over the comparison graph, so a chain of anchors
        is composed with its uncertainty, never as a product of point ratios)."""
        if self._ranking is None or self._ranking[0] != len(self.ledger):
            self._ranking = (
                len(self.ledger),
                rank(self.ledger.records, self.base_id, self.settings.objective),
            )
        return self._ranking[1]

    def speedup(self, record: ExperimentRecord) -> float | None:
        """``record``'s build's speedup over the baseline (> 1 is better) by all the paired
        evidence; None when it cannot be compared."""
        if self._baseline is None or not self.eligible(record):
            return None
        if record.build == self.base_id:
            return 1.0
        est = self.ranking().speedup(record.build)
        return est.value if est is not None else None

    def versus(self, record: ExperimentRecord, against: ExperimentRecord) -> Estimate | None:
        """``record``'s build over ``against``'s by the whole ranking (see ``CampaignContext.versus``)."""
        return self.ranking().versus(record.build, against.build)

    def record_of(self, build: str) -> ExperimentRecord | None:
        """The record that stands for ``build``: full and paired with the baseline when there is one,
        else its most precise eligible record."""
        own = [r for r in self.ledger.records if r.build == build and self.eligible(r)]
        if not own:
            return None

        def standing(r: ExperimentRecord) -> tuple[bool, bool, float]:
            against_base = r.comparison is not None and r.comparison.against == self.base_id
            return (against_base, not r.screen, -(r.halfWidth if r.halfWidth is not None else math.inf))

        return max(own, key=standing)

    def leaderboard(self, limit: int = 10) -> list[ExperimentRecord]:
        """Eligible builds by speedup over the baseline (``ranking``), best first, each by the record
        that stands for it (``record_of``)."""
        if self._baseline is None:
            return []
        board = []
        for build in self.ranking().order():
            record = self.record_of(build) if build != self.base_id else self._baseline
            if record is not None:
                board.append(record)
            if len(board) >= limit:
                break
        return board

    def best(self) -> ExperimentRecord:
        board = self.leaderboard(1)
        return board[0] if board else self.baseline

    def best_dir(self) -> Path:
        return self._dir_of(self.best().build)

    @property
    def sandbox(self) -> int:
        return self.settings.sandbox

    @property
    def sandboxes(self) -> int:
        return self.settings.budget.sandboxes

    @property
    def base_dir(self) -> Path:
        return self.settings.base_dir

    @property
    def workload(self) -> WorkloadProfile | None:
        return self.settings.workload

    @property
    def objective(self) -> Objective:
        return self.settings.objective

    @property
    def gates(self) -> Gates:
        return self.settings.gates

    @property
    def hardware(self) -> str:
        return self.settings.hardware

    def log(self, message: str) -> None:
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
        base = self._baseline
        best: ProgressBest | None = None
        top = self.best() if base is not None else None
        if top is not None and base is not None and top.figures is not None and top is not base:
            # Paired with the baseline: the selection's own verdict; otherwise the ranking's
            # estimate over the baseline, not yet a verdict (never significant).
            against_base = top.comparison is not None and top.comparison.against == self.base_id
            scored = score(top, base, objective, self.settings.gates.minSpeedup) if against_base else None
            est = scored.estimate if scored is not None else self.ranking().speedup(top.build)
            if est is not None:
                best = ProgressBest(
                    **dict(summary(top, objective)),
                    speedup=est.value,
                    speedupNoise=est.half_width,
                    significant=scored is not None and scored.wins,
                    speedupCi=[est.lo, est.hi],
                    pairs=est.n if scored is not None else 0,
                )
        return Progress(
            sandbox=self.settings.sandbox,
            sandboxes=self.settings.budget.sandboxes,
            agent=self.settings.agent,
            state=self.state,
            stopReason=self.stop_reason,
            message=self.message,
            counts=counts(self.ledger.records),
            baseline=summary(base, objective) if base is not None and self.eligible(base) else None,
            best=best,
            startedAt=self.started_at,
            updatedAt=_now(),
            elapsedS=round(self.elapsed(), 3),
            budget=ProgressBudget(
                maxExperiments=self.share,
                experimentsLeft=self.experiments_left(),
                deadlineS=self.deadline_s,
                secondsLeft=round(max(0.0, self.deadline_s - self.elapsed()), 3),
            ),
            tokens=self.tokens,
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

    # --- the judgement ----------------------------------------------------------------------

    def _judge(self) -> None:
        """Settle the best build by the full protocol, whatever the agent did, in the reserve kept for it.

        1. Race: every contender (``Ranking.contenders``: its interval over the leader reaches
           ``1 - RACE_SLACK``) that was not yet measured by the full protocol against the leader
           is, paired with it. A contender that beats the leader becomes the leader, and its own
           contenders are raced in turn (at most ``MAX_LEADERS`` times).
        2. The leader, when it has no full record paired with the baseline, gets one: the
           record the selection judges it by.
        Races stop when the budget is spent; the final pairing runs even then (its time and one
        experiment are reserved), so a deadline never leaves the best measured build unjudged.
        """
        self._judging = True
        try:
            for _ in range(MAX_LEADERS):
                graph = self.ranking()
                lead = graph.leader()
                if lead == self.base_id:
                    return
                rivals = [
                    b
                    for b in graph.contenders(RACE_SLACK, MAX_CONTENDERS + 1)[1:]
                    if not self._raced(b, lead)
                ]
                changed = False
                for rival in rivals:
                    if rival == self.base_id:
                        continue
                    if self.experiments_left() <= 1 or self.seconds_left() <= self._final_seconds():
                        break  # the final pairing's share stays untouched
                    record = self.run_experiment(
                        self._dir_of(rival),
                        description=f"race: {_short(rival)} vs the leader {_short(lead)}",
                        against=self.record_of(lead),
                    )
                    cmp = self.compare(record, self.record_of(lead))
                    if cmp is not None and cmp.significant:
                        changed = True
                        break
                if not changed:
                    break
            lead = self.ranking().leader()
            if lead != self.base_id and not self._raced(lead, self.base_id):
                self._final = True  # its time was reserved: a deadline passed meanwhile does not skip it
                self.run_experiment(
                    self._dir_of(lead), description=f"final: {_short(lead)}, the leader, vs the baseline"
                )
        except BudgetExhausted:
            pass  # nothing reserved is left: the selection judges what was measured
        finally:
            self._judging = self._final = False

    def _raced(self, build: str, other: str) -> bool:
        """Whether ``build`` and ``other`` were measured by the full protocol, paired with each other."""
        return any(
            not r.screen
            and r.comparison is not None
            and {r.build, r.comparison.against} == {build, other}
            and self.eligible(r)
            for r in self.ledger.records
        )

    def _final_seconds(self) -> float:
        """About what the final pairing with the baseline and its confirmation take: each pairs the
        leader with the baseline by the full protocol, about twice the baseline's own run."""
        return 4 * self._baseline.timings.totalS if self._baseline is not None else 0.0

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
            budget.maxExperiments != self.share
            or budget.deadlineS != self.deadline_s
            or not self.store.exists(key)
        ):
            return None
        result = CampaignResult.model_validate(self.store.get_json(key))
        self._baseline = next((r for r in self.ledger.records if r.build == self.base_id), None)
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
            sessionSeconds=self.clock() - self._session_start,
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
            self._baseline = base
            if not self.eligible(base):
                stop = "baselineFailed"
                why = base.error or base.status
                message = f"the base build did not pass ({why}), so no candidate can be compared with it"
            else:
                message = agent.run(self) or "the agent finished"
        except BudgetExhausted as exc:
            stop, message = exc.reason, str(exc)
        except AgentError as exc:
            stop, message = "agentError", str(exc)
        if self._baseline is not None and self.eligible(self._baseline):
            self._judge()
        # "failed" only when nothing could be compared; an agent that failed after the baseline
        # still leaves a valid result (its best so far).
        self.state = "failed" if stop == "baselineFailed" or self._baseline is None else "finished"
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
                self._dir_of(best.build),
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
            sessionSeconds=self.clock() - self._session_start,
            records=list(self.ledger.records),
            bestUri=best_uri,
        )


def _short(build: str) -> str:
    return build[:15] if build.startswith("sha256:") else build


def _build_uri(store: Store, build: str) -> str:
    return store.uri_for(build_archive_key(build))
