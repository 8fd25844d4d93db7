"""In-process experiments: passed, rejected and failed records, and a hot engine that survives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_support.builds import patched_build, sensitive_model, wrapping_build
from polymorph.contract.api import ExperimentRecord, Gates
from polymorph.contract.builds import REFERENCE_BUILD, knob_variant
from polymorph.contract.store import build_id
from polymorph.contract.workload import DEFAULT_WORKLOAD, workload_from_profile
from polymorph_engine.experiment.run import (
    BenchSettings,
    InProcessRunner,
    describe_error,
    fit_for_device,
    inert_knobs,
    run_experiment,
)
from polymorph_engine.experiment.verify import default_prompts, golden
from polymorph_engine.runtime.hotreload import Engine
from polymorph_engine.runtime.model import LoadedModel

SETTINGS = BenchSettings(repeats=2, warmup=0, max_repeats=2, max_warmup=0)  # fixed: two measured passes


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return sensitive_model()


@pytest.fixture(scope="module")
def runner(model: LoadedModel) -> InProcessRunner:
    workload = fit_for_device(workload_from_profile(DEFAULT_WORKLOAD, n=8), "cpu")
    reference = golden(model, default_prompts(model.config.vocab_size), steps=6)
    return InProcessRunner(Engine(model), workload, Gates(), reference, SETTINGS)


def test_the_cpu_workload_is_scaled_to_be_quick() -> None:
    workload = fit_for_device(workload_from_profile(DEFAULT_WORKLOAD, n=64), "cpu", max_seq_len=4096)
    assert len(workload.requests) == 8 and workload.concurrency == 4
    assert (
        max(r.input_tokens for r in workload.requests) <= 32
        and max(r.output_tokens for r in workload.requests) <= 8
    )
    tight = fit_for_device(workload_from_profile(DEFAULT_WORKLOAD, n=64), "cpu", max_seq_len=20)
    assert tight.max_tokens <= 20


def test_a_good_build_passes_with_figures_and_timings(runner: InProcessRunner, tmp_path: Path) -> None:
    variant = knob_variant(REFERENCE_BUILD, {"kv_cache": "static"}, tmp_path / "static", name="static")
    record = runner.run(variant, description="static cache")
    assert isinstance(record, ExperimentRecord)
    assert record.status == "passed" and record.error is None
    assert (
        record.build == build_id(variant) and record.name == "static" and record.description == "static cache"
    )
    assert record.knobs["kv_cache"] == "static" and record.workloadHash == DEFAULT_WORKLOAD.digest()
    assert record.inertKnobs == ["moe_experts", "moe_routing"]  # a dense model: the MoE knobs change nothing
    assert record.verification is not None and record.verification.passed
    assert record.figures is not None and len(record.figures.repeats) == SETTINGS.repeats
    t = record.timings
    assert t.loadS > 0 and t.verifyS > 0 and t.benchS > 0 and t.loadS + t.verifyS + t.benchS <= t.totalS


def test_a_wrong_build_is_rejected_without_a_benchmark(runner: InProcessRunner, tmp_path: Path) -> None:
    wrong = patched_build(
        tmp_path / "no-norm",
        "no-norm",
        [("h = rms_norm(x, lw.mlp_norm, self.eps)", "h = x")],
        file="model.py",
    )
    record = runner.run(wrong)
    assert record.status == "rejected" and record.figures is None
    assert record.verification is not None and record.verification.logitError > 0.05


def test_nan_is_rejected_as_non_finite(runner: InProcessRunner, tmp_path: Path) -> None:
    nan = wrapping_build(tmp_path / "nan", "nan", "decode", "        return original(*args) * float('nan')")
    record = runner.run(nan)
    assert record.status == "rejected" and record.verification is not None and not record.verification.finite


def test_a_raising_build_fails_with_the_line_that_raised_and_the_engine_stays_hot(
    runner: InProcessRunner, tmp_path: Path
) -> None:
    boom = wrapping_build(
        tmp_path / "boom", "boom", "decode", "        raise RuntimeError('decode exploded on purpose')"
    )
    record = runner.run(boom)
    assert record.status == "failed" and record.verification is None
    assert record.error is not None
    assert record.error.startswith("RuntimeError: decode exploded on purpose (at hotpath.py:")
    assert record.error.endswith("in replacement)") and "\n" not in record.error
    assert record.name == "boom" and record.build == build_id(boom)
    assert runner.engine.current is None
    assert runner.run(REFERENCE_BUILD).status == "passed"


def test_a_malformed_build_directory_fails_with_one_sentence(runner: InProcessRunner, tmp_path: Path) -> None:
    bad = patched_build(
        tmp_path / "bad-toml", "bad-toml", [('default = "concat"', 'default = "paged"')], file="build.toml"
    )
    record = runner.run(bad)
    assert record.status == "failed" and record.error is not None
    assert (
        record.error.startswith("BuildError: ")
        and "knobs.kv_cache.default must be one of concat, static" in record.error
    )


def test_run_experiment_applies_knob_overrides(model: LoadedModel, runner: InProcessRunner) -> None:
    record = run_experiment(
        runner.engine,
        REFERENCE_BUILD,
        runner.workload,
        runner.gates,
        runner.golden,
        knobs={"fused_qkv": "true"},
        settings=SETTINGS,
    )
    assert record.status == "passed" and record.knobs["fused_qkv"] is True


def test_inert_knobs_are_only_the_declared_knob_names_a_hot_path_gives() -> None:
    class Named:
        def __init__(self, inert: object) -> None:
            self.inert_knobs = inert

    knobs = {"kv_cache": "concat", "moe_experts": "loop"}
    assert inert_knobs(Named(("moe_experts", "kv_cache")), knobs) == ["kv_cache", "moe_experts"]
    assert inert_knobs(Named(["moe_experts", "not_a_knob", 3]), knobs) == ["moe_experts"]
    assert inert_knobs(Named("moe_experts"), knobs) == []  # a string is not a list of names
    assert inert_knobs(object(), knobs) == []


def test_describe_error_is_one_bounded_line() -> None:
    assert describe_error(ValueError("a\n  b")) == "ValueError: a b"
    assert describe_error(KeyError()) == "KeyError: (no message)"
    assert len(describe_error(RuntimeError("x" * 1000))) < 450


def test_a_paired_experiment_measures_both_builds_interleaved(model: LoadedModel, tmp_path: Path) -> None:
    workload = fit_for_device(workload_from_profile(DEFAULT_WORKLOAD, n=8), "cpu")
    reference = golden(model, default_prompts(model.config.vocab_size), steps=6)
    settings = BenchSettings(repeats=5, warmup=1, max_repeats=8, max_warmup=3)
    runner = InProcessRunner(Engine(model), workload, Gates(), reference, settings)
    try:
        static = knob_variant(REFERENCE_BUILD, {"kv_cache": "static"}, tmp_path / "static", name="static")
        sdpa = knob_variant(REFERENCE_BUILD, {"attention": "sdpa"}, tmp_path / "sdpa", name="sdpa")
        first = runner.run(static, against=REFERENCE_BUILD)
        second = runner.run(sdpa, against=REFERENCE_BUILD)
        for record in (first, second):
            assert record.status == "passed" and record.comparison is not None and record.figures is not None
            c = record.comparison
            assert c.against == build_id(REFERENCE_BUILD) and c.order == "ABBA"
            assert 3 <= c.pairs <= 8 and record.passes == c.pairs == len(record.figures.repeats)
            assert c.pairs >= 5 or c.hi < 1, "only a surely slower candidate stops before min pairs"
            assert len(c.baseline.repeats) == c.pairs and c.lo <= c.ratio <= c.hi
            assert record.halfWidth == pytest.approx(c.halfWidth)
            assert 2 <= record.figures.warmupPasses == len(record.figures.warmupRepeats) <= 3
        # The baseline warmed up to a steady state once; held warm, it gets one pass the second time.
        assert first.comparison is not None and second.comparison is not None
        assert (
            2 <= first.comparison.baseline.warmupPasses <= 3 and second.comparison.baseline.warmupPasses == 1
        )
        # The baseline stayed loaded beside the engine's build: one load for both experiments.
        assert runner.slot.loads == 1 and runner.slot.build == build_id(REFERENCE_BUILD)
    finally:
        runner.close()


def test_a_baseline_that_cannot_load_fails_the_experiment(runner: InProcessRunner, tmp_path: Path) -> None:
    static = knob_variant(REFERENCE_BUILD, {"kv_cache": "static"}, tmp_path / "static", name="static")
    broken = patched_build(tmp_path / "broken", "broken", [("\ndef load(", "\ndef _load(")])
    record = runner.run(static, against=broken)
    assert record.status == "failed" and record.error is not None
    assert "the baseline to pair against" in record.error
