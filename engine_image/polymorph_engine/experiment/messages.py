"""What a ``supervisor.Supervisor`` and its ``worker`` child say to each other, pickled over a pipe.

At spawn the parent hands the child a ``WorkerConfig``. The child answers ``Ready`` once the
model and the golden outputs are loaded, or ``StartFailed`` with one sentence. Then each ``Run``
gets one ``Recorded`` (the experiment's record as JSON), until ``Stop``.

Plain dataclasses, torch-free: both sides import this module, and neither imports the other for
its types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polymorph.contract.workload import Workload
from polymorph_engine.experiment.settings import BenchSettings

__all__ = [
    "ParentMessage",
    "Ready",
    "Recorded",
    "Run",
    "StartFailed",
    "Stop",
    "WorkerConfig",
    "WorkerMessage",
]


@dataclass(frozen=True)
class WorkerConfig:
    """What the parent sends its worker at spawn: the model, workload, gates and settings."""

    model_source: str
    device: str
    dtype: str
    seed: int
    workload: Workload
    gates: dict[str, Any]
    settings: BenchSettings
    verify_prompts: int
    verify_steps: int
    fit: bool
    threads: int | None
    tensor_parallel: int = 1  # ranks the worker shards the model over (runtime.parallel)
    rank_timeout: float = 300.0  # seconds a rank may lag before it is called hung


# --- parent to child ------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Run one experiment: ``build_dir`` paired with ``against`` (None: alone), ``screen``: the short protocol."""

    build_dir: str
    description: str
    against: str | None
    screen: bool


@dataclass(frozen=True)
class Stop:
    """Close the engine and exit."""


ParentMessage = Run | Stop


# --- child to parent ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The model and the golden outputs are loaded, in ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class StartFailed:
    """The model could not be loaded; ``reason`` is one sentence."""

    reason: str


@dataclass(frozen=True)
class Recorded:
    """One experiment's ``ExperimentRecord``, as JSON."""

    record_json: str


WorkerMessage = Ready | StartFailed | Recorded
