"""``polymorph engine serve``: load a model and a build, then serve completions over HTTP until SIGTERM.

``--build`` is a build directory, ``reference`` (the build shipped in the image), or a build id
``sha256:<64 hex>`` fetched from ``--store`` and hash-verified (a tampered archive is refused).
With ``--trace-sample-rate F > 0`` a fraction F of requests' shapes (lengths and arrival
times, never content) are written to ``--store`` under
``workloads/<namespace>/<model deployment>/trace-<ts>.jsonl`` every ``--trace-flush-interval``
seconds and on shutdown. SIGTERM or SIGINT stop accepting, let running requests finish (up
to ``--shutdown-grace`` seconds), flush the trace and exit 0. Bad flags exit 2 with one sentence;
the port is bound before the model loads, so a taken one is refused at once. At most
``--max-batch`` + ``--max-queue`` requests are admitted at once; more get 503 with Retry-After.

This module only gathers inputs and wires the pieces together (model, build, ``server``,
``metrics``, ``trace``); it holds no serving logic of its own.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from polymorph.builds import resolve_build_arg
from polymorph.errors import BuildError, StoreError, UsageError
from polymorph.store import Store, build_id, open_store
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import EngineServer
from polymorph_engine.serving.service import DEFAULT_MAX_QUEUE, CompletionService
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
        "--model", required=True, help="model shape (tiny, llama-1b, ...) or checkpoint directory"
    )
    serve.add_argument(
        "--build",
        default="reference",
        metavar="DIR_OR_ID",
        help="a build directory, 'reference', or sha256:<hex>",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    serve.add_argument("--dtype", default="auto", help="float32, bfloat16, float16, or auto (float32 on cpu)")
    serve.add_argument("--max-batch", type=int, default=8, help="requests decoded together (default 8)")
    serve.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help=f"requests admitted beyond the batch, waiting for a slot; more get 503 (default {DEFAULT_MAX_QUEUE})",
    )
    serve.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help=f"tokens per sequence, prompt included (default: the model's, at most {DEFAULT_MAX_SEQ_LEN})",
    )
    serve.add_argument(
        "--model-deployment",
        default=os.environ.get("POLYMORPH_MODEL_DEPLOYMENT", ""),
        metavar="NAME",
        help="ModelDeployment name: a served model name and the model_deployment metric label",
    )
    serve.add_argument(
        "--track",
        default=os.environ.get("POLYMORPH_TRACK", "stable"),
        help="stable or canary: the track metric label the rollout analysis compares (default $POLYMORPH_TRACK or stable)",
    )
    serve.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace for trace keys (default $POD_NAMESPACE or 'default')",
    )
    serve.add_argument("--store", metavar="PATH_OR_URI", help="artifact store for build ids and traces")
    serve.add_argument(
        "--trace-sample-rate", type=float, default=0.0, metavar="F", help="fraction of requests traced (0..1)"
    )
    serve.add_argument(
        "--trace-flush-interval", type=float, default=300.0, metavar="S", help="seconds between trace flushes"
    )
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds running requests get on SIGTERM",
    )
    serve.add_argument("--seed", type=int, default=0, help="seed for random weights (shape models)")
    serve.add_argument("--build-cache", metavar="DIR", help="where builds fetched from --store are unpacked")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "engine_command", None) != "serve":
        raise UsageError("polymorph engine needs a subcommand: serve (see polymorph engine serve --help).")
    _check_flags(args)

    store = _open_store(args.store) if args.store or args.build.startswith("sha256:") else None
    try:  # the port is taken before the model loads, so a bad one costs nothing
        server = EngineServer(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}.") from None
    cache = Path(args.build_cache) if args.build_cache else Path(tempfile.mkdtemp(prefix="polymorph-builds-"))
    build_dir, build = _resolve_build(args.build, store, cache)
    dtype = ("float32" if args.device == "cpu" else "bfloat16") if args.dtype == "auto" else args.dtype
    model = load_model(args.model, device=args.device, dtype=dtype, seed=args.seed)
    max_seq_len = args.max_seq_len or min(model.config.max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    try:
        hotpath, _, _ = load_hotpath(model, build_dir)
    except BuildError as exc:
        raise UsageError(f"--build {args.build}: {exc}") from None
    except Exception as exc:  # a build's load() raising is a bad build, not an engine bug
        raise UsageError(f"--build {args.build}: its load() failed: {type(exc).__name__}: {exc}.") from None
    sampler = TraceSampler(args.trace_sample_rate) if args.trace_sample_rate > 0 else None
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
        metrics=ServerMetrics(build, args.model_deployment, args.track),
        trace=sampler,
        device=str(model.device),
        max_queue=args.max_queue,
    )
    server.service = service
    flusher = _TraceFlusher(sampler, store, args.namespace, args.model_deployment or "default")
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.basicConfig(level=logging.INFO, format="polymorph engine: %(message)s", stream=sys.stderr)
    try:
        server.start(grace_s=args.shutdown_grace)
        flusher.start(args.trace_flush_interval)
        print(
            f"polymorph engine: serving {args.model} with build {build} on {server.url}",
            file=sys.stderr,
            flush=True,
        )
        while not stopping.wait(0.5):
            pass
    finally:
        service.close(grace_s=args.shutdown_grace)  # readyz turns 503; admitted requests finish
        server.close()  # streams write their last events, then the socket goes
        flusher.stop()
        hotpath.close()
    print("polymorph engine: stopped", file=sys.stderr, flush=True)
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536 and args.port != 0:
        raise UsageError(f"--port must be from 1 to 65535, got {args.port}.")
    if args.track not in ("stable", "canary"):
        raise UsageError(f"--track must be stable or canary, got {args.track!r}.")
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1, got {args.max_batch}.")
    if args.max_queue < 0:
        raise UsageError(f"--max-queue must be >= 0, got {args.max_queue}.")
    if args.max_seq_len is not None and args.max_seq_len < 2:
        raise UsageError(f"--max-seq-len must be at least 2, got {args.max_seq_len}.")
    for flag, value in (
        ("--trace-sample-rate", args.trace_sample_rate),
        ("--trace-flush-interval", args.trace_flush_interval),
        ("--shutdown-grace", args.shutdown_grace),
    ):
        if not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}.")
    if not 0.0 <= args.trace_sample_rate <= 1.0:
        raise UsageError(f"--trace-sample-rate must be between 0 and 1, got {args.trace_sample_rate}.")
    if args.trace_sample_rate > 0 and not args.store:
        raise UsageError("--trace-sample-rate needs --store, where the trace is written.")
    if not args.trace_flush_interval > 0:
        raise UsageError(f"--trace-flush-interval must be > 0 seconds, got {args.trace_flush_interval}.")
    if args.shutdown_grace < 0:
        raise UsageError(f"--shutdown-grace must be >= 0 seconds, got {args.shutdown_grace}.")


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
        self, sampler: TraceSampler | None, store: Store | None, namespace: str, model_deployment: str
    ) -> None:
        self.sampler = sampler
        self.store = store
        self.namespace = namespace
        self.model_deployment = model_deployment
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def flush(self) -> str | None:
        if self.sampler is None or self.store is None:
            return None
        try:
            return flush_trace(self.sampler, self.store, self.namespace, self.model_deployment)
        except (StoreError, OSError) as exc:  # losing one trace batch must not stop serving
            print(f"polymorph engine: could not write the traffic trace: {exc}", file=sys.stderr, flush=True)
            return None

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
