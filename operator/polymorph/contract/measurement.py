"""The measurement protocol ``polymorph compile`` and ``polymorph experiment`` share: flags, defaults
and the workload each experiment replays.

Both commands take ``--model``, ``--workload``, ``--device``, ``--dtype``, ``--repeats``,
``--seed``, ``--threads`` and ``--experiment-timeout`` from ``add_flags`` with the same defaults, and build
the replayed workload with ``campaign_workload``. So a build that a campaign measured is
measured the same way by ``polymorph experiment`` (the report's "run again" line, see
``rerun_command``): same requests, same threads, same passes, paired with the same baseline.

It knows nothing about engines or agents; it only defines the inputs.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from polymorph.contract.api import WorkloadProfile
from polymorph.contract.inputs import duration, integer
from polymorph.contract.workload import (
    DEFAULT_WORKLOAD,
    Workload,
    fit_workload,
    read_workload,
    workload_from_profile,
)

__all__ = [
    "CPU_SCALE",
    "DEFAULT_EXPERIMENT_TIMEOUT",
    "DEFAULT_REPEATS",
    "MAX_REPEATS",
    "MAX_TENSOR_PARALLEL",
    "MAX_THREADS",
    "CampaignWorkload",
    "add_flags",
    "add_tensor_parallel",
    "campaign_workload",
    "rerun_command",
    "worker_threads",
]

MAX_THREADS = 4096
"""The most torch CPU threads a worker may be asked for (more overflows torch's C++ int)."""
DEFAULT_REPEATS = 5
"""Measured passes per experiment (at least 2, so the noise can be measured)."""
MAX_REPEATS = 1000
DEFAULT_EXPERIMENT_TIMEOUT = "2m"

CPU_SCALE = {"max_requests": 16, "max_input": 64, "max_output": 32, "max_concurrency": 4}
"""Caps for the replayed workload on CPU. Passes are several times longer than the hot-vs-cold
benchmark's (``experiment.DEVICE_SCALE``), so a scheduling hiccup on a shared machine is a small
fraction of a pass and a real speedup stands out of the noise; an experiment still takes well
under a second on ``tiny``."""


MAX_TENSOR_PARALLEL = 64
"""Ranks ``--tensor-parallel`` takes at most (the GPUs one node can hold, with room)."""


def add_tensor_parallel(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str) -> None:
    """``--tensor-parallel N`` as every command that runs an engine takes it; ``help`` says where the ranks run."""
    parser.add_argument(
        "--tensor-parallel", type=integer(1, MAX_TENSOR_PARALLEL), default=1, metavar="N", help=help
    )


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The measurement flags, with the defaults both commands share."""
    parser.add_argument(
        "--model",
        default="tiny",
        help="model shape (tiny, llama-1b, ...) or checkpoint directory (default: tiny)",
    )
    parser.add_argument(
        "--workload",
        metavar="FILE",
        help="a WorkloadProfile YAML/JSON or a .jsonl trace (default: the sample profile)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (default: float32)")
    parser.add_argument(
        "--experiment-timeout",
        type=duration(),
        default=DEFAULT_EXPERIMENT_TIMEOUT,
        metavar="DURATION",
        help=f"per experiment, e.g. 90s or 10m; a hung build is killed after it (default: {DEFAULT_EXPERIMENT_TIMEOUT})",
    )
    parser.add_argument(
        "--repeats",
        type=integer(2, MAX_REPEATS),
        default=DEFAULT_REPEATS,
        help="least measured benchmark passes (pairs when paired) per experiment, at least 2 so the "
        f"noise can be measured (default: {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--seed",
        type=integer(0),
        default=0,
        help="seed for random weights, the workload's sample of a profile and the prompts (default: 0)",
    )
    add_tensor_parallel(
        parser,
        "shard the model over N ranks in the engine worker: N GPUs of this node (cuda), or N "
        "processes (cpu); each build is loaded, verified and measured on all of them (default: 1)",
    )
    parser.add_argument(
        "--threads",
        type=integer(1, MAX_THREADS),
        help="torch CPU threads in the engine worker (default: 1 with --device cpu, where one thread keeps "
        "a small model's timings steady on a shared machine; torch's default otherwise)",
    )


def worker_threads(threads: int | None, device: str) -> int | None:
    """The worker's torch threads: ``--threads``, else 1 on a CPU and torch's default elsewhere."""
    return threads if threads is not None else (1 if device == "cpu" else None)


@dataclass(frozen=True)
class CampaignWorkload:
    """What each experiment replays, and the profile it came from."""

    workload: Workload
    profile: WorkloadProfile
    scale_note: str | None
    """What the CPU scaling changed, in one line (None when nothing)."""
    fit_on_device: bool
    """Whether the worker still fits it to its device (accelerators; CPU workloads are fitted here)."""


def campaign_workload(path: str | None, device: str, seed: int = 0) -> CampaignWorkload:
    """The workload file at ``path`` (or the sample), fitted with ``CPU_SCALE`` on a CPU."""
    if path is None:
        workload, profile = workload_from_profile(DEFAULT_WORKLOAD, seed=seed), DEFAULT_WORKLOAD
    else:
        workload, profile = read_workload(path, seed=seed)  # bounded; UsageError naming the file
    if device != "cpu":
        return CampaignWorkload(workload, profile, None, True)
    fitted = fit_workload(workload, **CPU_SCALE)
    return CampaignWorkload(fitted, profile, _scale_note(workload, fitted), False)


def _scale_note(before: Workload, after: Workload) -> str | None:
    """What the CPU scaling changed, in one line, or None when it changed nothing."""
    changed = (
        len(after.requests) != len(before.requests)
        or after.concurrency != before.concurrency
        or after.requests != before.requests[: len(after.requests)]
    )
    if not changed:
        return None

    def shape(w: Workload) -> str:
        longest_in = max(r.input_tokens for r in w.requests)
        longest_out = max(r.output_tokens for r in w.requests)
        return f"{len(w.requests)} requests, prompts <= {longest_in}, outputs <= {longest_out}, concurrency {w.concurrency}"

    return f"workload scaled down for --device cpu: {shape(before)} -> {shape(after)}"


def rerun_command(
    *,
    build: str,
    against: str,
    model: str,
    device: str,
    dtype: str,
    workload: str | None,
    repeats: int,
    threads: int | None,
    store: str | None,
    seed: int = 0,
    tensor_parallel: int = 1,
) -> str:
    """The ``polymorph experiment`` line that measures ``build`` paired with ``against`` as a campaign did."""
    argv: list[str] = ["polymorph", "experiment", "--build", build, "--against", against]
    flags: Sequence[tuple[str, str | None, str | None]] = (
        ("--model", model, "tiny"),
        ("--device", device, "cpu"),
        ("--dtype", dtype, "float32"),
        ("--workload", workload, None),
        ("--repeats", str(repeats), str(DEFAULT_REPEATS)),
        ("--threads", None if threads is None else str(threads), None),
        ("--store", store, None),
        ("--seed", str(seed), "0"),
        ("--tensor-parallel", str(tensor_parallel), "1"),
    )
    for flag, value, default in flags:
        if value is not None and value != default:
            argv += [flag, value]
    return shlex.join(argv)
