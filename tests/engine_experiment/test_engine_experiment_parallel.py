"""Experiments with ``tensor_parallel=2`` on a CPU: the supervised worker is rank 0 of two gloo
ranks, builds are loaded, verified and measured on both, and a rank failing alone makes the
experiment ``crashed`` with the rank named, the next one passing on a restarted group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_support.builds import MODEL, wrapping_build
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.supervisor import Supervisor


@pytest.fixture(scope="module")
def supervisor() -> Iterator[Supervisor]:
    with Supervisor(
        MODEL,
        experiment_timeout=60,
        settings=BenchSettings(repeats=1, warmup=0),
        verify_steps=4,
        threads=1,
        tensor_parallel=2,
        rank_timeout=3,
    ) as sup:
        yield sup


def test_an_experiment_verifies_and_measures_on_two_ranks(supervisor: Supervisor) -> None:
    record = supervisor.run(REFERENCE_BUILD)
    assert record.status == "passed", record.error
    assert record.verification is not None and record.verification.passed
    assert record.figures is not None and record.figures.outputTokensPerSecond > 0
    again = supervisor.run(REFERENCE_BUILD)  # the worker stays hot
    assert again.status == "passed" and supervisor.stats.starts == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("raise RuntimeError('rank 1 exploded')", "rank 1 raised in decode: RuntimeError: rank 1 exploded"),
        ("import time; time.sleep(3600)", "rank 1 did not finish decode"),
    ],
    ids=["raises", "hangs"],
)
def test_a_rank_failing_alone_is_a_crash_naming_it(
    supervisor: Supervisor, tmp_path: Path, body: str, expected: str
) -> None:
    method = f"        if model.shard.rank == 1:\n            {body}\n        return original(*args)"
    build = wrapping_build(tmp_path / "b", "one-rank", "decode", method)
    crashes, restarts = supervisor.stats.crashes, supervisor.stats.restarts
    record = supervisor.run(build)
    assert record.status == "crashed", record
    assert record.error is not None and expected in record.error and "will be restarted" in record.error
    assert supervisor.stats.crashes == crashes + 1
    after = supervisor.run(REFERENCE_BUILD)
    assert after.status == "passed", after.error
    assert supervisor.stats.restarts == restarts + 1
