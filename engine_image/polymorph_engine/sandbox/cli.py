"""``polymorph sandbox engine``: the untrusted container of a CompileJob sandbox pod.

It runs agent-written builds and needs no secrets: it loads the model once into a supervised
worker (``experiment.supervisor.Supervisor``) and serves the admin API
(``sandbox.admin.serve_admin``) on 127.0.0.1 only, until SIGTERM or SIGINT. The port is bound
before the model loads, so a taken or impossible one is a one-line error at once. The workload, gates and
experiment timeout come from the CompileJob spec (read by ``polymorph.contract.job``, as the agent
container reads it); the model from ``--model`` or ``spec.model``. Every benchmark cache has the
shape the deployment's engines serve at: ``--max-batch`` slots (the operator passes the batch of
their ``spec.engine.args``) and ``--max-seq-len`` positions (default ``spec.model.maxSeqLen``).

It only gathers inputs and wires the supervisor and the admin server together.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polymorph.contract.api import parse_duration
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import integer
from polymorph.contract.job import SPEC_ENV, read_compilejob, workload_identity
from polymorph.contract.measurement import DEFAULT_REPEATS, MAX_REPEATS, add_tensor_parallel
from polymorph.contract.runner import baseline_timeout
from polymorph.contract.workload import (
    DEFAULT_WORKLOAD,
    MAX_REQUEST_TOKENS,
    MAX_SERVING_BATCH,
    load_workload,
    workload_from_profile,
)
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.supervisor import Supervisor, WorkerStartError
from polymorph_engine.sandbox.admin import serve_admin
from polymorph_engine.serving.signals import StopSignals

__all__ = ["DEFAULT_PORT", "configure", "run"]

DEFAULT_PORT = 8471
"""The admin port on 127.0.0.1 (``polymorph sandbox agent --engine-url`` defaults to it)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", metavar="FILE", help=f"the CompileJob, JSON or YAML (default: ${SPEC_ENV})")
    parser.add_argument("--model", help="model shape or checkpoint dir (default: spec.model.uri)")
    parser.add_argument("--workload", metavar="FILE", help="workload file overriding spec.workload")
    parser.add_argument(
        "--port",
        type=integer(1, 65535),
        default=DEFAULT_PORT,
        help=f"admin port on 127.0.0.1 (default: {DEFAULT_PORT})",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    parser.add_argument(
        "--dtype", help="float32, bfloat16 or float16 (default: spec.model.dtype, else float32)"
    )
    parser.add_argument(
        "--repeats",
        type=integer(2, MAX_REPEATS),
        default=DEFAULT_REPEATS,
        help=f"least measured benchmark passes per experiment, at least 2 (default: {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--max-batch",
        type=integer(1, MAX_SERVING_BATCH),
        help="the batch the deployment's engines decode (their --max-batch): every benchmark cache has "
        "these slots (default: the workload's concurrency)",
    )
    parser.add_argument(
        "--max-seq-len",
        type=integer(1, MAX_REQUEST_TOKENS),
        help="the sequence length the deployment's engines allocate (their --max-seq-len): every "
        "benchmark cache has it (default: spec.model.maxSeqLen, else the workload's longest request)",
    )
    add_tensor_parallel(
        parser,
        "shard the model over N ranks: the N GPUs of this pod (spec.hardware.count) (default: 1)",
    )
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="writable scratch folder for unpacked builds (default: a temporary one)",
    )


def run(args: argparse.Namespace) -> int:

    spec, _ = read_compilejob(args.spec)
    model = args.model or (spec.model.uri if spec.model is not None else None)
    if not model:
        raise UsageError("the engine needs a model: pass --model, or give the CompileJob spec.model")
    dtype = args.dtype or (spec.model.dtype if spec.model is not None else "float32")
    if args.workload:
        workload = load_workload(args.workload)
    elif spec.workload is not None and spec.workload.traceUri:
        if "://" in spec.workload.traceUri:
            raise UsageError(
                f"the engine cannot fetch spec.workload.traceUri {spec.workload.traceUri!r} (it holds no credentials); "
                "mount the trace and pass --workload"
            )
        workload = load_workload(spec.workload.traceUri)
    else:
        profile, _ = workload_identity(spec)
        workload = workload_from_profile(profile or DEFAULT_WORKLOAD)  # profile is None only for traces
    supervisor = Supervisor(
        model,
        device=args.device,
        dtype=dtype,
        workload=workload,
        gates=spec.gates,
        experiment_timeout=parse_duration(spec.budget.experimentTimeout),
        baseline_timeout=baseline_timeout(parse_duration(spec.budget.experimentTimeout)),
        # Every benchmark cache has the shape the winner will serve at, as the deployment's pods
        # allocate theirs.
        settings=BenchSettings(
            repeats=args.repeats,
            cache_slots=args.max_batch,
            cache_len=args.max_seq_len or (spec.model.maxSeqLen if spec.model is not None else None),
        ),
        tensor_parallel=args.tensor_parallel,
    )
    workdir = Path(args.workdir) if args.workdir else None
    # The port is bound before the model loads, so a taken one is refused in a moment, not after it.
    server = serve_admin(supervisor, "127.0.0.1", args.port, workdir=workdir)
    stop = StopSignals()
    try:
        try:
            supervisor.start()
        except WorkerStartError as exc:
            raise UsageError(str(exc)) from None
        server.start()
        print(
            f"polymorph sandbox engine: admin API on http://127.0.0.1:{args.port}",
            file=sys.stderr,
            flush=True,
        )
        stop.wait()
    finally:
        server.close()
        supervisor.close()
    return 0
