"""ModelDeployment and CompileJob objects in every phase a GitOps tool sees, made by the operator's own code.

Each object's status comes from the real rollout state machine (``core.rollout.step``), the
handler's condition writer (``handlers.modeldeployments._conditions``, and ``_set_invalid``
for a spec the model refuses) and ``core.compilejobs.compilejob_status``: nothing here writes a
condition by hand. ``phases()`` returns ``{name: object}``; the tests feed them to the real
kstatus library and to the Argo CD health scripts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import kopf

from polymorph.contract.api import CompileJobRef, Figures, ModelDeploymentStatus, Objective, RolloutStatus
from polymorph.contract.documents import CampaignResult, Counts, ResultBest, Standing
from polymorph.core import rollout
from polymorph.core.analysis import AnalysisRun
from polymorph.core.compilejobs import JobObservation, compilejob_status
from polymorph.handlers import modeldeployments as mdh
from polymorph.handlers.bodies import lenient, object_ref, parse_compilejob, parse_modeldeployment
from polymorph.handlers.compilejobs import create as create_cj

__all__ = ["ACTIVE", "CANDIDATE", "T0", "compilejob_phases", "deployment_phases"]

T0 = datetime(2026, 12, 1, 21, 0, tzinfo=UTC)
ACTIVE = "sha256:" + "a" * 64
CANDIDATE = "sha256:" + "b" * 64
GEN = 3


def _md_body(policy: str = "Auto", on_failure: str = "Rollback", generation: int = GEN) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": "inference", "generation": generation, "uid": "u-1"},
        "spec": {
            "model": {"uri": "/models/tiny"},
            "hardware": {"accelerator": "cpu"},
            "replicas": 4,
            "build": {"policy": policy},
            "rollout": {"steps": [{"weight": 25, "pause": "1m"}, {"weight": 50, "pause": "1m"}],
                        "analysis": {"interval": "30s", "failureLimit": 1}, "onFailure": on_failure},
        },
    }  # fmt: skip


@dataclass
class _Health:
    prometheus_error: str | None = None


class World:
    """One deployment driven through the state machine, with idealised Deployments (ready at once)."""

    def __init__(self, policy: str = "Auto", on_failure: str = "Rollback") -> None:
        self.body = _md_body(policy, on_failure)
        md, problem = parse_modeldeployment(self.body)
        assert md is not None, problem
        self.md = md
        self.state = RolloutStatus()
        self.active = ACTIVE
        self.stable = rollout.TrackObservation(ACTIVE, 4, 4)
        self.canary: rollout.TrackObservation | None = None
        self.candidate: str | None = None
        self.job: CompileJobRef | None = None
        self.health = _Health()
        self.approved: str | None = None
        self.abort = False
        self.at = 0.0

    def obs(self) -> rollout.Observation:
        spec = self.md.spec
        return rollout.Observation(
            now=T0 + timedelta(seconds=self.at), replicas=spec.replicas,
            steps=tuple(rollout.Step(s.weight, 60) for s in spec.rollout.steps), interval_s=30,
            failure_limit=spec.rollout.analysis.failureLimit, on_failure=spec.rollout.onFailure,
            active=self.active, candidate=self.candidate, policy=spec.build.policy,
            stable=self.stable, canary=self.canary, abort=self.abort, approved=self.approved,
            metrics_ok=self.health.prometheus_error is None,
        )  # fmt: skip

    def tick(self, at: float, verdict: str | None = None, *, settle: bool = True) -> None:
        self.at = at
        o = self.obs()
        if verdict is not None:
            o = replace(o, analysis=AnalysisRun(verdict, (), o.now))  # type: ignore[arg-type]
        self.state, actions = rollout.step(self.state, o)
        for a in actions:
            if isinstance(a, rollout.Promote):
                self.active = a.build
        want = rollout.desired(self.state, replace(o, active=self.active))
        if settle:
            self.stable = rollout.TrackObservation(want.stable[0], want.stable[1], want.stable[1])
            self.canary = (
                None if want.canary is None else rollout.TrackObservation(*want.canary, want.canary[1])
            )

    def object(self, *, generation: int = GEN, observed: int = GEN) -> dict[str, Any]:
        """The ModelDeployment as the API server would return it after this tick's status write."""
        status = ModelDeploymentStatus(lastCompileJob=self.job)
        status.observedGeneration = observed
        status.activeBuild = mdh.BuildStatus(id=self.active, since=T0)
        if self.candidate is not None:
            status.candidateBuild = mdh.BuildStatus(id=self.candidate)
        o = self.obs()
        status.rollout = rollout.to_status(self.state, o)
        ctx = SimpleNamespace(health=self.health)
        md = self.md.model_copy(
            update={"metadata": self.md.metadata.model_copy(update={"generation": observed})}
        )
        mdh._conditions(md, status, self.state, o, ctx, o.now)  # type: ignore[arg-type]
        body = {**self.body, "metadata": {**self.body["metadata"], "generation": generation}}
        return {**body, "status": status.model_dump(mode="json", exclude_none=True)}


def deployment_phases() -> dict[str, dict[str, Any]]:
    """Name -> ModelDeployment object, one per phase people and GitOps tools tell apart."""
    out: dict[str, dict[str, Any]] = {}
    w = World()
    out["serving"] = w.object()
    out["spec-changed-not-yet-observed"] = w.object(generation=GEN + 1, observed=GEN)
    w.stable = rollout.TrackObservation(ACTIVE, 4, 2)
    out["replicas-not-ready"] = w.object()
    w.stable = rollout.TrackObservation(ACTIVE, 4, 4)
    w.job = CompileJobRef(name="chat-1a2b3c4d", phase="Running", createdAt=T0)
    out["compiling"] = w.object()
    w.job = CompileJobRef(name="chat-1a2b3c4d", phase="Succeeded", createdAt=T0)
    w.candidate = CANDIDATE
    w.tick(0)  # Auto: the canary starts
    out["canary-step-1"] = w.object()
    w.tick(1)
    w.tick(31, "Pass")
    w.tick(61, "Pass")
    w.tick(62)
    out["canary-step-2"] = w.object()
    w.health.prometheus_error = "connection refused"
    out["prometheus-down-mid-rollout"] = w.object()
    w.health.prometheus_error = None
    w.tick(92, "Pass")
    w.tick(122, "Pass", settle=False)
    assert w.state.phase == "Promoting", w.state
    out["promoting"] = w.object()
    w.tick(123)
    w.tick(124)
    assert w.state.phase == "Succeeded", w.state
    out["promoted"] = w.object()

    m = World(policy="Manual")
    m.job = CompileJobRef(name="chat-1a2b3c4d", phase="Succeeded", createdAt=T0)
    m.candidate = CANDIDATE
    m.tick(0)
    out["waiting-for-approval"] = m.object()
    m.approved = CANDIDATE
    m.tick(1)
    assert m.state.phase == "Progressing"
    m.abort = True
    m.tick(2)
    m.tick(3)
    assert m.state.phase == "Aborted", m.state
    out["aborted"] = m.object()

    r = World()
    r.candidate = CANDIDATE
    r.tick(0)
    r.tick(1)
    r.tick(31, "Fail")
    r.tick(61, "Fail", settle=False)
    assert r.state.phase == "RollingBack", r.state
    out["rolling-back"] = r.object()
    r.tick(62)
    r.tick(63)
    assert r.state.phase == "RolledBack", r.state
    out["rolled-back"] = r.object()

    p = World(on_failure="Pause")
    p.candidate = CANDIDATE
    p.tick(0)
    p.tick(1)
    p.tick(31, "Fail")
    p.tick(61, "Fail")
    assert p.state.phase == "Paused", p.state
    out["paused-after-failures"] = p.object()

    d = World()
    d.candidate = CANDIDATE
    d.tick(0, settle=False)
    d.canary = rollout.TrackObservation(
        CANDIDATE,
        1,
        0,
        stuck='Deployment chat-canary: ReplicaSet "chat-canary-5f7" has timed out progressing.',
    )
    out["canary-past-progress-deadline"] = d.object()

    out["invalid-spec"] = _invalid(w.object())
    return out


def _invalid(previous: dict[str, Any]) -> dict[str, Any]:
    """The deployment after an edit the CRD admits but the model refuses (generation bumped)."""
    body = {**previous, "metadata": {**previous["metadata"], "generation": GEN + 1}}
    body["spec"] = {
        **body["spec"],
        "engine": {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
    }
    md, problem = parse_modeldeployment(body)
    assert md is None and problem, "the spec must be one the model refuses"
    patch = kopf.Patch()
    ctx = SimpleNamespace(event=lambda *a, **k: None)
    old = lenient(ModelDeploymentStatus, body.get("status"))
    asyncio.run(mdh._set_invalid(ctx, object_ref(body), old, patch, problem, T0))  # type: ignore[arg-type]
    return {**body, "status": {**body["status"], **dict(patch.status)}}


def _cj(
    phase_docs: tuple[list[Any], CampaignResult | None, JobObservation], old: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "CompileJob",
        "metadata": {"name": "chat-1a2b3c4d", "namespace": "inference", "generation": 1, "uid": "c-1"},
        "spec": {"deploymentRef": {"name": "chat"}},
        "status": old or {"phase": "Pending", "jobName": "chat-1a2b3c4d", "observedGeneration": 1},
    }
    cj, problem = parse_compilejob(body)
    assert cj is not None, problem
    docs, result, job = phase_docs
    status = compilejob_status(cj, docs, result, job, "file:///store/ledger/", T0)
    return {**body, "status": status.model_dump(mode="json", exclude_none=True)}


def compilejob_phases() -> dict[str, dict[str, Any]]:
    """Name -> CompileJob object: pending, running, succeeded (with and without a better build), failed."""
    out: dict[str, dict[str, Any]] = {}
    out["pending"] = _cj(([], None, JobObservation(exists=True)), None)
    out["running"] = _cj(([], None, JobObservation(exists=True, active=2)), None)
    out["failed"] = _cj(
        ([], None, JobObservation(exists=True, failed=2, finished="Failed", reason="DeadlineExceeded")), None
    )
    done = JobObservation(exists=True, succeeded=2, finished="Complete")
    out["succeeded"] = _cj(([], _result(True), done), None)
    out["succeeded-no-improvement"] = _cj(([], _result(False), done), None)
    out["unresolvable"] = _unresolvable()
    return out


def _unresolvable() -> dict[str, Any]:
    """A CompileJob whose deployment does not exist: the create handler fails it (``handlers.compilejobs``)."""
    body: dict[str, Any] = {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "CompileJob",
        "metadata": {"name": "orphan", "namespace": "inference", "generation": 1, "uid": "c-2"},
        "spec": {"deploymentRef": {"name": "missing"}},
    }
    patch = kopf.Patch()
    ctx = SimpleNamespace(
        event=lambda *a, **k: None, clock=lambda: T0, kube=SimpleNamespace(get=lambda *a, **k: None)
    )
    try:
        asyncio.run(create_cj(body, patch, ctx))  # type: ignore[arg-type]
    except kopf.PermanentError:
        pass
    else:
        raise AssertionError("a CompileJob for a missing deployment must fail")
    return {**body, "status": dict(patch.status)}


def _result(improved: bool) -> CampaignResult:
    figures = Figures(
        outputTokensPerSecond=100, totalTokensPerSecond=150, ttftP50Ms=10, ttftP95Ms=20, itlP50Ms=5,
        itlP95Ms=8, noise=0.01,
    )  # fmt: skip
    base = Standing(build="sha256:" + "00" * 32, value=100, noise=0.01, sandbox=0, figures=figures)
    best = ResultBest(
        **base.model_dump() | {"build": CANDIDATE, "value": 152.3}, speedup=1.523, speedupNoise=0.02, knobs={},
        uri="s3://b/builds/x.tar.gz",
    )  # fmt: skip
    return CampaignResult(
        state="improved" if improved else "noImprovement",
        message="stopped at the experiment budget" if improved else "no candidate beat the baseline",
        objective=Objective(), minSpeedup=1.05, baseBuild=base.build,
        experiments=Counts(passed=7, rejected=1, total=8), baseline=base, best=best if improved else None,
    )  # fmt: skip
