"""One experiment, in process: swap a build in, verify it, benchmark it, record the outcome.

Owns: the experiment protocol and its ``polymorph.api.ExperimentRecord``:
- load the build into the hot ``Engine`` (an exception -> ``failed``);
- verify against the golden outputs (an exception -> ``failed``; a gate missed, NaN/inf
  included -> ``rejected`` with the measured values);
- benchmark the workload (an exception -> ``failed``); otherwise ``passed`` with figures.
A ``failed`` record's ``error`` is one line: the exception type and message, plus the
innermost frame inside the build's own files, so an agent can find the line.
``crashed`` and ``timeout`` cannot happen in process; ``supervisor.Supervisor`` records them.

Also owns ``InProcessRunner``, a ``polymorph.compile.runner.Runner`` for trusted code and tests
(``supervisor.Supervisor`` is the contained one), and ``fit_for_device``, the workload scaling
both hot and cold runs share.

It knows nothing about processes, stores, agents or the CLI.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polymorph.api import ExperimentRecord, Gates
from polymorph.api.build import Timings
from polymorph.workload import Workload, fit_workload
from polymorph_engine.experiment.bench import benchmark
from polymorph_engine.experiment.verify import Golden, verify
from polymorph_engine.runtime.hotreload import Engine, build_id_of
from polymorph_engine.runtime.model import LoadedModel

__all__ = [
    "DEVICE_SCALE",
    "BenchSettings",
    "InProcessRunner",
    "describe_error",
    "fit_for_device",
    "run_experiment",
    "vocab_size_of",
]


@dataclass(frozen=True)
class BenchSettings:
    """How each experiment benchmarks: passes measured and discarded, and the prompt seed."""

    repeats: int = 3
    warmup: int = 1
    seed: int = 0


DEVICE_SCALE: dict[str, dict[str, int]] = {
    # A tiny model on CPU: an experiment takes tens of milliseconds.
    "cpu": {"max_requests": 8, "max_input": 32, "max_output": 8, "max_concurrency": 4},
    # One accelerator: tens of decode steps per pass (enough for ITL percentiles), so an
    # experiment on a plain 8B build takes about a second and a fast build far less.
    "cuda": {"max_requests": 8, "max_input": 128, "max_output": 16, "max_concurrency": 4},
}
"""Per device type, the caps ``fit_for_device`` applies to a workload (same for hot and cold)."""


def fit_for_device(workload: Workload, device: str, max_seq_len: int | None = None) -> Workload:
    """``workload`` scaled by ``DEVICE_SCALE`` for ``device`` (and so every request fits ``max_seq_len``)."""
    caps = dict(DEVICE_SCALE.get(torch.device(device).type, DEVICE_SCALE["cuda"]))
    if max_seq_len is not None:
        caps["max_input"] = max(1, min(caps["max_input"], max_seq_len // 2))
        caps["max_output"] = max(1, min(caps["max_output"], max_seq_len - caps["max_input"]))
    return fit_workload(workload, **caps)


def vocab_size_of(model: LoadedModel) -> int:
    """The vocabulary size of a loaded model."""
    return int(model.config.vocab_size)


def describe_error(exc: BaseException, build_dir: Path | None = None) -> str:
    """One line: ``Type: message`` plus the innermost frame in ``build_dir`` (``at file.py:12 in fn``)."""
    message = " ".join(str(exc).split()) or "(no message)"
    if len(message) > 400:
        message = message[:397] + "..."
    text = f"{type(exc).__name__}: {message}"
    if build_dir is not None:
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if Path(f.filename).resolve().is_relative_to(build_dir.resolve())
        ]
        if frames:
            frame = frames[-1]
            text += f" (at {Path(frame.filename).relative_to(build_dir.resolve())}:{frame.lineno} in {frame.name})"
    return text


def run_experiment(
    engine: Engine,
    build_dir: str | Path,
    workload: Workload,
    gates: Gates,
    golden: Golden,
    *,
    knobs: dict[str, Any] | None = None,
    description: str = "",
    settings: BenchSettings = BenchSettings(),
) -> ExperimentRecord:
    """Swap ``build_dir`` into ``engine``, verify and benchmark it; never raises for a bad build."""
    build_dir = Path(build_dir).resolve()
    started = time.perf_counter()
    timings = Timings()
    record = ExperimentRecord(
        build="", status="failed", workloadHash=workload.digest, description=description
    )
    try:
        record.build = build_id_of(build_dir)
        loaded = engine.load_build(build_dir, knobs)
        timings.loadS = loaded.load_s
        record.name, record.parent, record.knobs = loaded.name, loaded.parent, loaded.knobs
        if not description:
            record.description = loaded.spec.description
        device = engine.model.device
        t = time.perf_counter()
        record.verification = verify(loaded.hotpath, golden, gates, device=device)
        timings.verifyS = time.perf_counter() - t
        if not record.verification.passed:
            record.status = "rejected"
        else:
            t = time.perf_counter()
            record.figures = benchmark(
                loaded.hotpath,
                workload,
                settings.repeats,
                settings.warmup,
                vocab_size=vocab_size_of(engine.model),
                device=device,
                seed=settings.seed,
            )
            timings.benchS = time.perf_counter() - t
            record.status = "passed"
    except Exception as exc:
        record.status = "failed"
        record.error = describe_error(exc, build_dir)
        engine.unload()
    timings.totalS = time.perf_counter() - started
    record.timings = timings
    return record


class InProcessRunner:
    """A ``Runner`` (``polymorph.compile.runner``) in this process: no crash containment, no timeout. For trusted builds and tests."""

    def __init__(
        self,
        engine: Engine,
        workload: Workload,
        gates: Gates,
        golden: Golden,
        settings: BenchSettings = BenchSettings(),
    ) -> None:
        self.engine = engine
        self.workload = workload
        self.gates = gates
        self.golden = golden
        self.settings = settings

    def run(self, build_dir: Path, *, description: str = "") -> ExperimentRecord:
        return run_experiment(
            self.engine,
            build_dir,
            self.workload,
            self.gates,
            self.golden,
            description=description,
            settings=self.settings,
        )
