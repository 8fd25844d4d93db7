"""The engine thread: one ``Scheduler`` over one hot path, and one completion as an HTTP thread sees it.

Contract:
- ``CompletionService`` owns one ``Scheduler`` over a ``HotPath`` and a single background
  thread that drives it (continuous batching: requests join and leave the running batch
  between decode steps). Callers never touch the scheduler; they hand ``_Job``s to the
  driver through a queue and read tokens back from a per-job queue.
- ``generate(service, params, outcome)`` yields the text deltas of one completion (stop
  strings applied), fills ``outcome`` (completion tokens, finish reason) and records the
  request in the metrics (``polymorph_engine.serving.metrics``) and the traffic trace
  (``polymorph_engine.serving.trace``); the trace keeps lengths and timing, never content. Closing
  it early cancels the request.

It knows nothing about HTTP, JSON or response shapes (``server`` owns those), nor about how a
build computes, where weights come from or how a build was fetched.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from polymorph_engine.runtime.scheduler import Request, Scheduler
from polymorph_engine.serving.metrics import RequestObservation, ServerMetrics
from polymorph_engine.serving.openai_api import CompletionParams, RequestError, TextTokenizer, stop_scan
from polymorph_engine.serving.trace import TraceSampler

__all__ = ["CompletionService", "Outcome", "generate"]


# --- the engine thread -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    token: int
    at: float


@dataclass(frozen=True)
class _Finished:
    reason: str  # the scheduler's finish reason
    at: float


@dataclass(frozen=True)
class _Failed:
    message: str


_Event = _Token | _Finished | _Failed


@dataclass(eq=False)
class _Job:
    request: Any  # scheduler.Request
    events: queue.Queue[_Event] = field(default_factory=queue.Queue)


@dataclass(frozen=True)
class _Swap:
    hotpath: Any
    build_id: str
    done: threading.Event


class CompletionService:
    """One scheduler over one hot path, driven by one background thread (continuous batching).

    ``submit(prompt_ids, max_tokens)`` returns a job whose event queue yields ``_Token``s, then
    one ``_Finished`` (or a ``_Failed`` if the hot path raised). ``cancel(job)`` stops a job
    early (stop string hit, client gone). ``swap(hotpath, build_id)`` waits for the running
    batch to drain, then serves later requests with the new hot path. ``close()`` stops
    admitting, lets running requests finish for up to ``grace_s``, then stops the thread.
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
    ) -> None:
        self._scheduler_cls = Scheduler
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        self.model_names = tuple(model_names)
        self.metrics = metrics
        self.trace = trace
        self.device = device
        self.build_id = build_id
        self.created = int(time.time())
        self.peak_batch = 0
        """The most requests ever decoded in one step: evidence of continuous batching."""
        self.steps = 0
        self._hotpath = hotpath
        self._scheduler = Scheduler(hotpath, max_batch, max_seq_len, eos_id, device=device)
        self._inbox: queue.Queue[_Job | _Swap | None] = queue.Queue()
        self._jobs: dict[Any, _Job] = {}
        self._accepting = True
        self._stopping = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="polymorph-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self._accepting and self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs (it may be draining while not ``ready``)."""
        return self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    def submit(self, prompt_ids: Sequence[int], max_tokens: int) -> _Job:
        if not self.ready:
            raise RequestError("the engine is shutting down; retry on another replica.", status=503)
        job = _Job(Request(prompt=list(prompt_ids), max_new_tokens=max_tokens))
        self._inbox.put(job)
        return job

    def cancel(self, job: _Job) -> None:
        self._scheduler.cancel(job.request)

    def swap(self, hotpath: Any, build_id: str, timeout_s: float = 600.0) -> Any:
        """Serve later requests with ``hotpath``; returns the previous hot path (the caller closes it)."""
        previous = self._hotpath
        swap = _Swap(hotpath, build_id, threading.Event())
        self._inbox.put(swap)
        if not swap.done.wait(timeout_s):
            raise TimeoutError(f"the running batch did not drain within {timeout_s:.0f} s")
        return previous

    def close(self, grace_s: float = 30.0) -> None:
        """Stop admitting requests, let running ones finish (up to ``grace_s``), stop the thread."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=10)
        for job in self._take_all_jobs():
            job.events.put(_Failed("the engine shut down before this request finished."))
        self._scheduler.close()

    # -- engine thread only -----------------------------------------------------------------

    def _take_all_jobs(self) -> list[_Job]:
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
        return jobs

    def _admit(self, item: _Job | _Swap | None, pending: list[_Swap]) -> None:
        if isinstance(item, _Swap):
            pending.append(item)
        elif isinstance(item, _Job):
            try:
                self._scheduler.add(item.request)
            except ValueError as exc:  # validated upstream; never let one request stop the thread
                item.events.put(_Failed(f"the scheduler refused the request: {exc}"))
                return
            with self._lock:
                self._jobs[item.request] = item

    def _run(self) -> None:
        pending: list[_Swap] = []  # swaps wait here until the running batch drains
        held: list[_Job] = []  # jobs that arrived behind a pending swap
        while not self._stopping:
            idle = not self._scheduler.has_work()
            try:
                item = self._inbox.get(timeout=0.05) if idle else self._inbox.get_nowait()
            except queue.Empty:
                item = None
            while item is not None:
                if pending and isinstance(item, _Job):
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
        for job in held:
            job.events.put(_Failed("the engine shut down before this request started."))

    def _do_swap(self, swap: _Swap) -> None:
        self._scheduler.close()
        self._scheduler = self._scheduler_cls(
            swap.hotpath, self.max_batch, self.max_seq_len, self.eos_id, device=self.device
        )
        self._hotpath = swap.hotpath
        self.build_id = swap.build_id
        self.metrics.set_build(swap.build_id)
        swap.done.set()

    def _step(self) -> None:
        try:
            batch = self._scheduler.num_running
            events = self._scheduler.step()
        except Exception as exc:  # a build bug must fail its requests, not kill the server
            message = f"the build failed while generating: {type(exc).__name__}: {exc}"
            for job in self._take_all_jobs():
                job.events.put(_Failed(message))
            self._scheduler.close()
            self._scheduler = self._scheduler_cls(
                self._hotpath, self.max_batch, self.max_seq_len, self.eos_id, device=self.device
            )
            return
        self.steps += 1
        self.peak_batch = max(self.peak_batch, batch)
        self.metrics.observe_batch(batch)
        now = time.monotonic()
        with self._lock:
            for request, token in events:
                target = self._jobs.get(request)
                if target is not None:
                    target.events.put(_Token(token, now))

    def _sweep(self, now: float) -> None:
        """Hand finished (or cancelled) requests their last event and forget them."""
        with self._lock:
            for request in [r for r in self._jobs if r.done]:
                job = self._jobs.pop(request)
                job.events.put(_Finished(str(request.finish_reason), now))


# --- one completion, seen from an HTTP thread ------------------------------------------------


@dataclass
class Outcome:
    """What one completion came to, filled in by ``generate`` (usage and ``finish_reason``)."""

    completion_tokens: int = 0
    finish_reason: str | None = None


def generate(
    service: CompletionService, params: CompletionParams, outcome: Outcome
) -> Generator[str, None, None]:
    """Yield text deltas of one completion; fill ``outcome``; record metrics and trace when done.

    Closing the generator early (the client went away) cancels the request in the scheduler.
    """
    arrival = time.monotonic()
    job = service.submit(params.prompt_ids, params.max_tokens)
    service.metrics.request_started()
    ids: list[int] = []  # generated ids that are text (EOS excluded)
    times: list[float] = []
    sent = 0
    status: Literal["ok", "error", "cancelled"] = "error"
    try:
        while outcome.finish_reason is None:
            event = _next_event(service, job)
            if isinstance(event, _Failed):
                raise RequestError(event.message, status=500, code="engine_error")
            if isinstance(event, _Token):
                times.append(event.at)
                if event.token != service.eos_id:
                    ids.append(event.token)
                if not (params.stream or params.stop):
                    continue  # nothing to show or check before the end: decode once, then
                text = service.tokenizer.decode(ids)
                safe, hit = stop_scan(text, params.stop)
                if hit:
                    service.cancel(job)
                    outcome.finish_reason = "stop"
            else:
                text = service.tokenizer.decode(ids)
                safe, hit = stop_scan(text, params.stop)
                if not hit:
                    safe = len(text)
                outcome.finish_reason = "length" if event.reason == "length" else "stop"
            if safe > sent:
                try:
                    yield text[sent:safe]
                except GeneratorExit:
                    status = "cancelled"
                    raise
                sent = safe
        status = "ok"
    finally:
        if outcome.finish_reason is None:
            service.cancel(job)
        outcome.completion_tokens = len(times)
        ttft = times[0] - arrival if times else None
        itls = [b - a for a, b in itertools.pairwise(times)]
        service.metrics.request_finished(
            RequestObservation(len(params.prompt_ids), len(times), ttft, itls, status)
        )
        if status == "ok" and times and service.trace is not None:
            service.trace.record(len(params.prompt_ids), len(times), arrival)


def _next_event(service: CompletionService, job: _Job) -> _Event:
    while True:
        try:
            return job.events.get(timeout=1.0)
        except queue.Empty:
            if not service.alive:
                return _Failed("the engine thread stopped before this request finished.")
