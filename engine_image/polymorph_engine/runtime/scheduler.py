"""Continuous batching at step granularity over one hot path and one KV cache.

Owns: the waiting queue, slot assignment, and the step loop. Each ``step()``:
  1. retires cancelled requests (their slots become free);
  2. admits waiting requests into free slots (FIFO) and prefills each, emitting its first
     token; a request admitted here joins the batch at the *next* step's decode;
  3. runs one batched decode over every request that was already running, emitting one
     token each.
A request with ``sampling`` has its tokens drawn by a ``sampling.Sampler`` from its row of the
logits; every other request gets the build's greedy ``sample``. A request with ``logprobs`` k
also gets, in ``token_logprobs``, each token's log probability and the k most likely tokens'
(from its row of the logits, before temperature and top-p), computed for that request alone.
A request leaves (its slot is freed) as soon as it finishes: ``max_new_tokens`` reached,
``eos_id`` produced (``finish_reason="stop"``), or its sequence filled ``max_seq_len``
(``finish_reason="length"`` in both length cases).

Threads: ``add``, ``cancel`` and ``has_work`` may be called from any thread. ``step`` and
``close`` must be called from one thread only (the engine thread), which is also the only
thread that touches the hot path and the cache. ``step`` never blocks on the queue; an
engine thread with nothing to do calls ``wait_for_work(timeout)``, which sleeps until
``add`` is called (never spin on ``step``: it would starve the threads calling ``add``).

It knows nothing about timing, benchmarks, HTTP or tokenisation: requests carry token ids.
Shapes: S = prompt length, B = requests in one decode step, V = vocab size.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.sampling import Sampler, Sampling

__all__ = ["FinishReason", "Request", "Scheduler", "TokenLogprob"]

FinishReason = Literal["stop", "length", "cancelled"]
TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]
"""A token's log probability, and the (id, log probability) of the most likely tokens, best first."""
_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """A generation request. The scheduler fills ``output`` and ``finish_reason``.

    Compared by identity, so requests can key dictionaries.
    """

    prompt: Sequence[int]
    max_new_tokens: int
    stop_at_eos: bool = True
    sampling: Sampling | None = None
    """None: greedy, the build's ``sample`` (verification and benchmarks); else drawn by a ``Sampler``."""
    logprobs: int | None = None
    """None: no log probabilities; k: each token's and the k most likely tokens' (``token_logprobs``)."""
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    output: list[int] = field(default_factory=list)
    token_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    slot: int | None = field(default=None, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    _sampler: Sampler | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class Scheduler:
    """Runs requests through ``hotpath`` with continuous batching (see the module docstring)."""

    def __init__(
        self,
        hotpath: HotPath,
        max_batch: int,
        max_seq_len: int,
        eos_id: int | None = None,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {max_seq_len}")
        self.hotpath = hotpath
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        self.eos_id = eos_id
        self.device = torch.device(device)
        self._cache: Any = hotpath.new_cache(max_batch, max_seq_len)
        self._free: list[int] = list(range(max_batch - 1, -1, -1))  # pop() hands out slot 0 first
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)

    # -- any thread -------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue ``request``; it is admitted at a later ``step`` when a slot is free."""
        prompt_len = len(request.prompt)
        if prompt_len < 1:
            raise ValueError("the prompt must hold at least one token")
        if prompt_len > self.max_seq_len:
            raise ValueError(f"the prompt has {prompt_len} tokens but max_seq_len is {self.max_seq_len}")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if request.done or request.slot is not None or request.output:
            raise ValueError(f"request {request.id} was already scheduled; make a new Request")
        with self._lock:
            self._waiting.append(request)
            self._work.notify_all()

    def cancel(self, request: Request) -> None:
        """Stop ``request``: at once if it is waiting, at the next ``step`` if it is running."""
        with self._lock:
            if request in self._waiting:
                self._waiting.remove(request)
                request.finish_reason = "cancelled"
            elif not request.done:
                request._cancelled = True

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        with self._lock:
            return bool(self._waiting or self._running)

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Block until a request is waiting or running (or ``timeout`` seconds pass); return ``has_work()``.

        The engine thread calls this when idle instead of spinning on ``step``.
        """
        with self._work:
            return self._work.wait_for(lambda: bool(self._waiting or self._running), timeout)

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    @property
    def num_running(self) -> int:
        with self._lock:
            return len(self._running)

    # -- engine thread ----------------------------------------------------------------------

    def step(self) -> list[tuple[Request, int]]:
        """Run one scheduling step and return the tokens it produced, in order."""
        events: list[tuple[Request, int]] = []
        with self._lock:
            for request in [r for r in self._running if r._cancelled]:
                self._finish(request, "cancelled")
            previously_running = list(self._running)
            admitted: list[Request] = []
            while self._free and self._waiting:
                request = self._waiting.popleft()
                request.slot = self._free.pop()
                admitted.append(request)
                self._running.append(request)
        for request in admitted:
            assert request.slot is not None
            prompt = torch.as_tensor(list(request.prompt), dtype=torch.int64, device=self.device)  # [S]
            logits = self.hotpath.prefill(self._cache, request.slot, prompt)  # [V]
            if request.sampling is not None:
                request._sampler = Sampler(request.sampling, logits.device)
                token = request._sampler.draw(logits)
            else:
                token = int(self.hotpath.sample(logits.unsqueeze(0))[0].item())
            if request.logprobs is not None:
                request.token_logprobs.append(_logprob(logits, token, request.logprobs))
            events.append((request, token))
            self._emit(request, token)
        if previously_running:
            slots = torch.tensor(
                [r.slot for r in previously_running], dtype=torch.int64, device=self.device
            )  # [B]
            last = torch.tensor(
                [r.output[-1] for r in previously_running], dtype=torch.int64, device=self.device
            )
            logits = self.hotpath.decode(self._cache, slots, last)  # [B, V]
            tokens: list[int] = self.hotpath.sample(logits).tolist()  # one device sync per step
            for i, request in enumerate(previously_running):
                if request._sampler is not None:  # a sampled request: its own row, its own generator
                    tokens[i] = request._sampler.draw(logits[i])
            for i, request in enumerate(previously_running):
                if request.logprobs is not None:
                    request.token_logprobs.append(_logprob(logits[i], tokens[i], request.logprobs))
            for request, token in zip(previously_running, tokens, strict=True):
                events.append((request, int(token)))
                self._emit(request, int(token))
        return events

    def close(self) -> None:
        """Drop the KV cache and cancel everything still queued or running."""
        with self._lock:
            for request in list(self._running):
                self._finish(request, "cancelled")
            for request in self._waiting:
                request.finish_reason = "cancelled"
            self._waiting.clear()
        self._cache = None

    def _emit(self, request: Request, token: int) -> None:
        request.output.append(token)
        reason: FinishReason | None = None
        if self.eos_id is not None and request.stop_at_eos and token == self.eos_id:
            reason = "stop"
        elif len(request.output) >= request.max_new_tokens:
            reason = "length"
        elif len(request.prompt) + len(request.output) > self.max_seq_len:
            # The next decode would write position S + n - 1 >= max_seq_len: the cache is full.
            reason = "length"
        if reason is not None:
            with self._lock:
                self._finish(request, reason)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        """Free ``request``'s slot. The caller holds the lock."""
        assert request.slot is not None
        self.hotpath.free(self._cache, request.slot)
        self._free.append(request.slot)
        self._running.remove(request)
        request.finish_reason = reason


def _logprob(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """``token``'s log probability under ``logits`` [V], and the ``k`` most likely tokens'."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [V]
    top = torch.topk(logp, k) if k > 0 else None
    best = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
    return float(logp[token]), best
