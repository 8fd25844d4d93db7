"""Crash containment: raise, os._exit, segfault, hang and NaN builds are recorded; the next build passes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.context import SpawnProcess
from pathlib import Path

import pytest

from engine_support.builds import CRASHES, MODEL, patched_build, wrapping_build
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import build_id
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.supervisor import Supervisor, WorkerStartError

TIMEOUT_S = 6.0


@pytest.fixture(scope="module")
def supervisor() -> Iterator[Supervisor]:
    # One torch thread: on a shared 2-core machine, spinning OpenMP workers can slow a tiny model
    # 50x, and a good build must never look like a hang.
    with Supervisor(
        MODEL,
        experiment_timeout=TIMEOUT_S,
        settings=BenchSettings(repeats=1, warmup=0),
        verify_steps=4,
        threads=1,
    ) as sup:
        yield sup


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("crash-builds")
    return {name: wrapping_build(root / name, name, method, body) for name, (method, body) in CRASHES.items()}


EXPECTED = {
    "raises": ("failed", "RuntimeError: decode exploded on purpose"),
    "exits": ("crashed", "exited with code 7"),
    "segfaults": ("crashed", "killed by SIGSEGV"),
    "hangs": ("timeout", f"ran past the {TIMEOUT_S:g} s timeout"),
    "nan": ("rejected", None),
}


def test_the_worker_starts_once_and_runs_experiments_hot(supervisor: Supervisor) -> None:
    assert supervisor.stats.starts == 1 and supervisor.stats.load_seconds[0] > 0
    first = supervisor.run(REFERENCE_BUILD, description="baseline")
    again = supervisor.run(REFERENCE_BUILD)
    assert first.status == again.status == "passed", (first.error, again.error)
    assert first.description == "baseline" and first.build == build_id(REFERENCE_BUILD)
    assert supervisor.stats.starts == 1 and supervisor.stats.experiments >= 2


@pytest.mark.parametrize("name", ["raises", "exits", "segfaults", "hangs", "nan"])
def test_a_misbehaving_build_is_contained_and_the_next_build_passes(
    supervisor: Supervisor, builds: dict[str, Path], name: str
) -> None:
    restarts, crashes, timeouts = (
        supervisor.stats.restarts,
        supervisor.stats.crashes,
        supervisor.stats.timeouts,
    )
    started = time.perf_counter()
    record = supervisor.run(builds[name])
    status, message = EXPECTED[name]
    assert record.status == status, record
    if message is not None:
        assert record.error is not None and message in record.error
    assert record.build == build_id(builds[name]) and record.name == name
    if status == "timeout":
        assert TIMEOUT_S <= time.perf_counter() - started < TIMEOUT_S + 10
    if status == "rejected":
        assert record.verification is not None and not record.verification.finite

    after = supervisor.run(REFERENCE_BUILD)
    assert after.status == "passed", after.error
    died = status in ("crashed", "timeout")
    assert supervisor.stats.restarts == restarts + int(died)
    assert supervisor.stats.crashes == crashes + int(status == "crashed")
    assert supervisor.stats.timeouts == timeouts + int(status == "timeout")


def test_a_worker_that_cannot_load_the_model_is_one_sentence(tmp_path: Path) -> None:
    supervisor = Supervisor(str(tmp_path / "no-such-checkpoint"), experiment_timeout=5)
    with pytest.raises(WorkerStartError, match=r"neither a shape .* nor a checkpoint directory"):
        supervisor.start()
    assert not supervisor.alive


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="experiment_timeout"):
        Supervisor(MODEL, experiment_timeout=0)
    with pytest.raises(ValueError, match="baseline_timeout"):
        Supervisor(MODEL, experiment_timeout=5, baseline_timeout=0)


SLOW_LOAD = """

_reference_load = load


def load(model, knobs):
    import time

    time.sleep(4)
    return _reference_load(model, knobs)
"""


def test_a_baseline_measured_alone_has_the_longer_timeout_and_a_paired_candidate_does_not(
    tmp_path: Path,
) -> None:
    # A build that takes 4 s to load: paired with the reference, as every candidate is, it runs
    # past a 2 s experiment timeout; measured alone, as a campaign's baseline is, it has 30 s.
    slow = patched_build(tmp_path / "slow", "slow-to-load", append=SLOW_LOAD)
    with Supervisor(
        MODEL,
        experiment_timeout=2,
        baseline_timeout=30,
        settings=BenchSettings(repeats=1, warmup=0),
        verify_steps=4,
        threads=1,
    ) as supervisor:
        paired = supervisor.run(slow, against=REFERENCE_BUILD)
        assert paired.status == "timeout" and "past the 2 s timeout" in (paired.error or ""), paired
        alone = supervisor.run(slow, description="baseline")
        assert alone.status == "passed", alone.error
        assert alone.timings.totalS > 4


def test_a_pairing_with_a_slow_baseline_measured_alone_may_also_take_that_measurements_time(
    tmp_path: Path,
) -> None:
    # A baseline whose decode steps sleep 0.3 s: one pass of the CPU workload takes about 2 s of
    # wall time (a CPU pass is timed by CPU time, so the sleep does not change its figures).
    # Measured alone it has the baseline timeout; a fast candidate's screen beside it then runs
    # two of its baseline's passes too, past the 2 s experiment timeout, and is not killed for them.
    sleep = "        import time\n\n        time.sleep(0.3)\n        return original(*args)"
    slow = wrapping_build(tmp_path / "slow", "slow-steps", "decode", sleep)
    with Supervisor(
        MODEL,
        experiment_timeout=2,
        baseline_timeout=60,
        settings=BenchSettings(repeats=2, max_repeats=2, warmup=0, max_warmup=0),
        verify_steps=4,
        threads=1,
    ) as supervisor:
        # Not measured alone yet: the plain timeout.
        cold = supervisor.run(REFERENCE_BUILD, against=slow, screen=True)
        assert cold.status == "timeout" and "past the 2 s timeout;" in (cold.error or ""), cold
        alone = supervisor.run(slow, description="baseline")
        assert alone.status == "passed", alone.error
        assert alone.timings.totalS > 2
        started = time.perf_counter()
        paired = supervisor.run(REFERENCE_BUILD, against=slow, screen=True)
        assert paired.status == "passed", paired.error
        assert time.perf_counter() - started > 2
        assert paired.comparison is not None


class _CtrlCAtSpawn(SpawnProcess):
    """A worker process whose start is preceded by a Ctrl-C to the parent's main thread (module
    level: spawn pickles the process object). Sent to the main thread, not the process: a
    process-directed signal may go to another thread, which reports it only once it runs again,
    so the test could not say when it arrives."""

    def start(self) -> None:
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        super().start()


def test_a_ctrl_c_while_the_worker_spawns_stops_the_parent(tmp_path: Path) -> None:
    # Once seen in CI: a campaign restarted its worker right after an experiment, the Ctrl-C
    # landed then, and the parent (ignoring SIGINT while spawning) dropped it and ran on.
    supervisor = Supervisor(MODEL, experiment_timeout=TIMEOUT_S, threads=1)
    base = supervisor._ctx.Process
    supervisor._ctx.Process = _CtrlCAtSpawn  # type: ignore[attr-defined,misc]
    try:
        with pytest.raises(KeyboardInterrupt):
            supervisor.start()
        assert supervisor._process is not None  # the child is the supervisor's to stop
    finally:
        supervisor._ctx.Process = base  # type: ignore[attr-defined,misc]
        supervisor.close()
    assert not supervisor.alive


def test_the_parent_never_imports_torch() -> None:
    # Only the worker loads the engine: `polymorph compile` starts a campaign without paying for
    # torch twice (its worker imports it anyway), and a parent that supervises stays light.
    check = (
        "import sys; import polymorph.compile.cli, polymorph.compile.campaign;"
        "import polymorph_engine.experiment.settings, polymorph_engine.experiment.supervisor;"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
