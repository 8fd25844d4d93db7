"""One completion as an async HTTP handler sees it: admitted, then streamed as text deltas.

``Completion(service, params)`` admits one request (a refusal raises ``RequestError`` at once,
before any response starts), and ``Completion.deltas()`` yields its text deltas (stop strings
applied) on the asyncio loop that admitted it, fills ``finish_reason`` and
``completion_tokens`` (counted as tokens come) (and ``logprobs``, one entry per text token, when the request asked for
them: a stream's consumer reads the entries added since its last delta), and records the request in the metrics and the traffic trace (lengths
and timing, never content). Closing the iterator early, or cancelling the task awaiting it,
cancels the request; ``abandon()`` does the same for one whose ``deltas()`` never started.

The engine thread hands a request's events to an ``_Inbox``, which wakes the loop only when
the reader needs it: for every event of a streamed request or one with stop strings, else
only for its last event (the tokens of a plain completion wait in the inbox, each with the
time it was made), and never more than one wake-up at a time. A wake-up is a switch to the
loop thread, which then takes the GIL from the engine thread. Once per token, it cost the loop
thread 0.1-0.3 ms of CPU per token (the tiny model's whole decode step on CPU is about 1 ms),
paid in every build's inter-token latency, more so on a loaded CPU, where the engine thread
waits for the loop thread to be scheduled and hand the GIL back.

It knows nothing about HTTP, JSON or response shapes (``server`` owns those).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator
from typing import Literal

from polymorph_engine.runtime.scheduler import TokenLogprob
from polymorph_engine.serving.events import Event, Failed, Token
from polymorph_engine.serving.metrics import RequestObservation
from polymorph_engine.serving.openai_api import CompletionParams, RequestError, stop_scan
from polymorph_engine.serving.service import CompletionService

__all__ = ["Completion"]


class _Inbox:
    """One request's events from the engine thread, read on the loop that admitted it.

    ``put`` (engine thread) appends; it schedules a wake-up of the reader for every event when
    ``eager``, else only for an event that is not a ``Token``, and only when none is pending.
    ``get`` (loop) returns the next event, or None when none came within ``timeout`` seconds.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, eager: bool) -> None:
        self._loop = loop
        self._eager = eager
        self._items: deque[Event] = deque()
        self._ready = asyncio.Event()
        self._lock = threading.Lock()
        self._waking = False

    def put(self, event: Event) -> None:
        self._items.append(event)
        if not self._eager and isinstance(event, Token):
            return
        with self._lock:
            if self._waking:
                return
            self._waking = True
        self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._waking = False
        self._ready.set()

    async def get(self, timeout: float) -> Event | None:
        # A wake-up can be stale: scheduled for an event that an earlier ``get`` already read
        # without waiting. It then finds nothing, and the wait goes on until ``timeout`` is spent.
        deadline = time.monotonic() + timeout
        while not self._items:
            self._ready.clear()
            if self._items:  # put since the first look
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout=remaining)
        return self._items.popleft()


class Completion:
    """One admitted completion; create it on the asyncio loop that will read ``deltas()``.

    Creating it admits the request (``CompletionService.submit``), so a refusal raises here,
    before any response is started.
    """

    def __init__(self, service: CompletionService, params: CompletionParams) -> None:
        self.service = service
        self.params = params
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.logprobs: list[tuple[int, TokenLogprob]] = []
        """(token, its log probability and the top ones) for each text token, when asked for."""
        self.arrival = time.monotonic()
        # Text is read before the end only to stream it or to look for a stop string.
        self._inbox = _Inbox(asyncio.get_running_loop(), eager=bool(params.stream or params.stop))
        self._job = service.submit(
            params.prompt_ids,
            params.max_tokens,
            self._inbox.put,
            params.sampling,
            logprobs=params.logprobs,
            stop_ids=params.stop_ids,
            stop_at_eos=not params.ignore_eos,
        )
        service.metrics.request_started()

    def abandon(self) -> None:
        """Give up on a completion whose ``deltas()`` never started (its client went away first)."""
        self.service.cancel(self._job)
        self.service.metrics.request_finished(
            RequestObservation(len(self.params.prompt_ids), 0, None, [], "cancelled", "client_gone")
        )

    async def _next_event(self) -> Event:
        while True:
            event = await self._inbox.get(timeout=1.0)
            if event is not None:
                return event
            if not self.service.alive:
                return Failed("the engine thread stopped before this request finished.", "engine_stopped")

    async def deltas(self) -> AsyncGenerator[str, None]:
        """Yield text deltas; raise a 500 ``RequestError`` when the engine fails this request."""
        service, params = self.service, self.params
        ids: list[int] = []  # generated ids that are text (EOS and end-of-turn ids excluded)
        ends = {service.eos_id, *params.stop_ids}
        times: list[float] = []
        sent = 0
        status: Literal["ok", "error", "cancelled"] = "cancelled"
        reason = "client_gone"
        try:
            while self.finish_reason is None:
                event = await self._next_event()
                if isinstance(event, Failed):
                    status, reason = "error", event.reason
                    raise RequestError(event.message, status=500, code=event.reason, counted=True)
                if isinstance(event, Token):
                    times.append(event.at)
                    self.completion_tokens = len(times)  # so far: a stream's continuous usage reads it
                    if event.token not in ends:
                        ids.append(event.token)
                        if event.logprob is not None:
                            self.logprobs.append((event.token, event.logprob))
                    if not (params.stream or params.stop):
                        continue  # nothing to show or check before the end: decode once, then
                    text = service.tokenizer.decode(ids)
                    safe, hit = stop_scan(text, params.stop)
                    if hit:
                        service.cancel(self._job)
                        self.finish_reason = "stop"
                else:
                    text = service.tokenizer.decode(ids)
                    safe, hit = stop_scan(text, params.stop)
                    if not hit:
                        safe = len(text)
                    self.finish_reason = "length" if event.reason == "length" else "stop"
                if safe > sent:
                    yield text[sent:safe]
                    sent = safe
            status, reason = "ok", self.finish_reason
        finally:
            if self.finish_reason is None or status != "ok":
                service.cancel(self._job)
            self.completion_tokens = len(times)
            ttft = times[0] - self.arrival if times else None
            itls = [b - a for a, b in itertools.pairwise(times)]
            service.metrics.request_finished(
                RequestObservation(len(params.prompt_ids), len(times), ttft, itls, status, reason)
            )
            if status == "ok" and times and service.trace is not None:
                service.trace.record(len(params.prompt_ids), len(times), self.arrival)
