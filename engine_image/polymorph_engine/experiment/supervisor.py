"""Crash containment: experiments run in a supervised child process that holds the model.

``Supervisor(model_source, device, dtype, workload, gates, experiment_timeout, ...)`` is an
``polymorph.contract.runner.Runner``. Its worker child (multiprocessing, ``spawn``) imports the engine, loads
the weights once, computes the golden outputs from the reference build, and then runs one
experiment per request over a pipe (``experiment.run_experiment`` in a hot ``Engine``); what
they send each other is ``messages``.
``run(build_dir, against=baseline_dir)`` pairs the experiment with a baseline: the worker keeps
that baseline loaded beside the engine's current build (a ``pairing.BaselineSlot``) across
experiments, so pairing many candidates against one baseline loads it once.

Outcomes the parent records itself, since the child cannot:
- the child dies during an experiment (``os._exit``, a segfault, an OOM kill) -> ``crashed``,
  with the exit code or signal in ``error``;
- no answer within ``experiment_timeout`` seconds (a hang) -> ``timeout``; the child is killed.
In both cases the next ``run`` starts a fresh worker (reloading the weights) before it runs,
and ``stats.restarts`` counts it. Exceptions and failed gates are recorded by the child
(``failed`` / ``rejected``) and the worker stays hot. The worker's stdout is sent to stderr,
so a chatty build cannot corrupt a caller's ``--json`` output.

``stats`` tells the compile report what hot swapping saved: each worker start's seconds
(spawn, imports, weights, golden: the cold cost) next to each experiment's seconds.
Use as a context manager, or call ``close()``. One thread drives a Supervisor.

It knows nothing about agents, stores or the CLI. The parent never imports a build, nor torch:
the child's code is ``worker`` (the engine), imported in the child alone.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from pathlib import Path
from types import TracebackType

from polymorph.contract.api import ExperimentRecord, Gates, WorkloadProfile
from polymorph.contract.api.build import Timings
from polymorph.contract.builds import read_build
from polymorph.contract.store import build_id
from polymorph.contract.workload import DEFAULT_WORKLOAD, Workload, workload_from_profile
from polymorph_engine.experiment.messages import (
    Ready,
    Recorded,
    Run,
    StartFailed,
    Stop,
    WorkerConfig,
    WorkerMessage,
)
from polymorph_engine.experiment.settings import BenchSettings

__all__ = ["Supervisor", "SupervisorStats", "WorkerStartError"]


class WorkerStartError(RuntimeError):
    """The worker could not load the model (bad source, device or dtype); the message says why."""


@dataclass
class SupervisorStats:
    """What the supervisor spent: worker starts (cold cost) versus experiments (hot cost)."""

    starts: int = 0
    restarts: int = 0
    """Starts after the first, each caused by a crash or timeout."""
    load_seconds: list[float] = field(default_factory=list)
    """Wall seconds of each worker start: spawn, imports, device init, weights, golden outputs."""
    experiment_seconds: list[float] = field(default_factory=list)
    """Wall seconds of each experiment seen from the parent (the pipe round trip included)."""
    crashes: int = 0
    timeouts: int = 0

    @property
    def experiments(self) -> int:
        return len(self.experiment_seconds)

    @property
    def mean_load_s(self) -> float:
        return sum(self.load_seconds) / len(self.load_seconds) if self.load_seconds else 0.0

    @property
    def mean_experiment_s(self) -> float:
        return sum(self.experiment_seconds) / len(self.experiment_seconds) if self.experiment_seconds else 0.0


def _worker_main(conn: Connection, config: WorkerConfig) -> None:
    """The child's entry point: ``worker.worker_loop``, quiet on Ctrl-C and when the parent goes away.

    SIGINT reaches the whole terminal process group; it is the parent's to act on (it stops this
    worker), so the child ignores it. It started with SIGINT blocked (``_sigint_deferred``), so a
    Ctrl-C during its imports waited; ignoring it discards that one too. A parent that died
    (SIGTERM, SIGKILL) closes the pipe: the child then ends without a traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    from polymorph_engine.experiment.worker import worker_loop  # the engine, torch with it: the child's only

    with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):  # the parent went away
        worker_loop(conn, config)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """SIGINT held back while a child is spawned (in the main thread only, where signals are handled).

    The main thread blocks it, and the child inherits that mask through exec, so a Ctrl-C during
    its imports cannot raise there. The parent keeps the signal: pending while blocked, or noted by
    a stand-in handler when another thread of the process took it; once the child is spawned, the
    previous handler gets it. (Ignoring it instead, as this once did, dropped a Ctrl-C that landed
    while a worker was restarted after an experiment: the campaign then ran on.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a pending one reaches `previous`
        if noted:
            signal.raise_signal(signal.SIGINT)


def _death_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "the worker stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the worker process was killed by {name}"
    return f"the worker process exited with code {exitcode}"


class Supervisor:
    """An ``ExperimentRunner`` that contains crashes and hangs in a restartable worker process.

    Arguments:
        model_source: a model shape name (``tiny``, ``llama-1b``, ``llama-8b``) or a checkpoint
            directory, as ``polymorph_engine.runtime.checkpoint.load_model`` takes it.
        device, dtype: where and how the worker loads the model.
        workload: the benchmark workload (a ``Workload`` or a ``WorkloadProfile``; default
            ``DEFAULT_WORKLOAD``), scaled for the device by ``fit_for_device`` unless ``fit`` is False.
        gates: verification gates (default ``Gates()``).
        experiment_timeout: seconds one experiment may take before it is recorded as ``timeout``.
        baseline_timeout: seconds an experiment measured alone (no ``against``: a campaign's
            baseline) may take instead (None: ``experiment_timeout``). Campaigns pass
            ``polymorph.contract.runner.baseline_timeout``: a reference build many times slower
            than its candidates is measured once and must not time out the whole campaign.
            A pairing with a build this supervisor measured alone may take
            ``experiment_timeout`` plus the seconds that measurement took: the baseline's passes
            are known, and only the candidate's share is held to the timeout (on an H200,
            qwen3-30b-a3b's reference passes take about 14 s, and a screen's three pairs beside
            it ran past a 30 s timeout whatever the candidate).
        start_timeout: seconds a worker start may take (None: no limit).
        settings: benchmark repeats, warm-up passes and prompt seed.
        verify_prompts, verify_steps: the size of the golden set (P prompts, K steps).
        threads: CPU threads the worker's torch may use (None: torch's default). One thread
            keeps a tiny CPU model's timings steady on a shared machine.
        tensor_parallel: ranks the worker shards the model over (``runtime.parallel``); the
            worker is rank 0 and starts the others. A rank failing on its own (raising alone,
            exiting, or lagging past ``rank_timeout`` seconds) makes the experiment ``crashed``,
            its error naming the rank, and the next ``run`` restarts the worker with every rank.
    """

    def __init__(
        self,
        model_source: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        workload: Workload | WorkloadProfile | None = None,
        gates: Gates | None = None,
        experiment_timeout: float = 600.0,
        *,
        baseline_timeout: float | None = None,
        seed: int = 0,
        settings: BenchSettings = BenchSettings(),
        verify_prompts: int = 4,
        verify_steps: int = 16,
        start_timeout: float | None = None,
        fit: bool = True,
        threads: int | None = None,
        tensor_parallel: int = 1,
        rank_timeout: float = 300.0,
    ) -> None:
        if experiment_timeout <= 0:
            raise ValueError(f"experiment_timeout must be > 0 seconds, got {experiment_timeout}")
        if workload is None:
            workload = DEFAULT_WORKLOAD
        if isinstance(workload, WorkloadProfile):
            workload = workload_from_profile(workload, seed=seed)
        self.workload = workload
        self.gates = gates or Gates()
        self.experiment_timeout = float(experiment_timeout)
        if baseline_timeout is not None and baseline_timeout <= 0:
            raise ValueError(f"baseline_timeout must be > 0 seconds, got {baseline_timeout}")
        self.baseline_timeout = None if baseline_timeout is None else float(baseline_timeout)
        self.start_timeout = start_timeout
        self._config = WorkerConfig(
            model_source=str(model_source),
            device=device,
            dtype=dtype,
            seed=seed,
            workload=workload,
            gates=self.gates.model_dump(),
            settings=settings,
            verify_prompts=verify_prompts,
            verify_steps=verify_steps,
            fit=fit,
            threads=threads,
            tensor_parallel=tensor_parallel,
            # a rank's failure must be named before the experiment times out (a hang costs two)
            rank_timeout=min(rank_timeout, self.experiment_timeout / 3),
        )
        self.stats = SupervisorStats()
        self._alone_s: dict[str, float] = {}
        """Wall seconds of the last passed experiment measured alone, by resolved build folder."""
        self._ctx = mp.get_context("spawn")
        self._process: SpawnProcess | None = None
        self._conn: Connection | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> float:
        """Start the worker if none is running; return the seconds it took (0.0 if already up)."""
        if self.alive:
            return 0.0
        self._kill()
        started = time.perf_counter()
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_worker_main, args=(child_conn, self._config), name="polymorph-worker", daemon=True
        )
        with _sigint_deferred():  # a Ctrl-C now is the parent's, once the child is in self._process
            process.start()
            child_conn.close()
            self._process, self._conn = process, parent_conn
        deadline = None if self.start_timeout is None else started + self.start_timeout
        message = self._receive(deadline)
        if not isinstance(message, Ready):
            reason = message.reason if isinstance(message, StartFailed) else _death_reason(process.exitcode)
            self._kill()
            raise WorkerStartError(
                f"the engine worker could not load model {self._config.model_source!r}: {reason}"
            )
        seconds = time.perf_counter() - started
        if self.stats.starts:
            self.stats.restarts += 1
        self.stats.starts += 1
        self.stats.load_seconds.append(seconds)
        return seconds

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._conn is not None and self._process is not None and self.alive:
            try:
                self._conn.send(Stop())
                self._process.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
        self._kill()

    def _kill(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
            self._process.close()
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def _receive(self, deadline: float | None) -> WorkerMessage | None:
        """The worker's next message; None if it died (then it is reaped) or the deadline passed first."""
        assert self._conn is not None and self._process is not None
        remaining = None if deadline is None else max(0.0, deadline - time.perf_counter())
        ready = wait([self._conn, self._process.sentinel], timeout=remaining)
        if self._conn in ready:
            try:
                message: WorkerMessage = self._conn.recv()
                return message
            except (EOFError, OSError):
                pass
        if ready:
            self._process.join(timeout=10)  # it closed the pipe or exited: collect its exit code
        return None

    # -- experiments -------------------------------------------------------------------------

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        """Run ``build_dir`` in the hot worker (paired with ``against`` when given; by the short
        screening protocol with ``screen``); crashes and hangs become records, never exceptions.

        Raises ``WorkerStartError`` only if a (re)start cannot load the model at all.
        """
        build_dir = Path(build_dir).resolve()
        against_dir = None if against is None else str(Path(against).resolve())
        self.start()
        assert self._conn is not None
        limit, why = self.experiment_timeout, f"{self.experiment_timeout:g} s timeout"
        if against is None and self.baseline_timeout is not None and self.baseline_timeout > limit:
            limit, why = (
                self.baseline_timeout,
                f"{self.baseline_timeout:g} s timeout of a build measured alone",
            )
        elif against_dir in self._alone_s:
            share = self._alone_s[against_dir]
            limit += share
            why += f" plus the {share:.1f} s its baseline took measured alone"
        started = time.perf_counter()
        try:
            self._conn.send(Run(str(build_dir), description, against_dir, screen))
            message = self._receive(started + limit)
        except (BrokenPipeError, OSError):
            message = None
        elapsed = time.perf_counter() - started
        self.stats.experiment_seconds.append(elapsed)
        if isinstance(message, Recorded):
            record = ExperimentRecord.model_validate_json(message.record_json)
            if against is None and record.status == "passed":
                self._alone_s[str(build_dir)] = elapsed
            if record.status == "crashed":  # a tensor-parallel rank failed; the worker has exited
                self.stats.crashes += 1
                self._kill()
            return record
        if self._process is not None and self._process.exitcode is None:
            self.stats.timeouts += 1
            status, error = (
                "timeout",
                f"the experiment ran past the {why}; the worker was killed",
            )
        else:
            self.stats.crashes += 1
            exitcode = self._process.exitcode if self._process is not None else None
            status, error = "crashed", _death_reason(exitcode)
        self._kill()
        return self._outside_record(
            build_dir, status, error + " and will be restarted", description, elapsed, screen
        )

    def _outside_record(
        self, build_dir: Path, status: str, error: str, description: str, elapsed: float, screen: bool = False
    ) -> ExperimentRecord:
        """A record written by the parent for an experiment whose worker died or hung."""
        record = ExperimentRecord(
            build="",
            status=status,
            workloadHash=self.workload.digest,
            description=description,
            screen=screen,
            error=error,
            timings=Timings(totalS=elapsed),
        )
        try:
            record.build = str(build_id(build_dir))
            spec = read_build(build_dir)
            record.name = str(spec.name)
            record.parent = None if spec.parent is None else str(spec.parent)
            record.knobs = {name: knob.default for name, knob in spec.knobs.items()}
        except Exception:
            pass  # the worker's death is the story; a malformed build dir adds nothing
        return record
