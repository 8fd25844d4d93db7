"""How a request's events reach its asyncio loop (``completion._Inbox``): the loop is woken for
the events its reader needs, at most once at a time, and every event arrives, in order.

A wake-up is a switch to the loop thread on the engine thread's path, so a plain completion
(no stream, no stop strings) must not pay one per token: only its last event wakes the loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from polymorph_engine.serving.completion import _Inbox
from polymorph_engine.serving.events import Event, Failed, Finished, Token


class CountingLoop:
    """The running loop, counting ``call_soon_threadsafe`` (the wake-ups the engine thread schedules)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls = 0

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> Any:
        self.calls += 1
        return self.loop.call_soon_threadsafe(callback, *args)

    def as_loop(self) -> asyncio.AbstractEventLoop:
        return cast(asyncio.AbstractEventLoop, self)


async def _drain(inbox: _Inbox, n: int) -> list[Event]:
    out: list[Event] = []
    while len(out) < n:
        event = await inbox.get(timeout=5.0)
        assert event is not None, f"only {len(out)} of {n} events arrived"
        out.append(event)
    return out


def test_a_plain_completion_wakes_the_loop_only_for_its_last_event() -> None:
    async def main() -> tuple[int, list[Event]]:
        loop = CountingLoop(asyncio.get_running_loop())
        inbox = _Inbox(loop.as_loop(), eager=False)
        events: list[Event] = [Token(i, float(i)) for i in range(50)]
        events.append(Finished("length", 50.0))
        engine = threading.Thread(target=lambda: [inbox.put(e) for e in events])
        engine.start()
        got = await _drain(inbox, len(events))
        engine.join()
        return loop.calls, got

    calls, got = asyncio.run(main())
    assert calls == 1
    assert got[:-1] == [Token(i, float(i)) for i in range(50)] and got[-1] == Finished("length", 50.0)


def test_a_failure_wakes_a_plain_completion() -> None:
    async def main() -> tuple[int, list[Event]]:
        loop = CountingLoop(asyncio.get_running_loop())
        inbox = _Inbox(loop.as_loop(), eager=False)
        threading.Thread(
            target=lambda: [inbox.put(Token(1, 0.0)), inbox.put(Failed("boom", "build_failed"))]
        ).start()
        return loop.calls, await _drain(inbox, 2)

    calls, got = asyncio.run(main())
    assert got == [Token(1, 0.0), Failed("boom", "build_failed")] and calls == 1


def test_a_streamed_completion_is_woken_for_its_tokens_at_most_once_at_a_time() -> None:
    async def main() -> tuple[int, int, list[Event]]:
        loop = CountingLoop(asyncio.get_running_loop())
        inbox = _Inbox(loop.as_loop(), eager=True)
        # Put from the loop's own thread, so no wake-up runs in between: they coalesce into one.
        for i in range(10):
            inbox.put(Token(i, float(i)))
        coalesced = loop.calls
        got = await _drain(inbox, 10)
        await asyncio.sleep(0)  # the one wake-up runs
        # A token put once the last wake-up ran schedules a new one.
        for i in range(10, 13):
            engine = threading.Thread(target=inbox.put, args=(Token(i, float(i)),))
            engine.start()
            engine.join()
            got += await _drain(inbox, 1)
            await asyncio.sleep(0)
        return coalesced, loop.calls, got

    coalesced, calls, got = asyncio.run(main())
    assert got == [Token(i, float(i)) for i in range(13)]
    assert coalesced == 1 and calls == 4


def test_no_event_within_the_timeout_is_none() -> None:
    async def main() -> Event | None:
        inbox = _Inbox(asyncio.get_running_loop(), eager=False)
        inbox.put(Token(1, 0.0))  # a token alone never wakes a plain completion, but it is there
        assert await inbox.get(timeout=0.05) == Token(1, 0.0)
        return await inbox.get(timeout=0.05)

    assert asyncio.run(main()) is None


@pytest.mark.parametrize("eager", [False, True])
def test_events_from_a_busy_engine_thread_all_arrive_in_order(eager: bool) -> None:
    async def main() -> list[Event]:
        inbox = _Inbox(asyncio.get_running_loop(), eager=eager)
        n = 5000
        events: list[Event] = [Token(i, float(i)) for i in range(n)]
        events.append(Finished("stop", float(n)))
        engine = threading.Thread(target=lambda: [inbox.put(e) for e in events])
        engine.start()
        got = await _drain(inbox, len(events))
        engine.join()
        return got

    got = asyncio.run(main())
    assert [e.token for e in got[:-1] if isinstance(e, Token)] == list(range(5000))
    assert isinstance(got[-1], Finished)


def test_a_stale_wake_up_does_not_end_the_wait_early() -> None:
    """A wake-up scheduled for an event that was read without waiting finds nothing when it runs;
    the reader keeps waiting for the next event, within its timeout, rather than returning None."""

    async def main() -> Event | None:
        loop = asyncio.get_running_loop()
        inbox = _Inbox(loop, eager=True)
        inbox.put(Token(0, 0.0))  # schedules a wake-up, which has not run yet
        assert await inbox.get(timeout=5.0) == Token(0, 0.0)  # read without waiting
        loop.call_later(0.05, inbox.put, Token(1, 1.0))  # the next event comes after the stale wake-up
        return await inbox.get(timeout=5.0)

    assert asyncio.run(main()) == Token(1, 1.0)
