"""The whole-loop scenario, step by step, shared by the e2e test and ``make demo-fleet``.

Each step acts the way a person, a GitOps tool or the traffic would (real ``kubectl``, real
requests), then waits, with a deadline, for the state the operator must reach, and returns what
it observed; the test asserts on it, the demo prints it. ``say`` narrates.

1. ``apply_pinned``: the ModelDeployment, pinned to the dawdling build (``harness.dawdling_build``:
   the reference computing each step three times); shape A traffic. Drift is measured (the build
   was tuned for no profile), but a pin never compiles or rolls out.
2. ``shift_and_unpin``: the traffic shifts to shape B (long generations); once Prometheus's
   window holds only B, GitOps removes the pin: drift -> one CompileJob -> sandbox Job (the
   SearchAgent driving a real hot-reload engine) -> best build in S3.
3. ``promotion``: the canary at each step, analysis on live metrics, promotion.
4. ``drift_back``: traffic returns to shape A: a drift score against the promoted build's
   tuned-for profile, and no CompileJob while the cooldown runs.
5. ``manual_then_rollback``: GitOps sets ``policy: Manual``; a CompileJob from a deliberately
   slowed base build succeeds, its candidate waits (no canary) until approved; approved, the
   slower canary fails analysis and rolls back.

It knows nothing about how the cluster is provided (``harness.Fleet``).
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

import gitops
from harness import NS, Fleet, dawdling_build, slowed_build, wait_for
from polymorph_engine.serving.metrics import TOKEN_BUCKETS
from traffic import Shape, Traffic

__all__ = ["MD", "SHAPE_A", "SHAPE_B", "Scenario", "compilejob", "deployment"]

MD = "chat"
SHAPE_A = Shape(
    "A (long prompts, short answers)", prompt=(200, 400), output=(4, 12), concurrency=2, think_s=0.5
)
SHAPE_B = Shape(
    "B (short prompts, long generations)", prompt=(16, 48), output=(128, 192), concurrency=2, think_s=1.0
)
BUDGET = {"maxExperiments": 8, "sandboxes": 1, "deadline": "5m", "experimentTimeout": "2m"}
WINDOW_S = 15
GATE = 1.01
"""minSpeedup: beyond noise, by any margin. Two shared cores make the sandbox's measurements noisy
(+-30% here), so a 1.5x win can have a lower bound of 1.03."""


def deployment(pinned: str | None = None, policy: str = "Auto") -> dict[str, Any]:
    """The ModelDeployment a model owner commits: tiny CPU model, 3 replicas, two canary steps."""
    build: dict[str, Any] = {"policy": policy}
    if pinned is not None:
        build["pinned"] = pinned
    errors = (
        'sum(rate(polymorph_requests_total{model_deployment="{{name}}",namespace="{{namespace}}",'
        'track="canary",status="error"}[{{interval}}])) or vector(0)'
    )
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": MD, "namespace": NS},
        "spec": {
            "model": {"uri": "tiny", "dtype": "float32", "maxSeqLen": 512},
            "hardware": {"accelerator": "cpu"},
            "replicas": 3,
            # Two decode buckets, not four: two clients never batch more, and a build whose step is
            # captured or compiled prepares half as many.
            "engine": {"args": ["--max-batch", "2"]},
            "build": build,
            "recompile": {
                "enabled": True, "driftThreshold": 0.25, "window": f"{WINDOW_S}s", "minRequests": 10,
                "cooldown": "1h",
                "compile": {"agent": {"kind": "Search"}, "budget": BUDGET,
                            "objective": {"metric": "outputTokensPerSecond"},
                            "gates": {"tokenAgreement": 0.98, "minSpeedup": GATE}},
            },
            # A p95 over a few seconds of two shared cores is noisy (1.47 seen for a 1.9x faster
            # build), so its bound is loose; the throughput ratio is what tells a slower build.
            "rollout": {
                "steps": [{"weight": 33, "pause": "4s"}, {"weight": 66, "pause": "4s"}],
                "analysis": {
                    "interval": "4s", "failureLimit": 1, "noDataPolicy": "Inconclusive",
                    "metrics": [
                        {"name": "throughput", "builtin": "outputTokensPerSecondRatio", "thresholdRange": {"min": 0.9}},
                        {"name": "itl-p95", "builtin": "interTokenLatencyP95Ratio", "thresholdRange": {"max": 2.0}},
                        {"name": "errors", "query": errors, "thresholdRange": {"max": 0}},
                    ],
                },
                "onFailure": "Rollback",
            },
        },
    }  # fmt: skip


def compilejob(name: str, base: str, profile: dict[str, Any]) -> dict[str, Any]:
    """A CompileJob a person opens for the deployment, from ``base``, for ``profile``."""
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "CompileJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "deploymentRef": {"name": MD},
            "baseBuild": base,
            "workload": {"profile": profile},
            "agent": {"kind": "Search"},
            "budget": BUDGET,
            "gates": {"tokenAgreement": 0.98, "minSpeedup": GATE},
        },
    }


def narrate(fresh: list[dict[str, Any]], told: dict[tuple[str, str, str], set[str]]) -> list[str]:
    """One line per new Event, in the order they were recorded, naming the object it is about.

    A decision the operator records on two objects is told once: ``CompileJobSucceeded`` and
    ``CompileJobFailed`` go to the CompileJob with a message, and to its deployment with the same
    message after ``CompileJob <name>: ``. Such a pair has one key, (reason, CompileJob, message),
    and the second of the pair is skipped. ``told`` maps each key told to the objects it was seen
    on, across calls; the same key on the same object again is a new decision, told again.
    """
    lines: list[str] = []
    for e in sorted(fresh, key=lambda e: int(e["metadata"].get("resourceVersion") or 0)):
        about = _about(e)
        key = _decision(e)
        seen_on = told.setdefault(key, set())
        if seen_on and about not in seen_on:  # the mirror of a decision already told
            seen_on.add(about)
            continue
        told[key] = {about}
        lines.append(f"  event {e['reason']:<20} {about:<24} {e['message']}")
    return lines


_ABOUT_A_COMPILEJOB = re.compile(r"^CompileJob (?P<name>[a-z0-9][-a-z0-9.]*): (?P<message>.*)$", re.DOTALL)


def _decision(event: dict[str, Any]) -> tuple[str, str, str]:
    """(reason, CompileJob name or "", message): what a mirrored pair of Events has in common."""
    obj = event.get("involvedObject", {})
    message = str(event.get("message", ""))
    if obj.get("kind") == "CompileJob":
        return event["reason"], str(obj.get("name", "")), message
    mirrored = _ABOUT_A_COMPILEJOB.match(message)
    if mirrored is not None:
        return event["reason"], mirrored["name"], mirrored["message"]
    return event["reason"], "", message


def _about(event: dict[str, Any]) -> str:
    """``md/chat`` or ``cj/chat-1a2b3c4d``: the object an Event is about."""
    obj = event.get("involvedObject", {})
    short = {"ModelDeployment": "md", "CompileJob": "cj"}.get(obj.get("kind", ""), obj.get("kind", "?"))
    return f"{short}/{obj.get('name', '?')}"


def _rollout(fleet: Fleet) -> dict[str, Any]:
    return fleet.status(MD).get("rollout") or {}


class Scenario:
    """The steps of the module docstring over one ``Fleet``; ``traffic`` starts in step 1."""

    def __init__(self, fleet: Fleet, say: Callable[[str], None] = print) -> None:
        self.fleet = fleet
        self.say = say
        self.traffic: Traffic | None = None
        self.base = ""
        """The dawdling build the deployment starts pinned to (``apply_pinned``)."""
        self.t0 = time.monotonic()
        self._seen: set[str] = set()
        self._told: dict[tuple[str, str, str], set[str]] = {}
        """Each decision told (``narrate``): the objects it was recorded on."""
        self.gitops = gitops.Observer(fleet, MD)
        """Every version of the deployment and its CompileJobs that a wait read (``gitops_report``)."""
        self._prometheus = httpx.Client(timeout=10)
        """One client for the waits' instant queries (a client per query costs an SSL context)."""

    # --- narration ---------------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        return self.fleet.events(MD)

    def tell_events(self) -> None:
        """Narrate every Event about the deployment and its CompileJobs not told yet (``narrate``)."""
        names = [MD, *(cj["metadata"]["name"] for cj in self.fleet.compilejobs())]
        fresh = [
            e for name in names for e in self.fleet.events(name) if e["metadata"]["uid"] not in self._seen
        ]
        self._seen.update(e["metadata"]["uid"] for e in fresh)
        for line in narrate(fresh, self._told):
            self.say(line)

    def wait(self, what: str, fn: Callable[[], Any], timeout: float) -> Any:
        def probe() -> Any:
            self.tell_events()
            self.gitops.observe()
            return fn()

        return wait_for(what, probe, timeout, every=1.0)

    def tell_traffic(self) -> None:
        if self.traffic is None:
            return
        # Counts only: the clients' own timings include queueing and start-up, the analysis reads
        # the engines' decode timings from Prometheus.
        for track, s in sorted(self.traffic.stats().items()):
            self.say(f"  traffic {track or '?'}: {s.requests} requests, {s.errors} errors, {s.tokens} tokens")

    # --- steps ---------------------------------------------------------------------------------

    def apply_pinned(self) -> dict[str, Any]:
        f = self.fleet
        self.base = dawdling_build(f.store, f.workdir)
        self.say(
            f"a dawdling build in the store (the reference, each step computed three times): {self.base}"
        )
        self.say("kubectl apply: ModelDeployment chat (3 replicas, pinned to the dawdling build)")
        f.apply(deployment(pinned=self.base))
        stable = self.wait(
            "3 ready stable replicas",
            lambda: (f.deployment(MD) or {}).get("status", {}).get("readyReplicas") == 3,
            180,
        )
        self.traffic = Traffic(f.endpoints(MD), SHAPE_A).start()
        self.say(f"traffic starts: {SHAPE_A.describe()}")
        st = self.wait(
            "drift measured on the pinned deployment",
            lambda: (s := f.status(MD)).get("drift", {}).get("score") is not None
            and s.get("trafficProfile", {}).get("requests", 0) >= 10 and s,
            90,
        )  # fmt: skip
        self.say(f"drift {st['drift']['score']:.2f}: {'; '.join(st['drift'].get('reasons', []))}")
        cycles = self._drift_cycles()
        if cycles is not None:
            self.wait("three more drift cycles", lambda: (self._drift_cycles() or 0) >= cycles + 3, 30)
        self.say("pinned: no CompileJob, no canary")
        return {"status": st, "compilejobs": f.compilejobs(), "canary": f.deployment(f"{MD}-canary"),
                "stable": stable, "events": self.events()}  # fmt: skip

    def _drift_cycles(self) -> float | None:
        op = self.fleet.operator
        return None if op is None else op.metric("polymorph_operator_drift_cycle_seconds_count")

    def _query(self, promql: str) -> float | None:
        """An instant query's first value from the fleet's Prometheus (local or the cluster's)."""
        r = self._prometheus.get(f"{self.fleet.prometheus_url}/api/v1/query", params={"query": promql})
        result = r.json()["data"]["result"] if r.status_code == 200 else []
        return float(result[0]["value"][1]) if result else None

    def _window_is(self, longest_prompt: int) -> bool:
        """Prometheus's window holds requests, none with a prompt longer than ``longest_prompt``."""
        le = next(b for b in TOKEN_BUCKETS if b >= longest_prompt)
        # The operator's window plus a margin: a request counts when it ends, and a long one that
        # began before the shift ends a while after it.
        sel, w = f'model_deployment="{MD}"', f"[{WINDOW_S + 10}s]"
        total = self._query(f"sum(increase(polymorph_prompt_tokens_count{{{sel}}}{w}))")
        short = self._query(f'sum(increase(polymorph_prompt_tokens_bucket{{{sel},le="{float(le)}"}}{w}))')
        if total is None or short is None:
            return False
        return total >= 10 and total - short < 0.5

    def shift_and_unpin(self) -> dict[str, Any]:
        f = self.fleet
        assert self.traffic is not None
        self.traffic.shift(SHAPE_B)
        self.say(f"traffic shifts: {SHAPE_B.describe()}")
        self.wait("a window of shape B only", lambda: self._window_is(SHAPE_B.prompt[1] + 1), 90)
        self.say("kubectl apply: the pin removed (GitOps)")
        f.apply(deployment())
        cj = self.wait("a CompileJob", lambda: f.compilejobs(), 60)[0]
        name = cj["metadata"]["name"]
        st = f.status(MD)
        self.say(f"drift {st.get('drift', {}).get('score')}: CompileJob {name} opened")
        done = self._quietly(lambda: self._compile(name))
        return {"compilejob": done, "status": f.status(MD)}

    def _quietly(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``fn`` with the traffic eased off, then back to its shape.

        Two shared cores are all there is: the serving engines would otherwise take the CPU the
        sandbox measures on, and its paired comparisons would drown in noise.
        """
        assert self.traffic is not None
        shape = self.traffic.shape
        self.traffic.shift(shape.eased())
        self.say(f"traffic eases off while the sandbox measures: {self.traffic.shape.describe()}")
        try:
            return fn()
        finally:
            self.traffic.shift(shape)
            self.say(f"traffic back: {shape.describe()}")

    def _compile(self, name: str) -> dict[str, Any]:
        f = self.fleet
        last: dict[str, Any] = {}

        def finished() -> dict[str, Any] | None:
            cj = f.compilejob(name)
            st = cj.get("status") or {}
            counts = st.get("experiments") or {}
            key = (st.get("phase"), counts.get("total"))
            if key != (last.get("phase"), last.get("total")):
                last.update(phase=key[0], total=key[1])
                best = (st.get("best") or {}).get("speedup")
                self.say(f"  CompileJob {name}: {key[0]}, {key[1] or 0} experiments, "
                         f"best {f'{best:.2f}x' if best else '-'}")  # fmt: skip
            return cj if st.get("phase") in ("Succeeded", "Failed", "Cancelled") else None

        cj = self.wait(f"CompileJob {name} to finish", finished, 300)
        self.say(f"CompileJob {name} {cj['status']['phase']}: {cj['status'].get('message', '')}")
        return dict(cj)

    def promotion(self, build: str) -> dict[str, Any]:
        f = self.fleet
        steps: list[dict[str, Any]] = []

        def promoted() -> bool:
            r = _rollout(f)
            if r.get("step") is not None and (not steps or steps[-1].get("step") != r.get("step")):
                steps.append(dict(r))
            return (f.status(MD).get("activeBuild") or {}).get("id") == build

        self.wait(f"{build} promoted", promoted, 240)
        self.wait("the canary removed", lambda: f.deployment(f"{MD}-canary") is None, 60)
        self.tell_traffic()
        return {"status": f.status(MD), "stable": f.deployment(MD), "events": self.events(), "steps": steps}

    def drift_back(self) -> dict[str, Any]:
        f = self.fleet
        assert self.traffic is not None
        shifted = datetime.now(UTC).replace(microsecond=0)
        self.traffic.shift(SHAPE_A)
        self.say(f"traffic shifts back: {SHAPE_A.describe()}")

        def scored() -> dict[str, Any] | None:
            s = f.status(MD)
            d = s.get("drift") or {}
            at = d.get("checkedAt")
            fresh = at is not None and datetime.fromisoformat(at.replace("Z", "+00:00")) >= shifted
            tuned = not any("not tuned" in r for r in d.get("reasons", []))
            return s if fresh and tuned and d.get("score", 0) >= 0.25 else None

        st = self.wait("a drift score against the promoted build's profile", scored, 90)
        self.say(f"drift {st['drift']['score']:.2f}: {'; '.join(st['drift'].get('reasons', []))}")
        cycles = self._drift_cycles()
        if cycles is not None:
            self.wait("three more drift cycles", lambda: (self._drift_cycles() or 0) >= cycles + 3, 30)
        self.say("the cooldown holds the next CompileJob")
        return {"status": st, "compilejobs": f.compilejobs()}

    def manual_then_rollback(self, tuned: dict[str, Any]) -> dict[str, Any]:
        f = self.fleet
        active = f.status(MD)["activeBuild"]["id"]
        self.say("kubectl apply: policy Manual (GitOps)")
        manual = deployment(policy="Manual")
        f.apply(manual)
        slowed = slowed_build(f.store, f.workdir, f.store.get_manifest(active).knobs)
        self.say(f"a slowed base build in the store: {slowed}")
        f.apply(compilejob(f"{MD}-slowed", slowed, copy.deepcopy(tuned)))
        cj = self._quietly(lambda: self._compile(f"{MD}-slowed"))
        candidate = (cj["status"].get("best") or {}).get("build")
        waiting = self.wait(
            "WaitingForApproval",
            lambda: [e for e in self.events() if e["reason"] == "WaitingForApproval"],
            60,
        )
        ticks = f.operator.metric_total("polymorph_operator_reconciles_total") if f.operator else None
        if ticks is not None:
            self.wait("ten more reconciles", lambda: f.operator is not None and f.operator.metric_total("polymorph_operator_reconciles_total") >= ticks + 10, 30)  # fmt: skip
        unapproved = {"canary": f.deployment(f"{MD}-canary"), "waiting": waiting, "rollout": _rollout(f),
                      "active": f.status(MD)["activeBuild"]["id"]}  # fmt: skip
        self.say(f"kubectl annotate: polymorph.dev/approve={candidate}")
        f.kubectl("-n", NS, "annotate", "md", MD, f"polymorph.dev/approve={candidate}")
        self.wait("the rollback", lambda: _rollout(f).get("phase") == "RolledBack", 240)
        self.wait("the canary removed", lambda: f.deployment(f"{MD}-canary") is None, 60)
        self.tell_traffic()
        return {"compilejob": cj, "candidate": candidate, "slowed": slowed, "before": active,
                "unapproved": unapproved, "status": f.status(MD), "stable": f.deployment(MD),
                "events": self.events()}  # fmt: skip

    def gitops_report(self, folder: Path) -> dict[str, Any]:
        """Each seen version through kstatus and Argo CD's health scripts, ``kubectl polymorph`` on the
        final state, and ``problems``: where a verdict disagrees with the documented mapping. Also
        written to ``folder`` (``gitops-report.json``, ``kubectl-polymorph-get.txt``)."""
        self.gitops.observe()
        rep = gitops.report(self.gitops)
        rep["problems"] = gitops.problems(rep)
        (folder / "gitops-report.json").write_text(json.dumps(rep, indent=1, default=str))
        (folder / "kubectl-polymorph-get.txt").write_text(rep["get"])
        return rep

    def close(self) -> None:
        self._prometheus.close()
        if self.traffic is not None:
            self.traffic.close()
