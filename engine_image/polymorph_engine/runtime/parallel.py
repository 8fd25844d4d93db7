"""Tensor parallelism on one node: one process per GPU (a rank), rank 0 the engine that the
scheduler, the HTTP server or an experiment drives, the other ranks its followers.

``launch(source, world=N, ...)`` loads the model in this process as rank 0 and starts ranks
1..N-1 (fresh interpreters, ``follower_main``), which load it too; every rank keeps its shard
(``shard_model``: Megatron's split, q/k/v and gate/up (and each expert's gate/up) by output rows,
that is by heads and by intermediate width, o and down by input columns; embeddings, norms,
routers and the head replicated). The build's model all-reduces the two partial sums of each
layer (``Shard.all_reduce``; ``builds/reference/model.py``). torch.distributed joins the ranks:
NCCL on CUDA (rank r on cuda:r), gloo on a CPU; a file rendezvous in a fresh temporary directory.

What the ranks say to each other besides the all-reduces goes over one socket pair per follower,
pickled tuples: rank 0's ``Leader`` sends each call (``load``, ``new_cache``, ``prefill``,
``decode``, ``free``, ``close``: small arguments, handles for hot paths and caches), and the
prompt or decode tokens follow as a broadcast on the process group, so tokens sampled on a GPU
stay there. ``sample`` is not mirrored: logits are replicated, and followers get their tokens
from that broadcast. Loading a build on rank 0 (``loader.load_hotpath``) loads it on every rank
and returns a ``ParallelHotPath``, the hot path that mirrors each call; so the engine, the
scheduler, verification and the benchmark run a tensor-parallel build as one engine.

Failures. A follower that raises reports the error at once and waits for the next call. When
rank 0's own call raises, or a follower reported, rank 0 settles the call: it asks every
follower how the call ended. The same exception on every rank (a build refusing its knobs, a
full cache) is raised as it is and the group goes on. Anything else (one rank raised, exited or
did not answer within ``timeout_s``, also every collective's timeout) is a ``RankFailed`` naming
the ranks; the group is then broken, its followers killed, and the owner ends the engine (the
experiment worker is restarted by its supervisor, a server exits). Followers die with rank 0
(``PR_SET_PDEATHSIG``). A successful decode costs rank 0 one pipe write and one poll per
follower: no answer is awaited.

Only rank 0 imports builds by its loader's route; followers load them with ``loader.load_local``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from polymorph.contract.builds import BuildDeclaration, KnobValue
from polymorph.contract.errors import UsageError
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.config import ModelConfig
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.loader import load_local
from polymorph_engine.runtime.model import LoadedModel, Shard, moe_names

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Leader",
    "ParallelHotPath",
    "RankFailed",
    "check_divisible",
    "follower_main",
    "launch",
    "shard_model",
]

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a collective, or a follower's answer, may take before the rank is called hung."""
START_TIMEOUT_S = 120.0
"""Seconds a follower may take to start (the interpreter and torch's import, several seconds on a
busy CPU) and, once the group is joined, to load its shard; at least ``timeout_s``. The group's
rendezvous starts only once every follower has started, so ``timeout_s`` never holds a start."""

T = TypeVar("T")


class RankFailed(RuntimeError):
    """A rank failed on its own (raised alone, exited, or hung); the message names it. The group
    is broken: the engine must be restarted."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


# --- sharding --------------------------------------------------------------------------------


def check_divisible(config: ModelConfig, world: int) -> None:
    """Refuse, in one sentence, a model whose heads or widths do not divide by ``world``."""
    sizes = {
        "attention heads": config.num_attention_heads,
        "key/value heads": config.num_key_value_heads,
        "intermediate size": config.intermediate_size,
    }
    if config.is_moe:
        sizes["expert width"] = config.moe_intermediate_size
    bad = [f"{n} {v}" for n, v in sizes.items() if v % world]
    if bad:
        raise UsageError(
            f"--tensor-parallel {world} must divide the model's attention heads "
            f"({config.num_attention_heads}), key/value heads ({config.num_key_value_heads}) and MLP "
            f"widths; {', '.join(bad)} do not."
        )


def _rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = t.shape[0] // world
    return t[rank * n : (rank + 1) * n].clone()


def _cols(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = t.shape[1] // world
    return t[:, rank * n : (rank + 1) * n].contiguous().clone()


def shard_weights(
    config: ModelConfig, weights: Mapping[str, torch.Tensor], rank: int, world: int
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Rank ``rank``'s config (its heads and widths) and weights (fresh tensors; see the module)."""
    check_divisible(config, world)
    out = dict(weights)
    for i in range(config.num_hidden_layers):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        for n in "qkv":
            for kind in ("weight", "bias"):
                name = f"{a}.{n}_proj.{kind}"
                if name in out:
                    out[name] = _rows(out[name], rank, world)
        out[f"{a}.o_proj.weight"] = _cols(out[f"{a}.o_proj.weight"], rank, world)
        if rank and f"{a}.o_proj.bias" in out:
            del out[f"{a}.o_proj.bias"]  # added once, by rank 0, before the all-reduce sums it
        if config.moe_layer(i):
            names = moe_names(config, i)
            for g, u, d in zip(names.gate, names.up, names.down, strict=True):
                out[g], out[u] = _rows(out[g], rank, world), _rows(out[u], rank, world)
                out[d] = _cols(out[d], rank, world)
        else:
            for n in ("gate_proj", "up_proj"):
                out[f"{m}.{n}.weight"] = _rows(out[f"{m}.{n}.weight"], rank, world)
            out[f"{m}.down_proj.weight"] = _cols(out[f"{m}.down_proj.weight"], rank, world)
    shard_config = dataclasses.replace(
        config,
        num_attention_heads=config.num_attention_heads // world,
        num_key_value_heads=config.num_key_value_heads // world,
        intermediate_size=config.intermediate_size // world,
        moe_intermediate_size=config.moe_intermediate_size // world,
    )
    return shard_config, out


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    dist.all_reduce(t)
    return t


def shard_model(
    model: LoadedModel,
    rank: int,
    world: int,
    device: torch.device,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = _all_reduce,
    leader: Any = None,
) -> LoadedModel:
    """Rank ``rank``'s part of ``model`` (loaded on the host), moved to ``device``."""
    config, weights = shard_weights(model.config, model.weights, rank, world)
    moved = {name: t.to(device) for name, t in weights.items()}
    return LoadedModel(
        config,
        moved,
        model.tokenizer,
        device,
        model.dtype,
        model.source,
        Shard(rank, world, all_reduce, leader),
    )


# --- rank 0 ----------------------------------------------------------------------------------


@dataclasses.dataclass
class _Follower:
    rank: int
    process: subprocess.Popen[bytes]
    conn: Connection
    errors: dict[int, str] = dataclasses.field(default_factory=dict)  # call -> its error, reported


class Leader:
    """Rank 0's side of the group: mirrors each call to the followers and settles failures."""

    def __init__(self, world: int, device: torch.device, timeout_s: float, rendezvous: Path) -> None:
        self.world, self.device, self.timeout_s = world, device, timeout_s
        self.model: LoadedModel | None = None
        self.followers: list[_Follower] = []
        self.broken: RankFailed | None = None
        self._seq = 0
        self._handles = itertools.count(1)
        self._dropped: list[tuple[str, int]] = []
        self._rendezvous = rendezvous

    # -- what loader.load_hotpath calls

    def load(
        self, build_dir: Path, knobs: Mapping[str, object] | None
    ) -> tuple[HotPath, BuildDeclaration, dict[str, KnobValue]]:
        assert self.model is not None
        handle = next(self._handles)
        model = self.model
        hotpath, spec, resolved = self.call(
            ("load", handle, str(build_dir), None if knobs is None else dict(knobs)),
            lambda: load_local(model, build_dir, knobs),
            settle=True,
        )
        return ParallelHotPath(self, handle, hotpath), spec, resolved

    # -- the mirror

    def new_handle(self) -> int:
        return next(self._handles)

    def drop(self, kind: str, handle: int) -> None:
        """A proxy went away: its follower-side object goes with the next call (a finalizer never
        writes to the sockets itself)."""
        self._dropped.append((kind, handle))

    def call(
        self,
        message: tuple[Any, ...],
        local: Callable[[], T],
        *,
        settle: bool = False,
        tokens: torch.Tensor | None = None,
    ) -> T:
        """Send ``message`` to every follower, broadcast ``tokens``, run ``local`` here; settle the
        call (wait for every follower) when ``settle`` or anything failed."""
        if self.broken is not None:
            raise RankFailed(f"the tensor-parallel group is broken: {self.broken}", self.broken.ranks)
        self._seq += 1
        seq = self._seq
        while self._dropped:
            self._send(("drop", *self._dropped.pop()), seq)
        self._send(message, seq)
        try:
            if tokens is not None:
                dist.broadcast(tokens.to(self.device, torch.int64).contiguous(), src=0)
            result = local()
        except Exception as exc:
            self._settle(seq, message[0], exc)
            raise
        if settle:
            self._settle(seq, message[0], None)
        else:
            self._poll(seq, message[0])
        return result

    def _send(self, message: tuple[Any, ...], seq: int) -> None:
        data = pickle.dumps((seq, message))
        for f in self.followers:
            with contextlib.suppress(OSError):  # a dead follower is found when the call settles
                f.conn.send_bytes(data)

    def _poll(self, seq: int, op: str) -> None:
        """Collect errors followers reported so far; any is a failure of that rank."""
        reported = False
        for f in self.followers:
            with contextlib.suppress(OSError, EOFError):
                while f.conn.poll():
                    reported |= self._receive(f) is not None
        if reported:
            self._settle(seq, op, None)

    def _receive(self, f: _Follower) -> tuple[str, int, str | None] | None:
        kind, seq, error = pickle.loads(f.conn.recv_bytes())
        if error is not None:
            f.errors[seq] = error
        return (kind, seq, error) if kind == "status" or error is not None else None

    def _settle(self, seq: int, op: str, exc: BaseException | None) -> None:
        """Ask every follower how call ``seq`` ended; raise ``exc`` when every rank raised the same,
        ``RankFailed`` when the ranks disagree (or one is gone); return when all succeeded."""
        self._send(("status",), seq)
        deadline = time.monotonic() + self.timeout_s
        outcome: dict[int, str | None] = {}  # rank -> error (None: the call succeeded there)
        problems: list[str] = []
        failed: list[int] = []
        for f in self.followers:
            answered = False
            while not answered:
                ready = wait([f.conn], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    problems.append(
                        f"rank {f.rank} did not finish {op} (call {seq}) within {self.timeout_s:g} s: it hangs"
                    )
                    failed.append(f.rank)
                    break
                try:
                    answer = self._receive(f)
                except (EOFError, OSError):
                    problems.append(f"rank {f.rank} {_exit_reason(f.process)}" + _last_error(f))
                    failed.append(f.rank)
                    break
                if answer is not None and answer[0] == "status" and answer[1] == seq:
                    outcome[f.rank] = answer[2]
                    answered = True
            stale = [s for s in f.errors if s < seq]
            if answered and stale:  # an earlier call failed there alone
                problems.append(f"rank {f.rank} raised in call {stale[0]}: {f.errors[stale[0]]}")
                failed.append(f.rank)
        ours = None if exc is None else f"{type(exc).__name__}: {exc}"
        if not problems:  # alike: both succeeded, or both raised the same exception and message
            disagree = [
                r
                for r, e in outcome.items()
                if e != ours and not (e and ours and e.startswith(ours + " (at "))
            ]
            if not disagree:
                for f in self.followers:
                    f.errors.pop(seq, None)
                return  # every rank succeeded, or raised alike: exc propagates as it is
            for r in disagree:
                error = outcome[r]
                problems.append(f"rank {r} raised in {op}: {error}" if error else f"rank {r} did not raise")
                if error:
                    failed.append(r)
            if exc is not None and all(outcome[r] is None for r in disagree):
                problems.insert(0, f"rank 0 raised alone in {op}: {type(exc).__name__}: {exc}")
                failed.insert(0, 0)
        if exc is not None and not failed:
            failed.append(0)
        self.broken = RankFailed(
            "tensor parallel: " + "; ".join(problems) if problems else f"rank 0 raised in {op}", failed
        )
        self._kill()
        raise self.broken from exc

    # -- lifecycle

    def close(self) -> None:
        """Stop the followers (politely, then by force) and leave the process group."""
        if self.broken is None:
            self._send(("stop",), self._seq + 1)
            for f in self.followers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    f.process.wait(timeout=10)
        self._kill()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        shutil.rmtree(self._rendezvous, ignore_errors=True)

    def _kill(self) -> None:
        for f in self.followers:
            if f.process.poll() is None:
                f.process.kill()
            f.process.wait()
            f.conn.close()
        self.followers = []


def _exit_reason(process: subprocess.Popen[bytes]) -> str:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    code = process.returncode
    if code is None:
        return "closed its connection"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _last_error(f: _Follower) -> str:
    return f" (it had raised {f.errors[max(f.errors)]})" if f.errors else ""


class ParallelHotPath:
    """The hot path rank 0 hands out: each call runs on every rank (see the module)."""

    def __init__(self, leader: Leader, handle: int, local: HotPath) -> None:
        self.leader, self.handle, self.local = leader, handle, local
        weakref.finalize(self, leader.drop, "hotpath", handle)

    def new_cache(self, max_batch: int, max_seq_len: int) -> ShardedCache:
        handle = self.leader.new_handle()
        cache = self.leader.call(
            ("new_cache", self.handle, handle, max_batch, max_seq_len),
            lambda: self.local.new_cache(max_batch, max_seq_len),
            settle=True,
        )
        return ShardedCache(self.leader, handle, cache)

    def prefill(self, cache: ShardedCache, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        return self.leader.call(
            ("prefill", self.handle, cache.handle, int(slot), int(tokens.shape[0])),
            lambda: self.local.prefill(cache.local, slot, tokens),
            tokens=tokens,
        )

    def decode(self, cache: ShardedCache, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.leader.call(
            ("decode", self.handle, cache.handle, slots.tolist(), int(tokens.shape[0])),
            lambda: self.local.decode(cache.local, slots, tokens),
            tokens=tokens,
        )

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return self.local.sample(logits)  # replicated logits; followers get tokens by broadcast

    def free(self, cache: ShardedCache, slot: int) -> None:
        self.leader.call(
            ("free", self.handle, cache.handle, int(slot)), lambda: self.local.free(cache.local, slot)
        )

    def close(self) -> None:
        self.leader.call(("close", self.handle), self.local.close, settle=True)

    def __getattr__(self, name: str) -> Any:  # the local hot path's other attributes
        return getattr(self.__dict__["local"], name)


class ShardedCache:
    """Rank 0's cache of a ``ParallelHotPath``; every follower holds its twin under ``handle``."""

    def __init__(self, leader: Leader, handle: int, local: Any) -> None:
        self.handle, self.local = handle, local
        weakref.finalize(self, leader.drop, "cache", handle)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["local"], name)


# --- starting the group ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _FollowerConfig:
    rank: int
    world: int
    rendezvous: str
    source: str
    device: str
    dtype: str
    seed: int
    timeout_s: float
    threads: int | None


def _backend_and_devices(device: str, world: int) -> tuple[str, list[torch.device]]:
    dev = torch.device(device)
    if dev.type == "cpu":
        return "gloo", [dev] * world
    if dev.type != "cuda":
        raise UsageError(f"--tensor-parallel runs on cpu or cuda devices; got {device!r}.")
    count = torch.cuda.device_count()
    if count < world:
        raise UsageError(f"--tensor-parallel {world} needs {world} GPUs; this node has {count}.")
    return "nccl", [torch.device("cuda", r) for r in range(world)]


def _init(
    backend: str, rendezvous: str, rank: int, world: int, timeout_s: float, device: torch.device
) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def launch(
    source: str,
    *,
    world: int,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads: int | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> LoadedModel:
    """Start a group of ``world`` ranks serving ``source``; returns rank 0's model, whose
    ``shard.leader`` (a ``Leader``) loads builds on every rank. Close it with ``leader.close()``.
    ``timeout_s`` bounds the rendezvous and every collective; ``start_timeout_s`` each follower's
    start and shard load (``START_TIMEOUT_S``).

    Raises ``UsageError`` (one sentence) when the model does not divide or the node lacks GPUs,
    ``RankFailed`` when a follower cannot start."""
    if world < 2:
        raise ValueError(f"launch needs at least 2 ranks; got {world}")
    backend, devices = _backend_and_devices(device, world)
    full = load_model(source, device="cpu", dtype=dtype, seed=seed)
    check_divisible(full.config, world)
    directory = Path(tempfile.mkdtemp(prefix="polymorph-tp-"))
    rendezvous = str(directory / "rendezvous")
    leader = Leader(world, devices[0], timeout_s, directory)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        for rank in range(1, world):
            ours, theirs = socket.socketpair()
            code = "import sys; from polymorph_engine.runtime.parallel import follower_main; follower_main(int(sys.argv[1]))"
            process = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env
            )
            theirs.close()
            conn = Connection(ours.detach())
            config = _FollowerConfig(
                rank, world, rendezvous, source, str(devices[rank]), dtype, seed, timeout_s, threads
            )
            conn.send_bytes(pickle.dumps(config))
            leader.followers.append(_Follower(rank, process, conn))
        start_s = max(timeout_s, start_timeout_s)
        for f in leader.followers:  # each has started (torch imported) before the rendezvous's clock runs
            _expect(f, "started", start_s, "could not start")
        _init(backend, rendezvous, 0, world, timeout_s, devices[0])
        leader.model = shard_model(full, 0, world, devices[0], leader=leader)
        del full
        for f in leader.followers:  # each says it holds its shard, or why not
            _expect(f, "ready", start_s, "could not load the model")
    except BaseException:
        leader.broken = RankFailed("the group did not start", [])
        leader.close()
        raise
    return leader.model


def _expect(f: _Follower, want: str, timeout_s: float, failing: str) -> None:
    """Follower ``f``'s next message is ``want`` within ``timeout_s``; else a ``RankFailed`` naming it."""
    answered = wait([f.conn], timeout=timeout_s)
    try:
        kind, _, error = pickle.loads(f.conn.recv_bytes()) if answered else ("hung", 0, None)
    except (EOFError, OSError):
        kind, error = "dead", f"{_exit_reason(f.process)}"
    if kind != want:
        reason = error or f"did not answer within {timeout_s:g} s"
        raise RankFailed(f"tensor-parallel rank {f.rank} {failing}: {reason}", [f.rank])


# --- ranks 1..N-1 ----------------------------------------------------------------------------


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (rank 0) dies, however it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def follower_main(fd: int) -> None:
    """Rank r > 0: join the group, load the shard, then run each call rank 0 sends until ``stop``."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to act on
    conn = Connection(fd)
    config: _FollowerConfig = pickle.loads(conn.recv_bytes())
    conn.send_bytes(pickle.dumps(("started", 0, None)))  # imported: rank 0 may start the rendezvous
    device = torch.device(config.device)
    try:
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        backend = "nccl" if device.type == "cuda" else "gloo"
        _init(backend, config.rendezvous, config.rank, config.world, config.timeout_s, device)
        full = load_model(config.source, device="cpu", dtype=config.dtype, seed=config.seed)
        model = shard_model(full, config.rank, config.world, device)
        del full
    except Exception as exc:
        conn.send_bytes(pickle.dumps(("failed", 0, _describe(exc))))
        return
    conn.send_bytes(pickle.dumps(("ready", 0, None)))
    hotpaths: dict[int, HotPath] = {}
    caches: dict[int, Any] = {}
    errors: dict[int, str] = {}
    while True:
        try:
            seq, message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # rank 0 went away
        op = message[0]
        if op == "stop":
            break
        if op == "status":
            conn.send_bytes(pickle.dumps(("status", seq, errors.pop(seq, None))))
            errors.clear()
            continue
        try:
            _execute(message, model, device, hotpaths, caches)
        except Exception as exc:
            errors[seq] = _describe(exc)
            conn.send_bytes(pickle.dumps(("error", seq, errors[seq])))
    for hotpath in hotpaths.values():
        with contextlib.suppress(Exception):
            hotpath.close()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _execute(
    message: tuple[Any, ...],
    model: LoadedModel,
    device: torch.device,
    hotpaths: dict[int, HotPath],
    caches: dict[int, Any],
) -> None:
    op, *args = message
    if op == "load":
        handle, build_dir, knobs = args
        hotpaths[handle] = load_local(model, Path(build_dir), knobs)[0]
    elif op == "new_cache":
        handle, cache, max_batch, max_seq_len = args
        caches[cache] = hotpaths[handle].new_cache(max_batch, max_seq_len)
    elif op in ("prefill", "decode"):
        handle, cache, where, n = args
        tokens = torch.empty(n, dtype=torch.int64, device=device)
        dist.broadcast(tokens, src=0)
        if op == "prefill":
            hotpaths[handle].prefill(caches[cache], where, tokens)
        else:
            hotpaths[handle].decode(caches[cache], torch.tensor(where, dtype=torch.int64), tokens)
    elif op == "free":
        handle, cache, slot = args
        hotpaths[handle].free(caches[cache], slot)
    elif op == "close":
        hotpaths.pop(args[0]).close()
    elif op == "drop":
        kind, handle = args
        (hotpaths if kind == "hotpath" else caches).pop(handle, None)
    else:
        raise ValueError(f"unknown call {op!r}")
