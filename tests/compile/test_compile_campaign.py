"""Campaign, ledger and SearchAgent logic, with a model-free runner whose speed is a function of the knobs.

The runner reads the candidate's real build.toml (written by ``knob_variant``) and returns
figures from a known landscape, so the search and the noise-aware selection can be checked
exactly. Real-engine runs are covered in test_compile_cli.py and test_compile_sandbox.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polymorph.api import Budget, ExperimentRecord, Figures, Gates, Objective, Verification
from polymorph.api.common import Constraint, Histogram, WorkloadProfile
from polymorph.builds import read_build
from polymorph.compile.agents.base import BudgetExhausted
from polymorph.compile.agents.search import (
    SearchAgent,
    config_key,
    neighbours,
    owner,
    sweep,
    with_requirements,
)
from polymorph.compile.campaign import Campaign, CampaignSettings
from polymorph.compile.ledger import CampaignPaths, config_uid
from polymorph.compile.selection import budget_share, compare, select_result
from polymorph.store import open_store

PROFILE = WorkloadProfile(
    inputTokens=Histogram(bounds=[16], counts=[1]),
    outputTokens=Histogram(bounds=[8], counts=[1]),
    concurrency=2,
)

TOML = """[build]
name = "toy"
description = "a toy build"

[knobs.batch]
choices = [1, 2, 4, 8]
default = 1

[knobs.attn]
choices = ["naive", "fused"]
default = "naive"

[knobs.cache]
choices = ["concat", "static"]
default = "concat"
"""

# tok/s multipliers per knob value: batch=8 x4, attn=fused x1.5, cache=static is a loss.
SPEED = {
    "batch": {1: 1.0, 2: 1.8, 4: 3.0, 8: 4.0},
    "attn": {"naive": 1.0, "fused": 1.5},
    "cache": {"concat": 1.0, "static": 0.9},
}


def figures(tps: float, noise: float = 0.02, itl: float = 10.0) -> Figures:
    return Figures(
        outputTokensPerSecond=tps,
        totalTokensPerSecond=tps * 2,
        ttftP50Ms=5,
        ttftP95Ms=6,
        itlP50Ms=itl,
        itlP95Ms=itl,
        noise=noise,
        repeats=[tps] * 3,
    )


class LandscapeRunner:
    """Figures from SPEED; records every build it was asked to run."""

    def __init__(self, reject: dict[str, Any] | None = None) -> None:
        self.ran: list[dict[str, Any]] = []
        self.reject = reject or {}

    def run(self, build_dir: Path, *, description: str = "") -> ExperimentRecord:
        knobs = read_build(build_dir).defaults()
        self.ran.append(knobs)
        if any(knobs.get(k) == v for k, v in self.reject.items()):
            ver = Verification(tokenAgreement=0.5, logitError=3.0, finite=True, passed=False)
            return ExperimentRecord(build="x", status="rejected", verification=ver, knobs=knobs)
        tps = 100.0
        for name, value in knobs.items():
            tps *= SPEED[name][value]
        ver = Verification(tokenAgreement=1.0, logitError=0.0, finite=True, passed=True)
        # Bigger batches have worse inter-token latency.
        return ExperimentRecord(
            build="x",
            status="passed",
            verification=ver,
            figures=figures(tps, itl=5.0 * int(knobs["batch"])),
            knobs=knobs,
        )


@pytest.fixture()
def base(tmp_path: Path) -> Path:
    d = tmp_path / "toy"
    d.mkdir()
    (d / "build.toml").write_text(TOML)
    (d / "hotpath.py").write_text("def load(model, knobs):\n    raise NotImplementedError\n")
    return d


def settings(base: Path, **kw: Any) -> CampaignSettings:
    opts: dict[str, Any] = {
        "paths": CampaignPaths("local", "toy", config_uid({"t": 1})),
        "base_dir": base,
        "base_build": "reference",
        "workload": PROFILE,
        "workload_hash": PROFILE.digest(),
        "gates": Gates(minSpeedup=1.05),
        "budget": Budget(maxExperiments=50, deadline="1h", sandboxes=1),
        "agent": "search",
        "confirm": False,
    }
    opts.update(kw)
    return CampaignSettings(**opts)


def test_search_finds_the_best_combination_and_never_repeats(tmp_path: Path, base: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    runner = LandscapeRunner()
    out = Campaign(settings(base, confirm=True), store, runner).run(SearchAgent())
    # The winner is confirmed by re-measuring the baseline and it back to back, outside the ledger.
    assert out.result.confirmation.confirmed and out.result.confirmation.speedup == pytest.approx(6.0)
    searched, confirmation = runner.ran[:-2], runner.ran[-2:]
    assert confirmation == [read_build(base).defaults(), {"batch": 8, "attn": "fused", "cache": "concat"}]
    keys = [config_key(k) for k in searched]
    assert len(keys) == len(set(keys)), "an experiment ran twice"
    assert out.stopReason == "finished"
    assert out.result.state == "improved"
    assert out.result.best.knobs == {
        "batch": 8,
        "attn": "fused",
        "cache": "concat",
    }
    assert out.result.best.speedup == pytest.approx(6.0)
    # The best build is in the store with its manifest: knobs, workload and figures.
    manifest = store.get_manifest(out.result.best.build)
    assert manifest.knobs["batch"] == 8 and manifest.workload == PROFILE
    assert manifest.figures is not None and manifest.figures.outputTokensPerSecond == pytest.approx(600.0)
    assert out.bestUri and out.bestUri.endswith(".tar.gz")
    # Ledger, progress and result live under compilejobs/local/toy-<uid>/.
    paths = settings(base).paths
    assert len(store.read_jsonl(paths.ledger(0))) == len(searched)
    progress = store.get_json(paths.progress(0))
    assert progress["counts"]["total"] == len(searched) and progress["state"] == "finished"
    assert store.get_json(paths.result)["best"]["build"] == out.result.best.build


def test_budget_stops_the_campaign_and_resume_repeats_nothing(tmp_path: Path, base: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    first = LandscapeRunner()
    out = Campaign(settings(base, budget=Budget(maxExperiments=4, sandboxes=1)), store, first).run(
        SearchAgent()
    )
    assert out.stopReason == "maxExperiments" and len(first.ran) == 4
    # Same campaign, bigger budget: the first four come from the ledger, nothing runs twice.
    second = LandscapeRunner()
    out2 = Campaign(settings(base, budget=Budget(maxExperiments=50, sandboxes=1)), store, second).run(
        SearchAgent()
    )
    assert out2.fromLedger == 4
    keys = [config_key(k) for k in first.ran + second.ran]
    assert len(keys) == len(set(keys))
    assert out2.result.best.knobs["batch"] == 8


def test_deadline_is_enforced_with_a_fake_clock(tmp_path: Path, base: Path) -> None:
    now = [0.0]

    class SlowRunner(LandscapeRunner):
        def run(self, build_dir: Path, *, description: str = "") -> ExperimentRecord:
            now[0] += 25.0  # each experiment takes 25 s of campaign time
            return super().run(build_dir, description=description)

    store = open_store(str(tmp_path / "store"))
    runner = SlowRunner()
    s = settings(base, budget=Budget(maxExperiments=50, deadline="1m", sandboxes=1))
    out = Campaign(s, store, runner, clock=lambda: now[0]).run(SearchAgent())
    assert out.stopReason == "deadline"
    assert len(runner.ran) == 3  # starts at 0 s, 25 s and 50 s; none may start at 75 s
    # The clock carries over: a resumed campaign past its deadline starts nothing new.
    again = SlowRunner()
    out2 = Campaign(s, store, again, clock=lambda: now[0]).run(SearchAgent())
    assert out2.stopReason == "deadline" and again.ran == []


def test_constraints_and_rejections_are_honoured(tmp_path: Path, base: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    objective = Objective(constraints=[Constraint(metric="itlP95Ms", max=12)])  # batch <= 2
    out = Campaign(settings(base, objective=objective), store, LandscapeRunner(reject={"attn": "fused"})).run(
        SearchAgent()
    )
    assert out.result.best.knobs == {
        "batch": 2,
        "attn": "naive",
        "cache": "concat",
    }
    assert out.result.experiments.rejected >= 1


def test_sandboxes_explore_disjoint_shares(tmp_path: Path, base: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    ran = []
    for i in range(2):
        runner = LandscapeRunner()
        s = settings(base, sandbox=i, budget=Budget(maxExperiments=40, sandboxes=2))
        Campaign(s, store, runner).run(SearchAgent())
        assert runner.ran[0] == read_build(base).defaults(), "every sandbox measures its own baseline"
        ran.append({config_key(k) for k in runner.ran[1:]})
    assert ran[0] and ran[1] and not ran[0] & ran[1]
    # The last sandbox to finish writes the result from both ledgers.
    result = store.get_json(settings(base).paths.result)
    assert result["experiments"]["total"] == len(ran[0]) + len(ran[1]) + 2


def test_a_win_that_does_not_hold_up_is_not_declared(tmp_path: Path, base: Path) -> None:
    class SpikeRunner(LandscapeRunner):
        """Every knob is neutral, but the first baseline ran during a load spike (half speed)."""

        def run(self, build_dir: Path, *, description: str = "") -> ExperimentRecord:
            record = super().run(build_dir, description=description)
            assert record.figures is not None
            tps = 50.0 if len(self.ran) == 1 else 100.0
            return record.model_copy(update={"figures": figures(tps)})

    store = open_store(str(tmp_path / "store"))
    out = Campaign(settings(base, confirm=True), store, SpikeRunner()).run(SearchAgent())
    assert out.result.confirmation.confirmed is False
    assert out.result.state == "noImprovement" and out.result.best is None
    assert "did not hold up" in out.result.message and out.result.bestCandidate.speedup == pytest.approx(2.0)


def test_noise_rule_and_helpers() -> None:
    obj = Objective()
    assert compare(figures(110, 0.01), figures(100, 0.01), obj, 1.05).significant
    assert not compare(figures(110, 0.05), figures(100, 0.05), obj, 1.05).significant  # inside the noise
    lat = Objective(metric="itlP95")
    assert compare(figures(100, itl=5.0), figures(100, itl=10.0), lat, 1.05).speedup == pytest.approx(2.0)
    assert [budget_share(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert owner({"a": 1}, 1) == 0
    defaults = {"a": 1, "b": "x"}
    assert sweep(defaults, {"a": [1, 2], "b": ["x", "y"]}) == [{"a": 2, "b": "x"}, {"a": 1, "b": "y"}]
    assert neighbours({"a": 2}, {"a": [1, 2, 3]}) == [{"a": 1}, {"a": 3}]


def test_no_improvement_is_explicit() -> None:
    ver = Verification(tokenAgreement=1, logitError=0, finite=True, passed=True)
    base = ExperimentRecord(build="reference", status="passed", verification=ver, figures=figures(100, 0.1))
    cand = ExperimentRecord(
        build="sha256:" + "a" * 64, status="passed", verification=ver, figures=figures(112, 0.1)
    )
    doc = select_result({0: [base, cand]}, "reference", Objective(), Gates()).model_dump(mode="json")
    assert doc["state"] == "noImprovement" and doc["best"] is None
    assert doc["bestCandidate"]["speedup"] == pytest.approx(1.12)
    json.dumps(doc)


def test_budget_exhausted_carries_its_reason() -> None:
    assert BudgetExhausted("deadline", "late").reason == "deadline"


INTERACTING = """\
[build]
name = "interacting"

[knobs.cache]
choices = ["concat", "static"]
default = "concat"

[knobs.capture]
choices = ["none", "graph"]
default = "none"
requires = { cache = "static" }
"""


class InteractionRunner:
    """``capture = graph`` is 3x faster, but only together with ``cache = static``; a static cache
    alone is slightly slower, so a one-knob-at-a-time sweep without ``requires`` finds nothing."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def run(self, build_dir: Path, *, description: str = "") -> ExperimentRecord:
        knobs = read_build(build_dir).defaults()
        self.ran.append(knobs)
        tps = 100.0 * (0.95 if knobs["cache"] == "static" else 1.0)
        if knobs["capture"] == "graph" and knobs["cache"] == "static":
            tps *= 3.0
        ver = Verification(tokenAgreement=1.0, logitError=0.0, finite=True, passed=True)
        return ExperimentRecord(
            build="x", status="passed", verification=ver, figures=figures(tps), knobs=knobs
        )


def test_search_applies_what_a_knob_requires(tmp_path: Path) -> None:
    d = tmp_path / "interacting"
    d.mkdir()
    (d / "build.toml").write_text(INTERACTING)
    (d / "hotpath.py").write_text("def load(model, knobs):\n    raise NotImplementedError\n")
    runner = InteractionRunner()
    out = Campaign(settings(d), open_store(str(tmp_path / "store")), runner).run(SearchAgent())
    assert {"cache": "concat", "capture": "graph"} not in runner.ran, "a no-op configuration was run"
    assert out.result.state == "improved"
    assert out.result.best.knobs == {"cache": "static", "capture": "graph"}
    keys = [config_key(k) for k in runner.ran]
    assert len(keys) == len(set(keys)), "an experiment ran twice"


def test_requirements_complete_sweeps_and_neighbours() -> None:
    defaults = {"cache": "concat", "capture": "none"}
    choices = {"cache": ["concat", "static"], "capture": ["none", "graph"]}
    requires = {"capture": {"cache": "static"}}
    assert with_requirements({"cache": "concat", "capture": "graph"}, requires, defaults) == {
        "cache": "static",
        "capture": "graph",
    }
    assert with_requirements(defaults, requires, defaults) == defaults
    assert sweep(defaults, choices, requires) == [
        {"cache": "static", "capture": "none"},
        {"cache": "static", "capture": "graph"},
    ]
    # Moving the cache back to concat under a graph capture is not a real neighbour: it closes to itself.
    current = {"cache": "static", "capture": "graph"}
    assert neighbours(current, choices, requires, defaults) == [
        current,
        {"cache": "static", "capture": "none"},
    ]
