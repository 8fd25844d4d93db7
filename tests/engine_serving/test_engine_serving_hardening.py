"""The engine server under hostile bodies, overload and failing builds (issue 9), over real HTTP.

Each case here once reset connections, hung, printed a traceback or failed its neighbours.
The hot path is the deterministic ``CountingHotPath`` of test_engine_serving_http.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator

import aiohttp
import httpx
import pytest

from engine_serving.test_engine_serving_http import BUILD, CountingHotPath, _by_reason, _families, _service
from polymorph_engine.serving.server import EngineServer, make_server
from polymorph_engine.serving.service import CompletionService


@pytest.fixture
def slow() -> Iterator[tuple[EngineServer, CompletionService]]:
    """A server whose steps take 20 ms, admitting 2 running + 2 queued requests."""
    service = _service(CountingHotPath(delay_s=0.02), max_batch=2)
    service.max_queue = 2
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    yield server, service
    server.close()
    service.close(grace_s=1)


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b'{"prompt": "a", "x": ' + b"[" * 100_000 + b"}", "recursion limit"),
        (b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}", "number out of range"),
        (b'{"prompt": "a", "max_tokens": 1e400}', "max_tokens"),
        (b'{"prompt": "a", "max_tokens": true}', "max_tokens"),
    ],
)
def test_hostile_bodies_get_one_line_400(
    slow: tuple[EngineServer, CompletionService], body: bytes, what: str
) -> None:
    server, _ = slow
    r = httpx.post(f"{server.url}/v1/completions", content=body, timeout=10)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert what in message and "\n" not in message
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_a_body_cut_short_of_its_length_is_not_parsed(slow: tuple[EngineServer, CompletionService]) -> None:
    server, _ = slow
    body = b'{"prompt": "a", "max_tokens": 2}'
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body) + 40}\r\n\r\n"
        sock.sendall(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)  # the client stops short of its Content-Length
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    # aiohttp drops a half-closed connection, so the 400 may not reach it; it is never served.
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    fams = _families(httpx.get(f"{server.url}/metrics").text)
    assert _by_reason(fams)[("invalid", "body_incomplete")] == 1
    assert (
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200
    )


def test_overload_is_503_with_retry_after_never_a_reset(slow: tuple[EngineServer, CompletionService]) -> None:
    server, service = slow

    async def burst() -> list[tuple[int, str | None]]:
        async with aiohttp.ClientSession() as session:

            async def one() -> tuple[int, str | None]:
                async with session.post(
                    f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 10}
                ) as r:
                    await r.read()
                    return r.status, r.headers.get("Retry-After")

            return await asyncio.gather(*(one() for _ in range(40)))

    answers = asyncio.run(burst())  # a reset or a hang would raise or time out here
    statuses = [s for s, _ in answers]
    assert set(statuses) == {200, 503}, statuses
    assert statuses.count(200) >= service.capacity
    assert all(retry == "1" for s, retry in answers if s == 503)
    fams = _families(httpx.get(f"{server.url}/metrics").text)
    assert _by_reason(fams)[("error", "overloaded")] == statuses.count(503)
    assert httpx.get(f"{server.url}/readyz").status_code == 200
    assert service.in_flight == 0


def test_a_request_whose_prefill_raises_fails_alone(caplog: pytest.LogCaptureFixture) -> None:
    service = _service(CountingHotPath(delay_s=0.01, fail_on=ord("!")), max_batch=4)
    server = make_server(service, "127.0.0.1", 0)
    server.start()

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            good = asyncio.create_task(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 30}))
            await asyncio.sleep(0.1)  # the good one is decoding when the bad one is prefilled
            bad = await client.post("/v1/completions", json={"prompt": "x!", "max_tokens": 5})
            return await good, bad

    try:
        with caplog.at_level(logging.WARNING, logger="polymorph_engine.serving"):
            good, bad = asyncio.run(both())
        assert bad.status_code == 500 and "this request's prompt" in bad.json()["error"]["message"]
        assert good.status_code == 200 and len(good.json()["choices"][0]["text"]) == 30
        assert any(BUILD in r.getMessage() for r in caplog.records)
        assert service.ready
        fams = _families(httpx.get(f"{server.url}/metrics").text)
        assert _by_reason(fams)[("error", "build_failed")] == 1
        assert _by_reason(fams)[("ok", "length")] == 1
    finally:
        server.close()
        service.close(grace_s=1)


def test_a_batch_failure_says_so_keeps_waiting_requests_and_logs_the_build(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Decoding "e" raises: every request in that batch fails; the one still waiting for a slot runs.
    service = _service(CountingHotPath(delay_s=0.01, fail_on=ord("e")), max_batch=1)
    server = make_server(service, "127.0.0.1", 0)
    server.start()

    async def two() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first = asyncio.create_task(
                client.post("/v1/completions", json={"prompt": "a", "max_tokens": 10})
            )
            await asyncio.sleep(0.005)
            second = asyncio.create_task(
                client.post("/v1/completions", json={"prompt": "p", "max_tokens": 3})
            )
            return list(await asyncio.gather(first, second))

    try:
        with caplog.at_level(logging.ERROR, logger="polymorph_engine.serving"):
            first, second = asyncio.run(two())
        assert first.status_code == 500
        assert "whole batch of 1 requests" in first.json()["error"]["message"]
        assert second.status_code == 200 and second.json()["choices"][0]["text"] == "qrs"
        logged = [r.getMessage() for r in caplog.records]
        assert len(logged) == 1 and BUILD in logged[0] and "\n" not in logged[0]
        assert httpx.get(f"{server.url}/readyz").status_code == 200
    finally:
        server.close()
        service.close(grace_s=1)


def test_shutting_down_refuses_with_503_and_readyz_turns_503() -> None:
    service = _service(CountingHotPath())
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    try:
        service.close(grace_s=0)
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "a"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert httpx.get(f"{server.url}/readyz").status_code == 503
    finally:
        server.close()


def test_a_taken_port_is_refused_at_bind() -> None:
    first = EngineServer("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            EngineServer("127.0.0.1", first.port)
    finally:
        first.close()


def test_a_slow_body_gets_408_and_the_server_stays_responsive(
    slow: tuple[EngineServer, CompletionService], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("polymorph_engine.serving.server.BODY_TIMEOUT_S", 0.3)
    server, _ = slow
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        started = time.monotonic()
        assert httpx.get(f"{server.url}/healthz").status_code == 200  # not blocked by the slow one
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started < 5
