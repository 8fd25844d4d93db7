"""The supervised worker: the child process a ``supervisor.Supervisor`` spawns.

It imports the engine (torch with it), loads the model once, computes the golden outputs, and
then answers each ``messages.Run`` with one experiment (``run.run_experiment`` in a hot
``Engine``, the baseline held in a ``pairing.BaselineSlot``) until ``messages.Stop``. With
``tensor_parallel`` N > 1 it is rank 0 of N (``runtime.parallel.launch``): every build it loads
is loaded on every rank, and one that fails alone ends the worker. Only the child imports this
module: the parent stays free of torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from polymorph.contract.api import Gates
from polymorph.contract.api.build import Verification
from polymorph.contract.errors import UsageError
from polymorph.contract.workload import Workload
from polymorph_engine.experiment.messages import (
    ParentMessage,
    Ready,
    Recorded,
    Run,
    StartFailed,
    WorkerConfig,
)
from polymorph_engine.experiment.pairing import BaselineSlot
from polymorph_engine.experiment.run import fit_for_device, run_experiment, scale_note, vocab_size_of
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.verify import Golden, default_prompts, golden
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.hotreload import Engine
from polymorph_engine.runtime.parallel import Leader, launch

__all__ = ["compile_cache_dir", "worker_loop"]


def compile_cache_dir() -> Path:
    """Where torch.compile (and Triton, in ``triton/`` under it unless ``$TRITON_CACHE_DIR`` is set)
    keeps its artifacts across experiments, worker restarts and campaigns:
    ``$TORCHINDUCTOR_CACHE_DIR`` when set, else ``$POLYMORPH_COMPILE_CACHE``, else
    ``$XDG_CACHE_HOME/polymorph/inductor`` (``~/.cache``). A candidate whose compilation ran past
    the experiment timeout keeps what it compiled there, so its retry starts warm."""
    for name in ("TORCHINDUCTOR_CACHE_DIR", "POLYMORPH_COMPILE_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "polymorph" / "inductor"


def worker_loop(conn: Connection, config: WorkerConfig) -> None:
    """The child: load once (``Ready``), then answer each ``Run`` with its ``Recorded`` until ``Stop``."""
    os.dup2(2, 1)  # a build's print() must never reach the parent's stdout
    try:
        started = time.perf_counter()
        cache = compile_cache_dir()
        with contextlib.suppress(OSError):  # unwritable: inductor falls back to its own temp dir
            cache.mkdir(parents=True, exist_ok=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
            # Triton's own kernels and tuned tiles (a build's Triton kernels) beside inductor's.
            os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))

        if config.threads is not None:
            torch.set_num_threads(config.threads)

        if config.tensor_parallel > 1:  # this process is rank 0; the others start here
            model = launch(
                config.model_source,
                world=config.tensor_parallel,
                device=config.device,
                dtype=config.dtype,
                seed=config.seed,
                timeout_s=config.rank_timeout,
                threads=config.threads,
            )
        else:
            model = load_model(
                config.model_source, device=config.device, dtype=config.dtype, seed=config.seed
            )
        leader = model.shard.leader if model.shard is not None else None
        max_seq_len = model.config.max_position_embeddings
        workload = config.workload
        settings = config.settings
        if config.fit:
            workload = fit_for_device(config.workload, config.device, max_seq_len, settings)
            note = scale_note(config.workload, workload, config.device)
            settings = dataclasses.replace(settings, scaled=settings.scaled or note)
        prompts = default_prompts(vocab_size_of(model), config.verify_prompts)
        reference = golden(model, prompts, config.verify_steps)
        engine = Engine(model)
        slot = BaselineSlot(model)
        verified: dict[str, Verification] = {}  # this worker's golden outputs: a restart verifies again
        gates = Gates.model_validate(config.gates)
        conn.send(Ready(time.perf_counter() - started))
    except UsageError as exc:  # a bad model source, device or dtype: already one sentence
        conn.send(StartFailed(str(exc)))
        return
    except Exception as exc:
        conn.send(StartFailed(f"{type(exc).__name__}: {exc}"))
        return
    try:
        _serve(conn, engine, slot, leader, workload, gates, reference, settings, verified)
    finally:
        if leader is not None:
            leader.close()


def _serve(
    conn: Connection,
    engine: Engine,
    slot: BaselineSlot,
    leader: Leader | None,
    workload: Workload,
    gates: Gates,
    reference: Golden,
    settings: BenchSettings,
    verified: dict[str, Verification],
) -> None:
    """Answer each ``Run`` until ``Stop``; after a tensor-parallel rank failed on its own, the
    record is ``crashed``, naming the rank, and the worker ends (the supervisor restarts it)."""
    while True:
        try:
            message: ParentMessage = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if not isinstance(message, Run):  # Stop
            slot.close()
            engine.close()
            return
        record = run_experiment(
            engine,
            message.build_dir,
            workload,
            gates,
            reference,
            description=message.description,
            settings=settings,
            against=message.against,
            slot=slot,
            screen=message.screen,
            verified=verified,
        )
        if leader is not None and leader.broken is not None:
            record.status = "crashed"
            record.error = f"{leader.broken}; the worker will be restarted"
            conn.send(Recorded(record.model_dump_json()))
            return
        conn.send(Recorded(record.model_dump_json()))
