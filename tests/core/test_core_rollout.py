"""The rollout state machine, table-tested: every transition, idempotence, restart, approval, abort, pause."""

from __future__ import annotations

import typing
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from polymorph.contract.api import AnalysisValue, RolloutPhase, RolloutStatus, Verdict
from polymorph.core.analysis import AnalysisRun
from polymorph.core.rollout import (
    Emit,
    Observation,
    Promote,
    Record,
    Step,
    TrackObservation,
    actual_weight,
    analysis_due,
    canary_replicas,
    desired,
    from_status,
    step,
    to_status,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
OLD, NEW = "reference", "sha256:" + "a" * 64


def obs(at: float = 0.0, **kw: object) -> Observation:
    base = Observation(
        now=T0 + timedelta(seconds=at),
        replicas=4,
        steps=(Step(25, 60), Step(50, 60)),
        interval_s=30,
        failure_limit=1,
        on_failure="Rollback",
        active=OLD,
        candidate=NEW,
        policy="Auto",
        stable=TrackObservation(OLD, 4, 4),
        canary=None,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def run(verdict: Verdict, at: float) -> AnalysisRun:
    return AnalysisRun(verdict, (), T0 + timedelta(seconds=at))


def reasons(actions: list[object]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, Emit)]


class World:
    """Deployments that do what they are told at once (the Deployment controller, idealised)."""

    def __init__(self, state: RolloutStatus | None = None) -> None:
        self.state = state or RolloutStatus()
        self.stable = TrackObservation(OLD, 4, 4)
        self.canary: TrackObservation | None = None
        self.active = OLD
        self.events: list[str] = []

    def tick(self, at: float, verdict: Verdict | None = None, **kw: object) -> list[object]:
        o = obs(at, stable=self.stable, canary=self.canary, active=self.active, **kw)
        if verdict is not None:
            o = replace(o, analysis=run(verdict, at))
        self.state, actions = step(self.state, o)
        want = desired(self.state, o)
        self.stable = TrackObservation(want.stable[0], want.stable[1], want.stable[1])
        self.canary = None if want.canary is None else TrackObservation(*want.canary, want.canary[1])
        for a in actions:
            if isinstance(a, Promote):
                self.active = a.build
        self.events += reasons(actions)
        return actions


@pytest.mark.parametrize(
    ("replicas", "weight", "expected"),
    [(4, 25, 1), (4, 50, 2), (4, 100, 4), (10, 33, 4), (1, 10, 1), (0, 50, 0)],
)
def test_canary_replicas(replicas: int, weight: int, expected: int) -> None:
    assert canary_replicas(replicas, weight) == expected


def test_idle_without_candidate_does_nothing() -> None:
    state, actions = step(RolloutStatus(), obs(candidate=None))
    assert state.phase == "Idle" and actions == []
    assert desired(state, obs()).canary is None


def test_auto_starts_at_step_one_with_capacity_kept() -> None:
    state, actions = step(RolloutStatus(), obs())
    assert state.phase == "Progressing" and state.step == 0 and state.build == NEW and state.fromBuild == OLD
    assert reasons(actions) == ["CanaryStep"]
    assert "1 of 4 replicas on the canary, 3 stable" in actions[0].message  # type: ignore[attr-defined]
    # The canary is not ready yet: stable keeps all 4 replicas.
    want = desired(state, obs())
    assert want.stable == (OLD, 4) and want.canary == (NEW, 1)
    assert state.stableReplicas == 4 and state.canaryReplicas == 1
    assert state.stepStartedAt is None
    # Once the canary replica is ready, stable goes to 3 and the step's clock starts.
    ready = obs(5, canary=TrackObservation(NEW, 1, 1))
    state, actions = step(state, ready)
    assert actions == [] and state.stepStartedAt == ready.now and state.stableReplicas == 3
    assert actual_weight(replace(ready, stable=TrackObservation(OLD, 3, 3))) == 25.0


def test_replaying_the_same_observation_gives_no_new_action() -> None:
    o = obs()
    s1, a1 = step(RolloutStatus(), o)
    s2, a2 = step(s1, o)
    assert a1 and a2 == [] and s2 == s1
    o2 = obs(40, canary=TrackObservation(NEW, 1, 1), analysis=run("Pass", 40))
    s3, _ = step(replace_state(s1, stepStartedAt=T0), o2)
    s4, a4 = step(s3, o2)
    assert a4 == [] and s4 == s3


def replace_state(state: RolloutStatus, **kw: object) -> RolloutStatus:
    return state.model_copy(update=kw)


def test_full_rollout_to_promotion() -> None:
    w = World()
    w.tick(0)  # start
    w.tick(1)  # canary ready: step 1 settles at t=1
    assert w.state.stepStartedAt == T0 + timedelta(seconds=1)
    assert not analysis_due(w.state, obs(20))
    assert analysis_due(w.state, obs(31))
    w.tick(31, "Pass")
    assert w.state.lastVerdict == "Pass" and w.state.step == 0  # pause (60 s) not over
    w.tick(61, "Pass")
    assert w.state.step == 1 and w.state.stepStartedAt is None
    w.tick(62)
    assert w.canary == TrackObservation(NEW, 2, 2) and w.stable.replicas == 2
    w.tick(92, "Pass")
    w.tick(122, "Pass")
    assert w.state.phase == "Promoting"
    assert w.stable.build == NEW and w.stable.replicas == 4
    actions = w.tick(123)
    assert w.state.phase == "Succeeded" and w.canary is None and w.active == NEW
    record = next(a for a in actions if isinstance(a, Record))
    assert record.outcome == "Promoted" and record.fromBuild == OLD and record.startedAt == T0
    assert w.events == [
        "CanaryStep",
        "AnalysisPassed",
        "AnalysisPassed",
        "CanaryStep",
        "AnalysisPassed",
        "AnalysisPassed",
        "Promoting",
        "Promoted",
    ]
    # The promoted build is now active: no new rollout starts for it.
    assert w.tick(200) == [] and w.state.phase == "Succeeded"


def test_analysis_not_due_is_ignored() -> None:
    w = World()
    w.tick(0)
    w.tick(1)
    assert w.tick(10, "Fail") == [] and w.state.failures == 0


def test_failures_count_consecutively_and_reset_on_pass() -> None:
    w = World()
    long = (Step(25, 600), Step(50, 600))
    w.tick(0, steps=long)
    w.tick(1, steps=long)
    w.tick(31, "Fail", steps=long)
    assert w.state.failures == 1 and w.state.phase == "Progressing"
    w.tick(61, "Pass", steps=long)
    assert w.state.failures == 0
    w.tick(91, "Fail", steps=long)
    assert w.state.failures == 1 and w.state.phase == "Progressing"


def test_failure_limit_then_rollback() -> None:
    w = World()
    w.tick(0)
    w.tick(1)
    w.tick(31, "Fail")
    actions = w.tick(61, "Fail")
    assert reasons(actions) == ["AnalysisFailed"]
    assert w.state.phase == "RollingBack" and w.state.target == "RolledBack"
    # stable already full and running the old build: the canary goes, and the rollout is RolledBack.
    actions = w.tick(62)
    assert w.state.phase == "RolledBack" and w.canary is None and w.active == OLD
    assert reasons(actions) == ["RolledBack"]
    assert next(a for a in actions if isinstance(a, Record)).outcome == "RolledBack"
    # The same candidate is not rolled out again.
    assert w.tick(100) == [] and w.state.phase == "RolledBack"


def test_rollback_waits_for_stable_capacity() -> None:
    state = RolloutStatus(
        phase="RollingBack", build=NEW, fromBuild=OLD, target="RolledBack", canaryReplicas=1, reason="x"
    )
    low = obs(stable=TrackObservation(OLD, 4, 3), canary=TrackObservation(NEW, 1, 1))
    state2, actions = step(state, low)
    assert state2.phase == "RollingBack" and actions == []
    assert desired(state2, low).canary == (NEW, 1)  # canary kept until stable is whole again


def test_on_failure_pause_then_resume_by_approval() -> None:
    w = World()
    w.tick(0, on_failure="Pause")
    w.tick(1, on_failure="Pause")
    w.tick(31, "Fail", on_failure="Pause")
    actions = w.tick(61, "Fail", on_failure="Pause")
    assert w.state.phase == "Paused" and reasons(actions) == ["AnalysisFailed", "Paused"]
    assert w.canary is not None and w.canary.replicas == 1  # the canary stays where it was
    assert w.tick(120, on_failure="Pause") == []  # paused holds
    actions = w.tick(130, on_failure="Pause", approved=NEW)
    assert reasons(actions) == ["Resumed"] and w.state.phase == "Progressing" and w.state.failures == 0
    assert w.state.step == 0 and w.state.stepStartedAt == T0 + timedelta(seconds=130)


def test_pause_needs_a_fresh_approval_when_one_was_already_there() -> None:
    w = World()
    for at, verdict in ((0, None), (1, None), (31, "Fail"), (61, "Fail")):
        w.tick(at, verdict, on_failure="Pause", policy="Manual", approved=NEW)  # type: ignore[arg-type]
    assert w.state.phase == "Paused" and w.state.approvalAtPause
    assert w.tick(70, on_failure="Pause", policy="Manual", approved=NEW) == []
    w.tick(80, on_failure="Pause", policy="Manual", approved=None)
    assert reasons(w.tick(90, on_failure="Pause", policy="Manual", approved=NEW)) == ["Resumed"]


@pytest.mark.parametrize("phase_setup", ["progressing", "paused"])
def test_abort_annotation(phase_setup: str) -> None:
    w = World()
    w.tick(0, on_failure="Pause")
    w.tick(1, on_failure="Pause")
    if phase_setup == "paused":
        w.tick(31, "Fail", on_failure="Pause")
        w.tick(61, "Fail", on_failure="Pause")
        assert w.state.phase == "Paused"
    actions = w.tick(70, abort=True)
    # Stable first returns to all 4 replicas; the canary goes once they are ready.
    assert w.state.phase == "RollingBack" and w.state.target == "Aborted" and w.stable.replicas == 4
    assert w.canary is not None
    actions += w.tick(71, abort=True)
    assert w.state.phase == "Aborted" and w.canary is None
    assert reasons(actions) == ["Aborting", "Aborted"]
    assert next(a for a in actions if isinstance(a, Record)).outcome == "Aborted"


def test_manual_waits_for_approval_naming_the_build() -> None:
    state, actions = step(RolloutStatus(), obs(policy="Manual"))
    assert state.phase == "Idle" and reasons(actions) == ["WaitingForApproval"]
    assert f"polymorph.dev/approve={NEW}" in (state.message or "")
    again, actions = step(state, obs(1, policy="Manual"))
    assert actions == []  # said once
    wrong, _ = step(again, obs(2, policy="Manual", approved="sha256:" + "b" * 64))
    assert wrong.phase == "Idle"
    started, actions = step(again, obs(3, policy="Manual", approved=NEW))
    assert started.phase == "Progressing" and reasons(actions) == ["CanaryStep"]


def test_inconclusive_holds_the_step() -> None:
    w = World()
    w.tick(0)
    w.tick(1)
    w.tick(31, "Inconclusive")
    w.tick(61, "Inconclusive")
    w.tick(91, "Inconclusive")
    assert w.state.phase == "Progressing" and w.state.step == 0 and w.state.failures == 0
    w.tick(121, "Pass")
    assert w.state.step == 1


def test_restart_mid_step_continues_from_status_without_repeating_the_step() -> None:
    w = World()
    w.tick(0)
    w.tick(1)
    w.tick(31, "Pass")
    # The operator dies; a new one reads the state back from status.rollout (JSON) and goes on.
    written = to_status(w.state, obs(31, stable=w.stable, canary=w.canary)).model_dump_json(exclude_none=True)
    restored = from_status(RolloutStatus.model_validate_json(written))
    assert restored == w.state
    w2 = World(restored)
    w2.stable, w2.canary = w.stable, w.canary
    actions = w2.tick(45)  # before the pause is over: nothing
    assert actions == [] and w2.state.step == 0
    actions = w2.tick(61, "Pass")  # the pause counted from the recorded stepStartedAt
    assert reasons(actions) == ["AnalysisPassed", "CanaryStep"] and w2.state.step == 1


def test_candidate_change_aborts_the_running_rollout() -> None:
    w = World()
    w.tick(0)
    w.tick(1)
    other = "sha256:" + "c" * 64
    actions = w.tick(5, candidate=other)
    assert reasons(actions) == ["Aborting"] and w.state.phase == "RollingBack"
    w.tick(6, candidate=other)
    assert w.state.phase == "Aborted"
    # ... and then the new candidate's rollout starts.
    actions = w.tick(7, candidate=other)
    assert w.state.phase == "Progressing" and w.state.build == other and reasons(actions) == ["CanaryStep"]


def test_promoting_waits_for_the_stable_rollout() -> None:
    state = RolloutStatus(phase="Promoting", build=NEW, fromBuild=OLD, canaryReplicas=2)
    rolling = obs(stable=TrackObservation(NEW, 4, 2, updated=False), canary=TrackObservation(NEW, 2, 2))
    state2, actions = step(state, rolling)
    assert state2.phase == "Promoting" and actions == []
    assert desired(state2, rolling).canary == (NEW, 2)


def test_no_step_advances_while_metrics_are_unavailable() -> None:
    w = World()
    w.tick(0)
    w.tick(1)
    w.tick(31, "Pass")
    assert w.tick(61, metrics_ok=False) == [] and w.state.step == 0
    assert reasons(w.tick(62)) == ["CanaryStep"] and w.state.step == 1


def test_the_state_is_status_rollout_and_its_schema_is_a_status_schema() -> None:
    """The state machine steps status.rollout itself; its CRD schema keeps every field optional and nullable."""
    schema = RolloutStatus.model_json_schema()
    assert not schema.get("required")
    for name, prop in schema["properties"].items():
        assert prop.get("default") in (None, []), name
        assert name == "analysis" or {"type": "null"} in prop.get("anyOf", []), name
    phase = schema["properties"]["phase"]["anyOf"][0]["enum"]
    assert phase == [*typing.get_args(RolloutPhase), "Promoted", "Failed"]
    assert RolloutStatus.model_validate({"phase": None, "step": None, "failures": None}) == RolloutStatus()


@pytest.mark.parametrize("phase", typing.get_args(RolloutPhase))
def test_status_round_trip_of_every_phase(phase: str) -> None:
    value = AnalysisValue(name="throughput", value=0.9, lo=0.85, hi=0.95, min=0.98, verdict="Fail")
    state = RolloutStatus(
        phase=phase, build=NEW, fromBuild=OLD, step=1, stepStartedAt=T0, lastAnalysisAt=T0 + timedelta(seconds=30),
        lastVerdict="Fail", failures=2, canaryReplicas=2, stableReplicas=2, startedAt=T0 - timedelta(minutes=5),
        finishedAt=T0 + timedelta(minutes=1), target="RolledBack", reason="slow", message="m",
        approvalAtPause=True, analysis=[value],
    )  # type: ignore[arg-type]  # fmt: skip
    o = obs(stable=TrackObservation(OLD, 2, 2), canary=TrackObservation(NEW, 2, 1))
    status = to_status(state, o)
    assert status.actualWeight == pytest.approx(33.33)
    assert status.weight == (None if phase in ("Idle", "Succeeded", "RolledBack", "Aborted") else 50)
    again = RolloutStatus.model_validate_json(status.model_dump_json(exclude_none=True))
    assert from_status(again) == state


def test_no_status_is_idle_and_retired_phases_read_as_their_successors() -> None:
    assert from_status(None) == RolloutStatus() and from_status(RolloutStatus()) == RolloutStatus()
    assert from_status(RolloutStatus(phase="Promoted", build=NEW)).phase == "Succeeded"
    assert from_status(RolloutStatus(phase="Failed", build=NEW)).phase == "Aborted"
    # A finished rollout read back does not start again for the same candidate.
    state, actions = step(from_status(RolloutStatus(phase="Promoted", build=NEW)), obs())
    assert state.phase == "Succeeded" and actions == []
