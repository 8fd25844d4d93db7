"""The engine thread: one ``Scheduler`` over one hot path, admission control, and one completion as
an async HTTP handler sees it.

Contract:
- ``CompletionService`` owns one ``Scheduler`` over a ``HotPath`` and a single background
  thread that drives it (continuous batching: requests join and leave the running batch
  between decode steps). Callers never touch the scheduler; they hand jobs to the driver
  through a queue and receive events through the job's sink.
- Admission control: at most ``max_batch + max_queue`` requests are admitted (running or
  queued) at once. ``submit`` refuses the next one at once with a 503 ``RequestError``
  (``code="overloaded"``, ``retry_after`` seconds), and with ``shutting_down`` once
  ``close`` began: a request is never left waiting without bound.
- Failure isolation: when a build raises while prefilling one request, that request alone
  fails (``build_failed``); the rest of the batch goes on. When a batched decode step raises,
  every request in that batch fails with a message saying the whole batch failed
  (``batch_failed``), the failure is logged once with the build id, requests still waiting
  are kept, and the engine stays ready on a fresh scheduler over the same build.
- One request's events (``events``: a token, the finish, a failure) go to its sink; a
  ``completion.Completion`` reads them on the asyncio loop that admitted the request.

It knows nothing about HTTP, JSON or response shapes (``server`` owns those), nor about how a
build computes, where weights come from or how a build was fetched.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polymorph_engine.runtime.sampling import Sampling
from polymorph_engine.runtime.scheduler import Request, Scheduler
from polymorph_engine.serving.events import Event, Failed, Finished, Sink, Token
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.openai_api import RequestError, TextTokenizer
from polymorph_engine.serving.trace import TraceSampler

__all__ = ["DEFAULT_MAX_QUEUE", "RETRY_AFTER_S", "CompletionService", "Job"]

log = logging.getLogger("polymorph_engine.serving")

DEFAULT_MAX_QUEUE = 64
"""Requests admitted beyond the running batch, waiting for a slot."""
RETRY_AFTER_S = 1
"""What a 503 asks a client to wait before retrying."""


# --- the engine thread -----------------------------------------------------------------------


@dataclass(eq=False)
class Job:
    """One admitted request and where its events go."""

    request: Request
    sink: Sink
    stop_ids: frozenset[int] = frozenset()
    """Ids that end the request besides EOS (a chat template's end-of-turn tokens)."""


@dataclass(frozen=True)
class _Swap:
    hotpath: Any
    build_id: str
    done: threading.Event


class _Guarded:
    """A hot path whose ``prefill`` failures are recorded per slot instead of raised.

    A failed prefill returns placeholder logits [V] so the scheduler's step carries on for the
    other requests; the service then fails the request in that slot alone.
    """

    def __init__(self, inner: Any, vocab_size: int) -> None:
        self.inner = inner
        self.vocab_size = vocab_size
        self.failed: dict[int, Exception] = {}

    def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
        return self.inner.new_cache(max_batch, max_seq_len)

    def prefill(self, cache: Any, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        try:
            return self.inner.prefill(cache, slot, tokens)
        except Exception as exc:
            self.failed[slot] = exc
            return torch.zeros(self.vocab_size, dtype=torch.float32, device=tokens.device)  # [V]

    def decode(self, cache: Any, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(cache, slots, tokens)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return self.inner.sample(logits)

    def free(self, cache: Any, slot: int) -> None:
        self.inner.free(cache, slot)

    def close(self) -> None:
        self.inner.close()


def _where(exc: BaseException) -> str:
    """``file.py:line`` of the innermost frame of ``exc`` (for a one-line log)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""


class CompletionService:
    """One scheduler over one hot path, driven by one background thread (continuous batching).

    ``submit(prompt_ids, max_tokens, sink)`` admits a job (or raises a 503 ``RequestError``);
    its sink receives ``Token``s, then one ``Finished`` or ``Failed``, from the engine
    thread. ``cancel(job)`` stops a job early (stop string hit, client gone).
    ``swap(hotpath, build_id)`` waits for the running batch to drain, then serves later
    requests with the new hot path. ``close()`` stops admitting, lets admitted requests finish
    for up to ``grace_s``, fails the rest, then stops the thread.
    """

    def __init__(
        self,
        hotpath: Any,
        *,
        build_id: str,
        tokenizer: TextTokenizer,
        vocab_size: int,
        eos_id: int | None,
        max_batch: int,
        max_seq_len: int,
        model_names: Sequence[str],
        metrics: ServerMetrics,
        trace: TraceSampler | None = None,
        device: str = "cpu",
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        self.max_queue = max_queue
        self.model_names = tuple(model_names)
        self.metrics = metrics
        self.trace = trace
        self.device = device
        self.build_id = build_id
        self.created = int(time.time())
        self.peak_batch = 0
        """The most requests ever decoded in one step: evidence of continuous batching."""
        self.steps = 0
        self._hotpath = _Guarded(hotpath, vocab_size)
        self._scheduler = self._new_scheduler()
        self._inbox: queue.Queue[Job | _Swap | None] = queue.Queue()
        self._jobs: dict[Request, Job] = {}  # in the scheduler (waiting or running)
        self._live: set[Job] = set()  # admitted and not yet given their last event
        self._accepting = True
        self._stopping = False
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._run, name="polymorph-engine", daemon=True)
        self._thread.start()

    @property
    def capacity(self) -> int:
        """How many requests may be admitted at once (running plus queued)."""
        return self.max_batch + self.max_queue

    @property
    def ready(self) -> bool:
        return self._accepting and self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs (it may be draining while not ``ready``)."""
        return self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        """Admitted requests that have not had their last event yet."""
        with self._lock:
            return len(self._live)

    def submit(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        sink: Sink,
        sampling: Sampling | None = None,
        *,
        logprobs: int | None = None,
        stop_ids: Sequence[int] = (),
        stop_at_eos: bool = True,
    ) -> Job:
        """Admit one request, or raise a 503 ``RequestError`` at once (see the module contract).
        ``sampling`` None is greedy decoding; ``logprobs`` k gives each ``Token`` its log
        probability and the k most likely tokens'; a token in ``stop_ids`` is the request's last;
        ``stop_at_eos`` False generates ``max_tokens`` whatever comes (vLLM's ``ignore_eos``)."""
        with self._lock:
            if not self.ready:
                raise RequestError(
                    "the engine is shutting down; retry on another replica.",
                    status=503,
                    code="shutting_down",
                    retry_after=RETRY_AFTER_S,
                )
            if len(self._live) >= self.capacity:
                raise RequestError(
                    f"the engine is at capacity ({self.capacity} requests running or queued); "
                    f"retry after {RETRY_AFTER_S} s.",
                    status=503,
                    code="overloaded",
                    retry_after=RETRY_AFTER_S,
                )
            request = Request(
                prompt=list(prompt_ids),
                max_new_tokens=max_tokens,
                stop_at_eos=stop_at_eos,
                sampling=sampling,
                logprobs=logprobs,
            )
            job = Job(request, sink, frozenset(stop_ids) - {self.eos_id})
            self._live.add(job)
        self._inbox.put(job)
        return job

    def cancel(self, job: Job) -> None:
        self._scheduler.cancel(job.request)

    def swap(self, hotpath: Any, build_id: str, timeout_s: float = 600.0) -> Any:
        """Serve later requests with ``hotpath``; returns the previous hot path (the caller closes it)."""
        previous = self._hotpath.inner
        swap = _Swap(hotpath, build_id, threading.Event())
        self._inbox.put(swap)
        if not swap.done.wait(timeout_s):
            raise TimeoutError(f"the running batch did not drain within {timeout_s:.0f} s")
        return previous

    def close(self, grace_s: float = 30.0) -> None:
        """Stop admitting requests, let admitted ones finish (up to ``grace_s``), stop the thread."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline and self.alive:
            time.sleep(0.01)
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=10)
        with self._lock:
            left = list(self._live)
            self._jobs.clear()
        for job in left:
            self._deliver(job, Failed("the engine shut down before this request finished.", "shutting_down"))
        self._scheduler.close()

    # -- engine thread only -----------------------------------------------------------------

    def _new_scheduler(self) -> Scheduler:
        return Scheduler(self._hotpath, self.max_batch, self.max_seq_len, self.eos_id, device=self.device)

    def _deliver(self, job: Job, event: Event) -> None:
        """Hand ``event`` to ``job``'s sink; a last event also releases its admission slot."""
        if not isinstance(event, Token):
            with self._lock:
                self._live.discard(job)
        try:
            job.sink(event)
        except Exception as exc:  # a consumer gone (its loop closed) must not stop the engine
            log.debug("dropped an event for a request whose consumer is gone: %s", exc)

    def _admit(self, item: Job | _Swap | None, pending: list[_Swap]) -> None:
        if isinstance(item, _Swap):
            pending.append(item)
        elif isinstance(item, Job):
            try:
                self._scheduler.add(item.request)
            except ValueError as exc:  # validated upstream; never let one request stop the thread
                self._deliver(item, Failed(f"the scheduler refused the request: {exc}", "build_failed"))
                return
            with self._lock:
                self._jobs[item.request] = item

    def _run(self) -> None:
        pending: list[_Swap] = []  # swaps wait here until the running batch drains
        held: list[Job] = []  # jobs that arrived behind a pending swap
        while not self._stopping:
            idle = not self._scheduler.has_work()
            try:
                item = self._inbox.get(timeout=0.05) if idle else self._inbox.get_nowait()
            except queue.Empty:
                item = None
            while item is not None:
                if pending and isinstance(item, Job):
                    held.append(item)
                else:
                    self._admit(item, pending)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            if pending and not self._scheduler.has_work():
                for swap in pending:
                    self._do_swap(swap)
                pending.clear()
                for job in held:
                    self._admit(job, pending)
                held.clear()
            if self._scheduler.has_work():
                self._step()
            self._sweep(time.monotonic())

    def _do_swap(self, swap: _Swap) -> None:
        self._scheduler.close()
        self._hotpath = _Guarded(swap.hotpath, self.vocab_size)
        self._scheduler = self._new_scheduler()
        self.build_id = swap.build_id
        self.metrics.set_build(swap.build_id)
        swap.done.set()

    def _step(self) -> None:
        with self._lock:
            fresh = [j for j in self._jobs.values() if not j.request.output and not j.request.done]
        try:
            batch = self._scheduler.num_running
            events = self._scheduler.step()
        except Exception as exc:  # a build bug must fail its batch, not kill the server
            self._batch_failed(exc)
            return
        for slot, failure in self._hotpath.failed.items():
            job = next((j for j in fresh if j.request.slot == slot), None)
            if job is None:
                continue
            with self._lock:
                self._jobs.pop(job.request, None)
            self._scheduler.cancel(job.request)
            log.warning(
                "build %s failed while prefilling request %s (%d prompt tokens): %s: %s%s",
                self.build_id,
                job.request.id,
                len(job.request.prompt),
                type(failure).__name__,
                failure,
                _where(failure),
            )
            message = f"the build failed on this request's prompt: {type(failure).__name__}: {failure}"
            self._deliver(job, Failed(message, "build_failed"))
        self._hotpath.failed.clear()
        self.steps += 1
        self.peak_batch = max(self.peak_batch, batch)
        self.metrics.observe_batch(batch)
        now = time.monotonic()
        with self._lock:
            targets = [(self._jobs.get(request), token) for request, token in events]
        for target, token in targets:
            if target is None:
                continue
            logprob = target.request.token_logprobs[-1] if target.request.logprobs is not None else None
            if token in target.stop_ids:  # an end-of-turn token: the request ends at the next step
                self._scheduler.cancel(target.request)
            self._deliver(target, Token(token, now, logprob))

    def _batch_failed(self, exc: Exception) -> None:
        """Fail every request of the batch that raised; keep the waiting ones on a fresh scheduler."""
        self._hotpath.failed.clear()
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
        running = [j for j in jobs if j.request.slot is not None and not j.request.done]
        waiting = [j for j in jobs if j.request.slot is None and not j.request.done]
        finished = [j for j in jobs if j.request.done]
        log.error(
            "build %s failed on a batch of %d requests (they are failed; the engine goes on): %s: %s%s",
            self.build_id,
            len(running),
            type(exc).__name__,
            exc,
            _where(exc),
        )
        message = (
            f"the build failed on the whole batch of {len(running)} requests this request was in "
            f"({type(exc).__name__}: {exc}); retry it."
        )
        for job in running:
            self._deliver(job, Failed(message, "batch_failed"))
        self._scheduler.close()
        self._scheduler = self._new_scheduler()
        now = time.monotonic()
        for job in finished:
            self._deliver(job, Finished(str(job.request.finish_reason), now))
        for job in waiting:  # never started: they were not in the batch that failed
            job.request = Request(
                prompt=job.request.prompt,
                max_new_tokens=job.request.max_new_tokens,
                stop_at_eos=job.request.stop_at_eos,
                sampling=job.request.sampling,
                logprobs=job.request.logprobs,
            )
            self._admit(job, [])

    def _sweep(self, now: float) -> None:
        """Hand finished (or cancelled) requests their last event and forget them."""
        with self._lock:
            done = [self._jobs.pop(r) for r in [r for r in self._jobs if r.done]]
        for job in done:
            self._deliver(job, Finished(str(job.request.finish_reason), now))
