"""Campaign, ledger, paired selection and SearchAgent logic, with a model-free runner whose speed is a function of the knobs.

The runner reads the candidate's real build.toml (written by ``knob_variant``) and returns
figures (fixed, symmetric pass-to-pass spreads) from a known landscape, paired with the
baseline's when asked, so the search and the paired selection can be checked exactly. Real-engine runs are covered in test_compile_cli.py and test_compile_sandbox.py.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from pairing_support import paired

from polymorph.compile.agents.search import (
    SearchAgent,
    config_key,
    consistent,
    neighbours,
    owner,
    space,
    sweep,
    with_requirements,
)
from polymorph.compile.campaign import Campaign, CampaignSettings
from polymorph.compile.judgement import BudgetExhausted, Standings, budget_share, final_seconds
from polymorph.compile.ledger import CampaignPaths, Ledger, config_uid
from polymorph.compile.selection import score, select_result
from polymorph.contract.api import Budget, ExperimentRecord, Figures, Gates, Objective, Verification
from polymorph.contract.api.build import PairedComparison, Timings
from polymorph.contract.api.common import Constraint, Histogram, WorkloadProfile
from polymorph.contract.builds import read_build
from polymorph.contract.store import build_id, open_store

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


OFFSETS = (0.0, 1.0, -1.0, 0.5, -0.5, 0.25)
"""Relative offsets of a build's passes, in units of its jitter: a fixed, symmetric spread."""


def passes(value: float, jitter: float, shift: int = 0) -> list[float]:
    n = len(OFFSETS)
    return [value * (1 + jitter * OFFSETS[(i + shift) % n]) for i in range(n)]


def figures(tps: float, noise: float = 0.01, itl: float = 10.0, shift: int = 0) -> Figures:
    reps = passes(tps, noise, shift)
    return Figures(
        outputTokensPerSecond=statistics.median(reps),
        totalTokensPerSecond=statistics.median(reps) * 2,
        ttftP50Ms=5,
        ttftP95Ms=6,
        itlP50Ms=itl,
        itlP95Ms=itl,
        noise=noise,
        repeats=reps,
        ttftP95Repeats=[6.0] * len(reps),
        itlP95Repeats=passes(itl, noise, shift),
    )


VER = Verification(tokenAgreement=1.0, logitError=0.0, finite=True, passed=True)


class LandscapeRunner:
    """Figures from SPEED, paired with ``against``'s figures when asked; records every run as
    (knobs, the knobs it was paired against or None)."""

    def __init__(
        self, reject: dict[str, Any] | None = None, jitter: float = 0.01, inert: tuple[str, ...] = ()
    ) -> None:
        self.ran: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        self.screens: list[bool] = []
        self.reject = reject or {}
        self.jitter = jitter
        self.inert = inert  # knobs every record names inert (a hot path's inert_knobs)

    def speed(self, knobs: dict[str, Any]) -> float:
        tps = 100.0
        for name, value in knobs.items():
            tps *= SPEED[name][value]
        return tps

    def figures_of(self, knobs: dict[str, Any], shift: int = 0) -> Figures:
        # Bigger batches have worse inter-token latency.
        return figures(self.speed(knobs), self.jitter, itl=5.0 * int(knobs["batch"]), shift=shift)

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        knobs = read_build(build_dir).defaults()
        base_knobs = read_build(against).defaults() if against is not None else None
        self.ran.append((knobs, base_knobs))
        self.screens.append(screen)
        if any(knobs.get(k) == v for k, v in self.reject.items()):
            ver = Verification(tokenAgreement=0.5, logitError=3.0, finite=True, passed=False)
            return ExperimentRecord(build="x", status="rejected", verification=ver, knobs=knobs)
        fig = self.figures_of(knobs)
        comparison = None
        if against is not None and base_knobs is not None:
            comparison = paired(fig, self.figures_of(base_knobs, shift=1), build_id(against))
        return ExperimentRecord(
            build="x",
            status="passed",
            verification=VER,
            figures=fig,
            comparison=comparison,
            knobs=knobs,
            inertKnobs=list(self.inert),
        )


def keys_of(runner: LandscapeRunner) -> list[str]:
    """(configuration, paired-against, protocol) of every run: what must never repeat."""
    return [
        config_key(k) + "|" + (config_key(b) if b is not None else "") + ("|screen" if screen else "")
        for (k, b), screen in zip(runner.ran, runner.screens, strict=True)
    ]


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
    best_knobs = {"batch": 8, "attn": "fused", "cache": "concat"}
    defaults = read_build(base).defaults()
    # The winner is confirmed by one more run paired with the baseline, outside the ledger.
    searched, confirmation = runner.ran[:-1], runner.ran[-1]
    assert confirmation == (best_knobs, defaults)
    assert out.result.confirmation.confirmed and out.result.confirmation.speedup == pytest.approx(
        6.0, rel=0.01
    )
    assert out.result.confirmation.pairs == 6 and out.result.confirmation.speedupCi[0] > 1.05
    keys = keys_of(runner)[:-1]
    assert len(keys) == len(set(keys)), "an experiment ran twice"
    # The baseline ran alone; every candidate was paired (the sweep with its anchor).
    assert searched[0] == (defaults, None) and all(b is not None for _, b in searched[1:])
    assert out.stopReason == "finished"
    assert out.result.state == "improved"
    assert out.result.best.knobs == best_knobs
    assert out.result.best.speedup == pytest.approx(6.0, rel=0.01) and out.result.best.pairs == 6
    assert out.result.best.speedupCi[0] < 6.0 < out.result.best.speedupCi[1]
    # The best build is in the store with its manifest: knobs, workload and figures.
    manifest = store.get_manifest(out.result.best.build)
    assert manifest.knobs["batch"] == 8 and manifest.workload == PROFILE
    assert manifest.figures is not None and manifest.figures.outputTokensPerSecond == pytest.approx(
        600.0, rel=0.01
    )
    assert out.bestUri and out.bestUri.endswith(".tar.gz")
    # Ledger, progress and result live under compilejobs/local/toy-<uid>/.
    paths = settings(base).paths
    assert len(store.read_jsonl(paths.ledger(0))) == len(searched)
    progress = store.get_json(paths.progress(0))
    assert progress["counts"]["total"] == len(searched) and progress["state"] == "finished"
    assert progress["best"]["significant"] and progress["best"]["pairs"] == 6
    assert store.get_json(paths.result)["best"]["build"] == out.result.best.build


def test_screening_moves_to_a_fast_comparator_and_the_judgement_settles_the_leader(
    tmp_path: Path, base: Path
) -> None:
    runner = LandscapeRunner()
    store = open_store(str(tmp_path / "store"))
    out = Campaign(settings(base), store, runner).run(SearchAgent())
    defaults = read_build(base).defaults()
    records = store.read_jsonl(settings(base).paths.ledger(0))
    screens = [r for r in records if r.get("screen")]
    assert screens and all(r["comparison"] is not None for r in screens)
    # Screening starts paired with the baseline and moves to a faster comparator once the
    # evidence puts one 1.25x above it: later screens are not paired with the slow baseline.
    base_id = records[0]["build"]
    againsts = [r["comparison"]["against"] for r in screens]
    assert againsts[0] == base_id and againsts[-1] != base_id
    # The judgement: the leader measured by the full protocol paired with the baseline, and
    # every build that may be the best raced against the leader (never ranked by a chain).
    best_knobs = {"batch": 8, "attn": "fused", "cache": "concat"}
    assert out.result.best is not None and out.result.best.knobs == best_knobs
    full = [r for r in records if not r.get("screen") and r["comparison"] is not None]
    assert any(r["knobs"] == best_knobs and r["comparison"]["against"] == base_id for r in full)
    assert out.result.best.pairs >= 5  # chosen by its full record, not a short screen
    assert (best_knobs, defaults) in runner.ran


def test_a_knob_the_model_leaves_inert_stays_at_its_default(tmp_path: Path, base: Path) -> None:
    # attn is the best knob here, but the baseline's record says it changes nothing for this
    # model (as the MoE knobs on a dense model): the search never varies it.
    runner = LandscapeRunner(inert=("attn",))
    out = Campaign(settings(base), open_store(str(tmp_path / "s")), runner).run(SearchAgent())
    assert {knobs["attn"] for knobs, _ in runner.ran} == {"naive"}
    assert out.result.best is not None and out.result.best.knobs == {
        "batch": 8,
        "attn": "naive",
        "cache": "concat",
    }


def test_the_judgement_reserve_is_kept_from_the_agent(tmp_path: Path, base: Path) -> None:
    # 9 experiments: the agent may start 7, two are kept for the judgement (a race and the final).
    runner = LandscapeRunner()
    campaign = Campaign(
        settings(base, budget=Budget(maxExperiments=9, sandboxes=1)), open_store(str(tmp_path / "s")), runner
    )
    assert campaign.budget.reserved_experiments() == 2
    out = campaign.run(SearchAgent())
    defaults = read_build(base).defaults()
    assert len(runner.ran) <= 9
    assert out.result.state == "improved" and out.result.best is not None
    # The kept build was measured paired with the baseline by the full protocol.
    assert (out.result.best.knobs, defaults) in runner.ran
    assert out.result.best.pairs >= 5


def test_budget_stops_the_campaign_and_resume_repeats_nothing(tmp_path: Path, base: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    first = LandscapeRunner()
    out = Campaign(settings(base, budget=Budget(maxExperiments=4, sandboxes=1)), store, first).run(
        SearchAgent()
    )
    # The budget bounds it: the agent stops one short, and the judgement pairs its leader with
    # the baseline by the full protocol in the experiment it kept.
    assert out.stopReason in ("maxExperiments", "finished") and len(first.ran) == 4
    assert first.ran[-1][1] == read_build(base).defaults() and not first.screens[-1]
    # Same campaign, bigger budget: it resumes (a finished campaign on the same budget would only
    # report), what it asks again comes from the ledger (the baseline at least: near the end of a
    # budget the search exploits, so a longer one may take another path), and nothing runs twice.
    second = LandscapeRunner()
    out2 = Campaign(settings(base, budget=Budget(maxExperiments=50, sandboxes=1)), store, second).run(
        SearchAgent()
    )
    assert out2.fromLedger >= 1 and out2.ranThisSession > 0
    keys = keys_of(first) + keys_of(second)
    assert len(keys) == len(set(keys))
    assert out2.result.best.knobs["batch"] == 8


def test_deadline_is_enforced_with_a_fake_clock(tmp_path: Path, base: Path) -> None:
    now = [0.0]

    class SlowRunner(LandscapeRunner):
        def run(
            self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
        ) -> ExperimentRecord:
            now[0] += 25.0  # each experiment takes 25 s of campaign time
            record = super().run(build_dir, description=description, against=against, screen=screen)
            return record.model_copy(update={"timings": Timings(totalS=25.0)})

    store = open_store(str(tmp_path / "store"))
    runner = SlowRunner()
    s = settings(base, budget=Budget(maxExperiments=50, deadline="1m", sandboxes=1))
    out = Campaign(s, store, runner, clock=lambda: now[0]).run(SearchAgent())
    assert out.stopReason == "deadline"
    # The judgement keeps 30 s (half the deadline): the agent starts experiments at 0 s and 25 s;
    # the final pairing starts at 50 s, its time reserved; none may start at 75 s.
    assert len(runner.ran) == 3 and not runner.screens[-1]
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
        assert runner.ran[0] == (read_build(base).defaults(), None), "every sandbox measures its own baseline"
        ran.append({config_key(k) for k, _ in runner.ran[1:]})
    assert ran[0] and ran[1] and not ran[0] & ran[1]
    # The last sandbox to finish writes the result from both ledgers.
    result = store.get_json(settings(base).paths.result)
    assert result["experiments"]["total"] >= len(ran[0]) + len(ran[1]) + 2


def test_a_win_that_does_not_hold_up_is_not_declared(tmp_path: Path, base: Path) -> None:
    class SpikeRunner(LandscapeRunner):
        """Every knob is neutral, but the baseline passes of the first paired screen and of the
        first full paired run (that build's final pairing, the record that stands for it) hit a
        load spike."""

        spiked = False

        def figures_of(self, knobs: dict[str, Any], shift: int = 0) -> Figures:
            full = not self.screens[-1] and len(self.ran) > 1
            spike = shift == 1 and (len(self.ran) == 2 or (full and not self.spiked))
            self.spiked |= spike and full
            return figures(50.0 if spike else 100.0, self.jitter, shift=shift)

    store = open_store(str(tmp_path / "store"))
    out = Campaign(settings(base, confirm=True), store, SpikeRunner()).run(SearchAgent())
    assert out.result.confirmation.confirmed is False
    assert out.result.confirmation.speedup == pytest.approx(1.0, rel=0.02)
    assert out.result.state == "noImprovement" and out.result.best is None
    assert "did not hold up" in out.result.message
    assert out.result.bestCandidate.speedup == pytest.approx(2.0, rel=0.02)


def record(build: str, fig: Figures, comparison: PairedComparison | None = None) -> ExperimentRecord:
    return ExperimentRecord(
        build=build, status="passed", verification=VER, figures=fig, comparison=comparison
    )


BASE_ID, CAND_ID = "sha256:" + "0" * 64, "sha256:" + "a" * 64


def test_paired_rule_and_helpers() -> None:
    obj = Objective()
    base = record(BASE_ID, figures(100))

    def cand(tps: float, jitter: float, base_tps: float = 100.0) -> ExperimentRecord:
        fig = figures(tps, jitter)
        return record(CAND_ID, fig, paired(fig, figures(base_tps, jitter, shift=1), BASE_ID))

    assert score(cand(110, 0.01), base, obj, 1.05).wins
    assert not score(cand(110, 0.08), base, obj, 1.05).wins  # the interval reaches below 1.05
    assert not score(cand(103, 0.005), base, obj, 1.05).wins  # surely faster, not by the gate
    # Unpaired figures are never a win, however large the ratio: separate measurements drift.
    unpaired = score(record(CAND_ID, figures(200)), base, obj, 1.05)
    assert unpaired.estimate.value == pytest.approx(2.0) and not unpaired.wins
    # Paired with another build than the one compared against: treated as unpaired.
    other = cand(150, 0.01).model_copy(update={"comparison": paired(figures(150), figures(100), CAND_ID)})
    assert not score(other, base, obj, 1.05).wins
    # A latency objective pairs the per-pass p95 lists; a speedup > 1 means lower latency.
    lat = Objective(metric="itlP95")
    fast, slow = figures(100, itl=5.0), figures(100, itl=10.0, shift=1)
    assert score(
        record(CAND_ID, fast, paired(fast, slow, BASE_ID)), base, lat, 1.05
    ).estimate.value == pytest.approx(2.0, rel=0.02)
    assert [budget_share(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert owner({"a": 1}, 1) == 0
    defaults = {"a": 1, "b": "x"}
    assert sweep(defaults, {"a": [1, 2], "b": ["x", "y"]}) == [{"a": 2, "b": "x"}, {"a": 1, "b": "y"}]
    assert neighbours({"a": 2}, {"a": [1, 2, 3]}) == [{"a": 1}, {"a": 3}]


def test_one_wild_pair_does_not_flip_the_verdict() -> None:
    # The failed ledger of the issue: 1.43x with every candidate pass above every baseline pass,
    # lost to one slow baseline pass under the old range rule. Paired, it stays a win.
    base_passes = [2898.0, 2677.0, 2912.0, 2964.0, 2957.0]
    cand_passes = [4190.0, 4167.0, 4209.0, 4146.0, 4112.0]
    b, c = figures(2900), figures(4170)
    b = b.model_copy(update={"repeats": base_passes})
    c = c.model_copy(update={"repeats": cand_passes})
    won = score(record(CAND_ID, c, paired(c, b, BASE_ID)), record(BASE_ID, b), Objective(), 1.05)
    assert won.wins and won.estimate.value == pytest.approx(1.43, abs=0.02)
    # A wild candidate pass (3x slow) among six does not turn it either.
    c6 = c.model_copy(update={"repeats": [*cand_passes, 1400.0]})
    b6 = b.model_copy(update={"repeats": [*base_passes, 2900.0]})
    assert score(record(CAND_ID, c6, paired(c6, b6, BASE_ID)), record(BASE_ID, b6), Objective(), 1.05).wins


def test_no_improvement_is_explicit() -> None:
    base = record(BASE_ID, figures(100, 0.1))
    fig = figures(112, 0.1)
    cand = record(CAND_ID, fig, paired(fig, figures(100, 0.1, shift=1), BASE_ID))
    doc = select_result({0: [base, cand]}, BASE_ID, Objective(), Gates()).model_dump(mode="json")
    assert doc["state"] == "noImprovement" and doc["best"] is None
    assert doc["bestCandidate"]["speedup"] == pytest.approx(1.12, rel=0.02)
    lo, hi = doc["bestCandidate"]["speedupCi"]
    assert lo < 1.05 < hi and doc["bestCandidate"]["pairs"] == 6
    assert "does not clear the 1.05x gate" in doc["message"]
    json.dumps(doc)


def test_a_builds_lucky_screen_does_not_speak_for_it_over_its_final() -> None:
    # A screen read 8x; the final pairing with the baseline (the full protocol) 6x.
    base = record(BASE_ID, figures(100))
    lucky, full = figures(800, shift=2), figures(600)
    screen = record(CAND_ID, lucky, paired(lucky, figures(100, shift=1), BASE_ID))
    screen = screen.model_copy(update={"screen": True})
    final = record(CAND_ID, full, paired(full, figures(100, shift=3), BASE_ID))
    doc = select_result({0: [base, screen, final]}, BASE_ID, Objective(), Gates()).model_dump(mode="json")
    assert doc["state"] == "improved"
    assert doc["best"]["speedup"] == pytest.approx(6.0, rel=0.02)


def test_a_build_judged_by_the_full_protocol_is_kept_over_one_only_screened() -> None:
    # A screen of one build read 8x in a few pairs; the judged leader's final pairing with the
    # baseline (the full protocol) read 6x. Both clear the gate, and the screen's point estimate
    # ranks higher by the graph, but only the judged build's verdict was measured in full.
    other = "sha256:" + "b" * 64
    base = record(BASE_ID, figures(100))
    lucky, full = figures(800, shift=2), figures(600)
    screen = record(other, lucky, paired(lucky, figures(100, shift=1), BASE_ID))
    screen = screen.model_copy(update={"screen": True})
    final = record(CAND_ID, full, paired(full, figures(100, shift=3), BASE_ID))
    for order in ([base, screen, final], [base, final, screen]):
        doc = select_result({0: order}, BASE_ID, Objective(), Gates()).model_dump(mode="json")
        assert doc["state"] == "improved"
        assert doc["best"]["build"] == CAND_ID
        assert doc["best"]["speedup"] == pytest.approx(6.0, rel=0.02)
    # With no full record among the winners, the screen's verdict is the result (the
    # confirmation measures it again).
    doc = select_result({0: [base, screen]}, BASE_ID, Objective(), Gates()).model_dump(mode="json")
    assert doc["best"]["build"] == other


def test_a_slow_to_prepare_value_waits_while_the_time_left_is_short(tmp_path: Path) -> None:
    # attn=fused compiles for tens of seconds on an accelerator (slow_prepare); it is the best value. Under a
    # 5-minute deadline and a 30 s timeout the agent never has ten timeouts left: it screens
    # only what prepares fast. With an hour, it screens attn=fused and keeps it.
    base = tmp_path / "toy"
    base.mkdir()
    (base / "build.toml").write_text(
        TOML.replace('default = "naive"', 'default = "naive"\nslow_prepare = ["fused"]')
    )
    (base / "hotpath.py").write_text("def load(model, knobs):\n    raise NotImplementedError\n")
    now = [0.0]

    class TimedRunner(LandscapeRunner):
        def run(
            self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
        ) -> ExperimentRecord:
            now[0] += 5.0
            return super().run(build_dir, description=description, against=against, screen=screen)

    kept = {}
    # On a CPU nothing is slow to prepare (a small model compiles in seconds): a 5-minute campaign
    # there screens attn=fused as any other value.
    for deadline, hardware in (("5m", "nvidia-h200"), ("1h", "nvidia-h200"), ("5m", "cpu")):
        runner = TimedRunner()
        budget = Budget(maxExperiments=40, deadline=deadline, sandboxes=1, experimentTimeout="30s")
        where = config_uid({"d": deadline, "h": hardware})
        s = settings(base, budget=budget, hardware=hardware, paths=CampaignPaths("local", "toy", where))
        out = Campaign(s, open_store(str(tmp_path / where)), runner, clock=lambda: now[0]).run(SearchAgent())
        assert out.result.best is not None
        kept[deadline, hardware] = (out.result.best.knobs["attn"], {k["attn"] for k, _ in runner.ran})
    assert kept["5m", "nvidia-h200"] == ("naive", {"naive"})
    assert kept["1h", "nvidia-h200"][0] == "fused"
    assert kept["5m", "cpu"][0] == "fused"


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

    @staticmethod
    def speed(knobs: dict[str, Any]) -> float:
        tps = 100.0 * (0.95 if knobs["cache"] == "static" else 1.0)
        return tps * 3.0 if knobs["capture"] == "graph" and knobs["cache"] == "static" else tps

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        knobs = read_build(build_dir).defaults()
        self.ran.append(knobs)
        fig = figures(self.speed(knobs))
        comparison = None
        if against is not None:
            base_fig = figures(self.speed(read_build(against).defaults()), shift=1)
            comparison = paired(fig, base_fig, build_id(against))
        return ExperimentRecord(
            build="x", status="passed", verification=VER, figures=fig, comparison=comparison, knobs=knobs
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
    keys = [config_key(k) for k in runner.ran[:-1]]  # the last is the confirmation
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


def test_two_knobs_that_require_different_values_of_a_third_are_never_searched_together() -> None:
    # As the reference's decode_capture (the layered step) and kernels (the fused step): a
    # configuration holding both computes as another one, so it is not in the space. Completing
    # it would alternate between the two requirements, and once read as consistent.
    defaults = {"step": "layered", "capture": "none", "kernels": "torch"}
    choices = {"step": ["layered", "fused"], "capture": ["none", "graph"], "kernels": ["torch", "triton"]}
    requires = {"capture": {"step": "layered"}, "kernels": {"step": "fused"}}
    both = {"step": "layered", "capture": "graph", "kernels": "triton"}
    assert not consistent(both, requires, defaults)
    assert not consistent(both | {"step": "fused"}, requires, defaults)
    found = space(defaults, choices, requires)
    assert all(not (c["capture"] == "graph" and c["kernels"] == "triton") for c in found)
    assert {config_key(c) for c in found} == {
        config_key(c)
        for c in (
            defaults,
            defaults | {"capture": "graph"},
            defaults | {"step": "fused"},
            defaults | {"step": "fused", "kernels": "triton"},
        )
    }


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([], "no experiment ran: the campaign stopped before the base build was measured"),
        (
            [ExperimentRecord(build="sha256:" + "b" * 64, status="failed", error="boom")],
            "the base build did not pass verification and benchmark",
        ),
        (
            [
                ExperimentRecord(
                    build="sha256:" + "b" * 64,
                    status="passed",
                    verification=Verification(tokenAgreement=1.0, logitError=0.0, finite=True, passed=True),
                    figures=Figures(
                        outputTokensPerSecond=100.0, totalTokensPerSecond=200.0, ttftP50Ms=1, ttftP95Ms=2,
                        itlP50Ms=1, itlP95Ms=2, noise=0.01, repeats=[100.0] * 5,
                    ),
                )
            ],
            "no improvement: no candidate ran (the budget held only the baseline's measurement)",
        ),
    ],
    ids=["nothing ran", "the baseline failed", "only the baseline ran"],
)  # fmt: skip
def test_the_result_says_what_happened_when_nothing_could_be_compared(
    records: list[ExperimentRecord], message: str
) -> None:
    result = select_result({0: records}, "sha256:" + "b" * 64, Objective(), Gates())
    assert result.message.startswith(message), result.message


def test_the_reserve_for_a_slow_baseline_is_its_own_run_not_four(tmp_path: Path) -> None:
    # The final pairing and its confirmation each run the baseline's passes beside the leader's:
    # with candidates as slow as the baseline, four baseline runs; beside candidates 20 times
    # faster (an MoE reference), about two runs of each, not four of the baseline's.
    def record(build: str, total: float, status: str = "passed") -> ExperimentRecord:
        return ExperimentRecord(build=build, status=status, timings=Timings(totalS=total))

    def reserve(candidates: list[ExperimentRecord], ledger: str) -> float:
        standings = Standings(Ledger(open_store(str(tmp_path / "s")), ledger), "base", Objective())
        standings.baseline = record("base", 30.0)
        for r in candidates:
            standings.ledger.append(r)
        return final_seconds(standings)

    assert reserve([], "none") == pytest.approx(120.0)
    slow = [record("a", 30.0), record("b", 45.0)]
    assert reserve(slow, "slow") == pytest.approx(120.0)  # a typical candidate, at most the baseline
    fast = [record("a", 6.0), record("b", 8.0), record("c", 10.0), record("d", 30.0, "timeout")]
    assert reserve(fast, "fast") == pytest.approx(2 * (30.0 + 8.0))  # a timeout is not typical
