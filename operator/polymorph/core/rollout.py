"""The canary rollout state machine: (state, observation) -> (next state, actions).

Phases: Idle -> Progressing (step i) -> Promoting -> Succeeded, with Paused (``onFailure:
Pause``, resumed by ``polymorph.dev/approve=<build>``), RollingBack -> RolledBack (analysis
failed ``failureLimit`` + 1 times in a row with ``onFailure: Rollback``) and RollingBack ->
Aborted (``polymorph.dev/abort: "true"``).

Rules:
- The split is by replicas: step weight w gives ``ceil(replicas * w / 100)`` canary replicas
  (at least 1). The stable Deployment is scaled down only by as many canary replicas as are
  *ready*, so ready capacity never drops below the stable replicas that were ready; the
  actual weight reported is the canary's share of ready replicas.
- A step is *settled* when its canary replicas are ready; ``stepStartedAt`` is then set, and
  the step's pause and analysis interval count from it. Analysis is due every ``interval``
  after that. The step advances once its pause has passed and its latest analysis passed,
  and never while the metrics cannot be read (``metrics_ok`` false: Prometheus is down).
- The state is ``polymorph.contract.api.RolloutStatus``, the record the operator keeps in
  ``status.rollout`` (``to_status`` adds the weights shown to people, ``from_status`` reads
  the state back; the two round-trip exactly), and
  times come from recorded timestamps; after a restart it continues where it was. Replaying
  an observation already applied gives no new action: events and effects happen only on
  transitions, and the desired replica counts are a function of state and observation.

It knows nothing about Kubernetes: ``desired`` says which build runs on how many replicas
per track, and the handlers make the Deployments so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from polymorph.contract.api import RolloutPhase, RolloutStatus
from polymorph.core.analysis import AnalysisRun

__all__ = [
    "TERMINAL",
    "Action",
    "Emit",
    "Observation",
    "Promote",
    "Record",
    "Step",
    "TrackObservation",
    "Tracks",
    "actual_weight",
    "analysis_due",
    "canary_replicas",
    "desired",
    "from_status",
    "step",
    "to_status",
]

TERMINAL: frozenset[RolloutPhase] = frozenset({"Idle", "Succeeded", "RolledBack", "Aborted"})
"""Phases in which no rollout is under way."""


@dataclass(frozen=True)
class Step:
    weight: int
    pause_s: float


@dataclass(frozen=True)
class TrackObservation:
    """One Deployment as observed: its build, desired and ready replicas, and whether it is rolled out."""

    build: str
    replicas: int
    ready: int
    updated: bool = True
    """The Deployment controller has observed the latest spec and every replica runs it."""
    stuck: str | None = None
    """The Deployment controller's message when it gave up waiting (``ProgressDeadlineExceeded``)."""


@dataclass(frozen=True)
class Observation:
    """What the handler gathered for one tick."""

    now: datetime
    replicas: int
    steps: tuple[Step, ...]
    interval_s: float
    failure_limit: int
    on_failure: Literal["Rollback", "Pause"]
    active: str
    candidate: str | None
    policy: Literal["Auto", "Manual"]
    stable: TrackObservation | None
    canary: TrackObservation | None
    analysis: AnalysisRun | None = None
    abort: bool = False
    approved: str | None = None
    metrics_ok: bool = True
    """False while Prometheus does not answer: no step advances on numbers that could not be checked."""


@dataclass(frozen=True)
class Emit:
    """A Kubernetes Event to post on the ModelDeployment."""

    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"


@dataclass(frozen=True)
class Promote:
    """The candidate becomes the active build."""

    build: str


@dataclass(frozen=True)
class Record:
    """Append a finished rollout to status.history."""

    build: str
    fromBuild: str | None
    outcome: Literal["Promoted", "RolledBack", "Aborted"]
    startedAt: datetime | None
    finishedAt: datetime
    reason: str | None


Action = Emit | Promote | Record


@dataclass(frozen=True)
class Tracks:
    """Which build runs on how many replicas, per track (canary None: no canary Deployment)."""

    stable: tuple[str, int]
    canary: tuple[str, int] | None = None
    notes: list[str] = field(default_factory=list)


def canary_replicas(replicas: int, weight: int) -> int:
    """Canary replicas for a step weight: ``ceil(replicas * weight / 100)``, at least 1, at most all."""
    if replicas <= 0:
        return 0
    return min(replicas, max(1, math.ceil(replicas * weight / 100)))


def actual_weight(obs: Observation) -> float:
    """The canary's share of ready replicas, in percent."""
    canary = obs.canary.ready if obs.canary is not None else 0
    stable = obs.stable.ready if obs.stable is not None else 0
    total = canary + stable
    return round(100.0 * canary / total, 2) if total else 0.0


def _ready(track: TrackObservation | None, build: str | None) -> int:
    if track is None or track.build != build:
        return 0
    return track.ready


def desired(state: RolloutStatus, obs: Observation) -> Tracks:
    """The Deployments this state wants, given what is ready now."""
    if state.phase in ("Progressing", "Paused") and state.build is not None:
        target = canary_replicas(obs.replicas, obs.steps[min(state.step, len(obs.steps) - 1)].weight)
        ready = min(target, _ready(obs.canary, state.build))
        return Tracks((obs.active, obs.replicas - ready), (state.build, target))
    if state.phase == "Promoting" and state.build is not None:
        return Tracks((state.build, obs.replicas), (state.build, state.canaryReplicas))
    if state.phase == "RollingBack" and state.build is not None:
        return Tracks((obs.active, obs.replicas), (state.build, state.canaryReplicas))
    return Tracks((obs.active, obs.replicas), None)


def analysis_due(state: RolloutStatus, obs: Observation) -> bool:
    """Whether this tick should run an analysis (the handler then queries and passes it in)."""
    if state.phase != "Progressing" or state.stepStartedAt is None:
        return False
    since = state.lastAnalysisAt or state.stepStartedAt
    return obs.now >= since + timedelta(seconds=obs.interval_s)


def _with_replicas(state: RolloutStatus, obs: Observation) -> RolloutStatus:
    tracks = desired(state, obs)
    canary = tracks.canary[1] if tracks.canary is not None else 0
    return state.model_copy(update={"canaryReplicas": canary, "stableReplicas": tracks.stable[1]})


def _step_event(state: RolloutStatus, obs: Observation) -> Emit:
    weight = obs.steps[state.step].weight
    target = canary_replicas(obs.replicas, weight)
    return Emit(
        "CanaryStep",
        f"step {state.step + 1}/{len(obs.steps)}: {state.build} at weight {weight}% "
        f"({target} of {obs.replicas} replicas on the canary, {obs.replicas - target} stable)",
    )


def _start(state: RolloutStatus, obs: Observation) -> tuple[RolloutStatus, list[Action]]:
    candidate = obs.candidate
    if candidate is None or candidate == obs.active:
        return state, []
    if state.build == candidate and state.phase != "Idle":
        return state, []  # this candidate's rollout already ran; a new candidate starts a new one
    if obs.policy == "Manual" and obs.approved != candidate:
        message = f"build {candidate} waits for approval: annotate polymorph.dev/approve={candidate}"
        if state.message == message:
            return state, []
        return state.model_copy(update={"message": message}), [Emit("WaitingForApproval", message)]
    new = RolloutStatus(
        phase="Progressing", build=candidate, fromBuild=obs.active, step=0, startedAt=obs.now,
        message=f"rolling out {candidate} (from {obs.active})",
    )  # fmt: skip
    return new, [_step_event(new, obs)]


def _rollback(
    state: RolloutStatus, obs: Observation, target: Literal["RolledBack", "Aborted"], why: str
) -> RolloutStatus:
    return state.model_copy(
        update={"phase": "RollingBack", "target": target, "reason": why, "message": f"rolling back: {why}"}
    )


def _finish(state: RolloutStatus, obs: Observation) -> tuple[RolloutStatus, list[Action]]:
    """RollingBack ends once the stable track is back at full strength; Promoting once it runs the build."""
    stable = obs.stable
    full = stable is not None and stable.updated and stable.ready >= obs.replicas
    if state.phase == "Promoting":
        if not (full and stable is not None and stable.build == state.build):
            return state, []
        done = state.model_copy(
            update={"phase": "Succeeded", "finishedAt": obs.now, "message": f"{state.build} promoted"}
        )
        record = Record(state.build or "", state.fromBuild, "Promoted", state.startedAt, obs.now, None)
        return done, [
            Promote(state.build or ""),
            record,
            Emit("Promoted", f"{state.build} now serves all {obs.replicas} replicas (was {state.fromBuild})"),
        ]
    if not (full and stable is not None and stable.build == obs.active):
        return state, []
    outcome = state.target or "RolledBack"
    done = state.model_copy(
        update={"phase": outcome, "finishedAt": obs.now, "message": f"{outcome}: {state.reason}"}
    )
    record = Record(state.build or "", state.fromBuild, outcome, state.startedAt, obs.now, state.reason)
    kind: Literal["Normal", "Warning"] = "Warning"
    return done, [
        record,
        Emit(
            outcome,
            f"{state.build} removed, {obs.active} serves all {obs.replicas} replicas: {state.reason}",
            kind,
        ),
    ]


def _analyse(state: RolloutStatus, obs: Observation) -> tuple[RolloutStatus, list[Action]]:
    run = obs.analysis
    if run is None or not analysis_due(state, obs):
        return state, []
    values = [m.status(run.at) for m in run.metrics]
    update: dict[str, object] = {"lastAnalysisAt": obs.now, "lastVerdict": run.verdict, "analysis": values}
    text = run.describe()
    if run.verdict == "Pass":
        update["failures"] = 0
        return state.model_copy(update=update), [Emit("AnalysisPassed", f"step {state.step + 1}: {text}")]
    if run.verdict == "Inconclusive":
        return state.model_copy(update=update), [
            Emit("AnalysisInconclusive", f"step {state.step + 1}: {text}")
        ]
    failures = state.failures + 1
    update["failures"] = failures
    new = state.model_copy(update=update)
    events: list[Action] = [
        Emit(
            "AnalysisFailed",
            f"step {state.step + 1}, failure {failures} of {obs.failure_limit + 1}: {text}",
            "Warning",
        )
    ]
    if failures <= obs.failure_limit:
        return new, events
    why = f"analysis failed {failures} times in a row ({text})"
    if obs.on_failure == "Pause":
        hint = f"annotate polymorph.dev/approve={state.build} (anew) to resume, or polymorph.dev/abort=true"
        paused = new.model_copy(
            update={
                "phase": "Paused",
                "reason": why,
                "message": f"paused: {why}; {hint}",
                "approvalAtPause": obs.approved == state.build,
            }
        )
        return paused, [
            *events,
            Emit("Paused", f"{state.build} paused at step {state.step + 1}: {why}", "Warning"),
        ]
    return _rollback(new, obs, "RolledBack", why), events


def _advance(state: RolloutStatus, obs: Observation) -> tuple[RolloutStatus, list[Action]]:
    if state.stepStartedAt is None or state.lastVerdict != "Pass" or not obs.metrics_ok:
        return state, []
    pause = obs.steps[state.step].pause_s
    if obs.now < state.stepStartedAt + timedelta(seconds=pause):
        return state, []
    fresh = {"stepStartedAt": None, "lastAnalysisAt": None, "lastVerdict": None, "failures": 0}
    if state.step + 1 < len(obs.steps):
        new = state.model_copy(update={"step": state.step + 1, **fresh})
        return new, [_step_event(new, obs)]
    new = state.model_copy(
        update={
            "phase": "Promoting",
            **fresh,
            "message": f"promoting {state.build} to all {obs.replicas} replicas",
        }
    )
    return new, [Emit("Promoting", f"{state.build} passed all {len(obs.steps)} steps; promoting")]


def _progress(state: RolloutStatus, obs: Observation) -> tuple[RolloutStatus, list[Action]]:
    if state.step >= len(obs.steps):  # the steps were shortened mid-rollout
        state = state.model_copy(update={"step": len(obs.steps) - 1})
    target = canary_replicas(obs.replicas, obs.steps[state.step].weight)
    if state.stepStartedAt is None:
        if _ready(obs.canary, state.build) < target:
            return state, []
        state = state.model_copy(update={"stepStartedAt": obs.now})
    state, events = _analyse(state, obs)
    if state.phase != "Progressing":
        return state, events
    state, more = _advance(state, obs)
    return state, [*events, *more]


def step(state: RolloutStatus, obs: Observation) -> tuple[RolloutStatus, list[Action]]:
    """The next state and the actions to take, from the current state and this tick's observation."""
    actions: list[Action] = []
    if state.phase in ("Progressing", "Paused") and obs.abort:
        state = _rollback(state, obs, "Aborted", "aborted by annotation polymorph.dev/abort")
        actions.append(
            Emit(
                "Aborting", f"{state.build}: rollout aborted by annotation; restoring {obs.active}", "Warning"
            )
        )
    elif state.phase in ("Progressing", "Paused", "Promoting") and obs.candidate != state.build:
        state = _rollback(state, obs, "Aborted", f"the candidate changed to {obs.candidate}")
        actions.append(Emit("Aborting", f"{state.build}: {state.reason}", "Warning"))
    if state.phase in TERMINAL:
        state, more = _start(state, obs)
        actions += more
    elif state.phase == "Paused":
        if state.approvalAtPause and obs.approved != state.build:
            state = state.model_copy(update={"approvalAtPause": False})
        elif obs.approved == state.build and not state.approvalAtPause:
            state = state.model_copy(
                update={"phase": "Progressing", "failures": 0, "stepStartedAt": None, "lastAnalysisAt": None,
                        "lastVerdict": None, "reason": None, "message": f"resumed {state.build} by approval"}
            )  # fmt: skip
            actions.append(Emit("Resumed", f"{state.build} resumed at step {state.step + 1} by approval"))
    if state.phase == "Progressing":
        state, more = _progress(state, obs)
        actions += more
    if state.phase in ("Promoting", "RollingBack"):
        state, more = _finish(state, obs)
        actions += more
    return _with_replicas(state, obs), actions


def to_status(state: RolloutStatus, obs: Observation | None) -> RolloutStatus:
    """``status.rollout``: the whole state, plus the desired and actual canary weight for people."""
    weight = None
    if obs is not None and state.phase not in TERMINAL and obs.steps:
        weight = obs.steps[min(state.step, len(obs.steps) - 1)].weight
    return state.model_copy(
        update={"weight": weight, "actualWeight": actual_weight(obs) if obs is not None else None}
    )


def from_status(status: RolloutStatus | None) -> RolloutStatus:
    """The state recorded in ``status.rollout`` (Idle when there is none), to continue from.

    The weights are views written beside the state, not part of it: they are dropped, so a
    state read back equals the state written.
    """
    if status is None:
        return RolloutStatus()
    return status.model_copy(update={"weight": None, "actualWeight": None})
