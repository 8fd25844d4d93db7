"""A/A: a comment-only copy of the reference build is never declared a win by the paired rule.

Twenty real paired experiments (tiny model, CPU) of a byte-different but identical build against
the reference, each judged by the campaign's own rule (``polymorph.compile.selection.score`` at
the default ``minSpeedup``). The machine's noise is real: this is the false-positive check.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine_support.builds import patched_build, sensitive_model
from polymorph.compile.selection import score
from polymorph.contract.api import Gates, Objective
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import build_id
from polymorph.contract.workload import DEFAULT_WORKLOAD, workload_from_profile
from polymorph_engine.experiment.run import InProcessRunner, fit_for_device
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.verify import default_prompts, golden
from polymorph_engine.runtime.hotreload import Engine


@pytest.fixture()
def one_thread() -> Iterator[None]:
    """One torch thread, as campaigns on a CPU run (two threads on two shared cores thrash)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
def test_a_comment_only_copy_never_wins_in_20_paired_comparisons(tmp_path: Path) -> None:
    model = sensitive_model()
    workload = fit_for_device(workload_from_profile(DEFAULT_WORKLOAD, n=8), "cpu")
    reference = golden(model, default_prompts(model.config.vocab_size), steps=4)
    settings = BenchSettings(repeats=5, warmup=1, max_repeats=12, max_warmup=4)
    runner = InProcessRunner(Engine(model), workload, Gates(), reference, settings)
    copy = patched_build(tmp_path / "copy", "copy", append="\n# a comment changes the bytes, not the code\n")
    assert build_id(copy) != build_id(REFERENCE_BUILD)
    baseline = runner.run(REFERENCE_BUILD)
    gates = Gates()
    ratios = []
    try:
        for _ in range(20):
            record = runner.run(copy, against=REFERENCE_BUILD)
            assert record.status == "passed" and record.comparison is not None
            scored = score(record, baseline, Objective(), gates.minSpeedup)
            assert scored is not None and scored.paired
            assert not scored.wins, f"a comment-only copy was declared {scored.estimate}"
            ratios.append(record.comparison.ratio)
    finally:
        runner.close()
    assert 0.9 < statistics.median(ratios) < 1.1
