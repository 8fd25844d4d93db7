"""``polymorph engine serve``: load a model and a build, then serve completions over HTTP until SIGTERM.

``--build`` is a build directory, ``reference`` (the build shipped in the image), or a build id
``sha256:<64 hex>`` fetched from ``--store`` and hash-verified (a tampered archive is refused).
With ``--trace-sample-rate F > 0`` a fraction F of requests' shapes (lengths and arrival
times, never content) are written to ``--store`` under
``workloads/<namespace>/<model deployment>/trace-<ts>.jsonl`` every ``--trace-flush-interval``
and on shutdown; the store is written once before the model loads, so one the engine cannot
write is refused at start-up, and a write that fails later is counted in ``/metrics`` and shown
in ``/readyz``. SIGTERM or SIGINT stop accepting, let running requests finish (for up to
``--shutdown-grace``), flush the trace and exit 0, or 1 when traces were lost. Flags take the
types of ``polymorph.contract.inputs`` (durations, bounded numbers, names): a bad one exits 2 with one
sentence; the port is bound before the model loads, so a taken one is refused at once. At most
``--max-batch`` + ``--max-queue`` requests are admitted at once; more get 503 with Retry-After.
``--tensor-parallel N`` serves the model sharded over N ranks (``runtime.parallel``: N GPUs of
this node, or N processes on a CPU); this process is rank 0. A rank that fails on its own stops
the server: it exits 1 with one line naming the rank (the pod restarts).

This module only gathers inputs and wires the pieces together (model, build, ``server``,
``metrics``, ``trace``); it holds no serving logic of its own.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from polymorph.contract.builds import resolve_build_arg
from polymorph.contract.errors import BuildError, StoreError, UsageError
from polymorph.contract.inputs import duration, integer, name, number
from polymorph.contract.measurement import add_tensor_parallel
from polymorph.contract.store import Store, build_id, check_writable, open_store, workload_prefix
from polymorph.contract.workload import MAX_SERVING_BATCH, SERVING_MAX_BATCH
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel
from polymorph_engine.runtime.parallel import DEFAULT_TIMEOUT_S, Leader, launch
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import EngineServer
from polymorph_engine.serving.service import DEFAULT_MAX_QUEUE, CompletionService
from polymorph_engine.serving.signals import StopSignals
from polymorph_engine.serving.trace import TraceSampler, flush_trace

__all__ = ["configure", "run"]

DEFAULT_MAX_SEQ_LEN = 8192


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="engine_command", metavar="SUBCOMMAND")
    serve = sub.add_parser(
        "serve",
        help="serve OpenAI-compatible completions with one build",
        description="Serve OpenAI-compatible /v1/completions, /v1/models, /healthz, /readyz and /metrics.",
    )
    serve.add_argument(
        "--model", required=True, help="model shape (tiny, llama-1b, ...) or checkpoint directory (required)"
    )
    serve.add_argument(
        "--build",
        default="reference",
        metavar="DIR_OR_ID",
        help="a build directory, 'reference', or sha256:<hex> from --store (default: reference)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=integer(0, 65535),
        default=8000,
        help="port to listen on, 0 for any free one (default: 8000)",
    )
    serve.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    serve.add_argument(
        "--dtype",
        default="auto",
        help="float32, bfloat16, float16, or auto: float32 on cpu, else bfloat16 (default: auto)",
    )
    serve.add_argument(
        "--max-batch",
        type=integer(1, MAX_SERVING_BATCH),
        default=SERVING_MAX_BATCH,
        help=f"requests decoded together (default: {SERVING_MAX_BATCH})",
    )
    serve.add_argument(
        "--max-queue",
        type=integer(0, MAX_QUEUE),
        default=DEFAULT_MAX_QUEUE,
        help=f"requests admitted beyond the batch, waiting for a slot; more get 503 (default: {DEFAULT_MAX_QUEUE})",
    )
    serve.add_argument(
        "--max-seq-len",
        type=integer(2, MAX_SEQ_LEN),
        default=None,
        help=f"tokens per sequence, prompt included (default: the model's, at most {DEFAULT_MAX_SEQ_LEN})",
    )
    serve.add_argument(
        "--model-deployment",
        type=name("a ModelDeployment name"),
        default=os.environ.get("POLYMORPH_MODEL_DEPLOYMENT") or None,
        metavar="NAME",
        help="ModelDeployment name: a served model name and the model_deployment metric label "
        "(default: $POLYMORPH_MODEL_DEPLOYMENT, else none)",
    )
    serve.add_argument(
        "--track",
        metavar="stable|canary",
        default=os.environ.get("POLYMORPH_TRACK", "stable"),
        help="the track metric label the rollout analysis compares (default: $POLYMORPH_TRACK, else stable)",
    )
    serve.add_argument(
        "--namespace",
        type=name("a namespace name"),
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace for trace keys (default: $POD_NAMESPACE, else default)",
    )
    serve.add_argument(
        "--store",
        metavar="PATH_OR_URI",
        help="artifact store for build ids and traces; checked writable when traces are sampled (default: none)",
    )
    serve.add_argument(
        "--trace-sample-rate",
        type=number(0, 1),
        default=0.0,
        metavar="F",
        help="fraction of requests whose shape is traced, 0 to 1; needs --store (default: 0: none)",
    )
    serve.add_argument(
        "--trace-flush-interval",
        type=duration(),
        default="5m",
        metavar="DURATION",
        help="time between trace writes to --store (default: 5m)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=duration(),
        default="30s",
        metavar="DURATION",
        help="how long running requests may finish on SIGTERM (default: 30s)",
    )
    serve.add_argument(
        "--seed",
        type=integer(0, 2**63 - 1),
        default=0,
        help="seed for random weights of shape models (default: 0)",
    )
    add_tensor_parallel(
        serve,
        "shard the model over N ranks: N GPUs of this node (cuda), or N processes (cpu) (default: 1)",
    )
    serve.add_argument(
        "--rank-timeout",
        type=duration(),
        default=f"{DEFAULT_TIMEOUT_S:g}s",
        metavar="DURATION",
        help="with --tensor-parallel: how long a rank may lag before it is called hung (default: 5m)",
    )
    serve.add_argument(
        "--build-cache",
        metavar="DIR",
        help="where builds fetched from --store are unpacked (default: a temporary directory)",
    )


MAX_QUEUE = 1_000_000
MAX_SEQ_LEN = 1 << 20


def run(args: argparse.Namespace) -> int:
    if getattr(args, "engine_command", None) != "serve":
        raise UsageError("polymorph engine needs a subcommand: serve (see polymorph engine serve --help).")
    _check_flags(args)

    store = _open_store(args.store) if args.store or args.build.startswith("sha256:") else None
    if store is not None and args.trace_sample_rate > 0:  # a trace it cannot write is refused now
        check_writable(store, "--store", args.store, prefix=workload_prefix(args.namespace, _md(args)))
    try:  # the port is taken before the model loads, so a bad one costs nothing
        server = EngineServer(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}.") from None
    cache = Path(args.build_cache) if args.build_cache else Path(tempfile.mkdtemp(prefix="polymorph-builds-"))
    build_dir, build = _resolve_build(args.build, store, cache)
    dtype = ("float32" if args.device == "cpu" else "bfloat16") if args.dtype == "auto" else args.dtype
    model = _load(args, dtype)
    leader: Leader | None = model.shard.leader if model.shard is not None else None
    max_seq_len = args.max_seq_len or min(model.config.max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    try:
        hotpath, _, _ = load_hotpath(model, build_dir)
    except BuildError as exc:
        _close(leader)
        raise UsageError(f"--build {args.build}: {exc}") from None
    except Exception as exc:  # a build's load() raising is a bad build, not an engine bug
        _close(leader)
        raise UsageError(f"--build {args.build}: its load() failed: {type(exc).__name__}: {exc}.") from None
    sampler = TraceSampler(args.trace_sample_rate) if args.trace_sample_rate > 0 else None
    metrics = ServerMetrics(build, args.model_deployment or "", args.track)
    if sampler is not None:
        metrics.trace_enabled()
    names = [n for n in (args.model_deployment, args.model) if n]
    service = CompletionService(
        hotpath,
        build_id=build,
        tokenizer=model.tokenizer,
        vocab_size=model.config.vocab_size,
        eos_id=model.tokenizer.eos_id,
        max_batch=args.max_batch,
        max_seq_len=max_seq_len,
        model_names=list(dict.fromkeys(names)),
        metrics=metrics,
        trace=sampler,
        device=str(model.device),
        max_queue=args.max_queue,
    )
    server.service = service
    flusher = _TraceFlusher(sampler, store, args.namespace, _md(args), metrics)
    stop = StopSignals()
    logging.basicConfig(level=logging.INFO, format="polymorph engine: %(message)s", stream=sys.stderr)
    try:
        server.start(grace_s=args.shutdown_grace)
        flusher.start(args.trace_flush_interval)
        print(
            f"polymorph engine: serving {args.model} with build {build} on {server.url}",
            file=sys.stderr,
            flush=True,
        )
        if leader is not None:
            _watch(leader, stop)
        stop.wait()
    finally:
        broken = leader.broken if leader is not None else None
        service.close(
            grace_s=0 if broken else args.shutdown_grace
        )  # readyz turns 503; admitted requests finish
        server.close()  # streams write their last events, then the socket goes
        flusher.stop()
        if broken is None:
            hotpath.close()
        _close(leader)
    if broken is not None:
        print(f"polymorph engine: stopped: {broken}", file=sys.stderr, flush=True)
        return 1
    dropped = metrics.trace_counts().get("dropped", 0)
    if dropped:
        print(
            f"polymorph engine: stopped; the traces of {dropped} sampled requests could not be written "
            f"to {store.uri if store else '--store'} (last error: {metrics.trace_error})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print("polymorph engine: stopped", file=sys.stderr, flush=True)
    return 0


def _load(args: argparse.Namespace, dtype: str) -> LoadedModel:
    """The model, or with --tensor-parallel N > 1 rank 0's shard of it (the other ranks started)."""
    if args.tensor_parallel == 1:
        return load_model(args.model, device=args.device, dtype=dtype, seed=args.seed)
    return launch(
        args.model,
        world=args.tensor_parallel,
        device=args.device,
        dtype=dtype,
        seed=args.seed,
        timeout_s=args.rank_timeout,
    )


def _watch(leader: Leader, stop: StopSignals) -> None:
    """Stop the server once a rank has failed: every later step would fail too."""

    def loop() -> None:
        while leader.broken is None:
            time.sleep(0.2)
        stop.stop()

    threading.Thread(target=loop, name="polymorph-ranks", daemon=True).start()


def _close(leader: Leader | None) -> None:
    if leader is not None:
        leader.close()


def _md(args: argparse.Namespace) -> str:
    """The ModelDeployment a trace is filed under."""
    return str(args.model_deployment or "default")


def _check_flags(args: argparse.Namespace) -> None:
    """What argparse's types cannot see alone: flags that depend on each other, and defaults from
    the environment (argparse checks no default against ``choices``)."""
    if args.track not in ("stable", "canary"):
        raise UsageError(
            f"--track must be stable or canary (also in $POLYMORPH_TRACK), got {args.track[:40]!r}."
        )
    if args.trace_sample_rate > 0 and not args.store:
        raise UsageError("--trace-sample-rate needs --store, where the trace is written.")


def _open_store(uri: str | None) -> Store:
    try:
        return open_store(uri)
    except StoreError as exc:
        raise UsageError(f"--store {uri}: {exc}") from None


def _resolve_build(arg: str, store: Store | None, cache: Path) -> tuple[Path, str]:
    """The build directory to serve and its id; store builds are fetched and hash-verified."""

    def the_store() -> Store:  # asked for only for a build id, and then the store was opened
        assert store is not None
        return store

    path = resolve_build_arg(arg, "--build", the_store, cache)
    return path, arg if arg.startswith("sha256:") else build_id(path)


class _TraceFlusher:
    """Flushes the sampled trace to the store on an interval and once more at ``stop()``."""

    def __init__(
        self,
        sampler: TraceSampler | None,
        store: Store | None,
        namespace: str,
        model_deployment: str,
        metrics: ServerMetrics,
    ) -> None:
        self.metrics = metrics
        self.sampler = sampler
        self.store = store
        self.namespace = namespace
        self.model_deployment = model_deployment
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def flush(self) -> str | None:
        if self.sampler is None or self.store is None:
            return None
        kept = len(self.sampler)
        try:
            key = flush_trace(self.sampler, self.store, self.namespace, self.model_deployment)
        except (StoreError, OSError) as exc:  # losing one trace batch must not stop serving
            reason = f"{type(exc).__name__}: {exc}"[:300]
            self.metrics.trace_written(kept, error=reason)  # /metrics and /readyz show the loss
            print(
                f"polymorph engine: could not write the traces of {kept} sampled requests: {reason}",
                file=sys.stderr,
                flush=True,
            )
            return None
        if key is not None:
            self.metrics.trace_written(kept)
        return key

    def start(self, interval_s: float) -> None:
        if self.sampler is None:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.flush()

        self._thread = threading.Thread(target=loop, name="polymorph-trace", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
