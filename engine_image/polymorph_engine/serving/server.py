"""The engine's HTTP server (aiohttp): OpenAI-compatible completions over one hot path, probes, metrics.

Contract:
- ``EngineServer(host, port)`` binds and listens at once (backlog ``BACKLOG``), so a taken or
  forbidden port is an ``OSError`` before any model loads; ``start()`` then serves on a
  background event-loop thread and ``close()`` stops it, letting answers in progress end.
  ``make_server(service, host, port, admin=None)`` does both steps but ``start()``.
- Routes: ``POST /v1/completions`` (plain JSON, or SSE through aiohttp's ``StreamResponse``
  ending ``data: [DONE]``), ``GET /v1/models``, ``GET /healthz``, ``GET /readyz`` and
  ``GET /metrics``. Paths under ``/admin/`` are answered by ``admin`` (sandbox mode, called
  on a worker thread since an experiment takes seconds) and are 404 when it is None.
- Bodies: at most ``MAX_COMPLETION_BODY`` bytes for completions (``MAX_ADMIN_BODY`` for admin
  calls, which carry build archives), read within ``BODY_TIMEOUT_S``; larger is 413, slower
  is 408, a body cut short of its Content-Length is 400. Bodies are pydantic models
  (``polymorph_engine.serving.openai_api``), so depth and number size are bounded too, and
  every refusal is the OpenAI-shaped JSON error naming the field (``param``).
- HTTP itself (``serving.http``): a request line or header too large is 431, any other request
  that breaks HTTP 400, both as the OpenAI error JSON, logged without the client's bytes and
  counted. A connection that has not sent a whole request
  head within ``IDLE_TIMEOUT_S`` of opening or of its last answer is closed.
- Load: ``CompletionService`` admits a bounded number of requests; beyond it the answer is
  503 with ``Retry-After``, never a reset or a wait without bound. Every completion request
  answered with an error is counted in ``polymorph_requests_total`` by status and reason.
  A client that goes away cancels its request (aiohttp's handler cancellation).

Why aiohttp: kopf already depends on it, so the engine image gains no package; it is a
well-kept asyncio server with a C HTTP parser, bounded request reading and a streaming
response, which is what the OpenAI-compatible engines need of uvicorn + Starlette.

It only gathers inputs, calls the service and writes responses. It knows nothing about how a
build computes, where weights come from or how a build was fetched: ``serving.cli`` assembles
those and hands in a ready service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.client_exceptions import ClientPayloadError
from aiohttp.http_exceptions import HttpProcessingError

from polymorph_engine.serving.completion import Completion
from polymorph_engine.serving.http import (
    BACKLOG,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    ProtocolRunner,
    bind,
    error_response,
    json_response,
)
from polymorph_engine.serving.metrics import CONTENT_TYPE_LATEST
from polymorph_engine.serving.openai_api import CompletionParams, RequestError, parse_completion_request
from polymorph_engine.serving.service import CompletionService

__all__ = [
    "BODY_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "MAX_ADMIN_BODY",
    "MAX_COMPLETION_BODY",
    "AdminRoutes",
    "EngineServer",
    "make_app",
    "make_server",
]

log = logging.getLogger("polymorph_engine.serving")

MAX_COMPLETION_BODY = 4 * 1024 * 1024
MAX_ADMIN_BODY = 64 * 1024 * 1024  # admin calls carry build archives
BODY_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 15.0
"""A connection must finish a request's headers within this long of opening, or of its last
answer; an idle or half-sent connection is closed then (aiohttp's own default is an hour)."""


class AdminRoutes(Protocol):
    """Sandbox-mode endpoints under ``/admin/``; absent (404) in serve mode."""

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """Answer one admin call: HTTP status and a JSON-able body. Raise ``RequestError`` to refuse."""
        ...

    def ready(self) -> bool: ...


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes, within ``BODY_TIMEOUT_S``; ``RequestError`` otherwise."""
    if request.content_length is not None and request.content_length > limit:
        raise RequestError(
            f"the request body is larger than {limit} bytes.", status=413, code="body_too_large"
        )
    chunks: list[bytes] = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise RequestError(
                    f"the request body is larger than {limit} bytes.", status=413, code="body_too_large"
                )
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout=BODY_TIMEOUT_S)
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {BODY_TIMEOUT_S:.0f} s.", status=408, code="body_timeout"
        ) from None
    except (ClientPayloadError, HttpProcessingError, ConnectionError):  # a half-closed client lands here
        raise RequestError(
            "the request body ended before its Content-Length; send the whole body.", code="body_incomplete"
        ) from None
    return b"".join(chunks)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(service: CompletionService | None, admin: AdminRoutes | None = None) -> web.Application:
    """The aiohttp application: routes, body limits and the OpenAI error shape for every refusal."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as err:
            if request.path == "/v1/completions" and service is not None and not err.counted:
                service.metrics.request_refused(err.status, err.reason)
            return error_response(err)
        except web.HTTPNotFound:
            return error_response(
                RequestError(
                    f"there is no endpoint {request.method} {request.path} here.",
                    status=404,
                    code="not_found",
                )
            )
        except web.HTTPMethodNotAllowed:
            return error_response(
                RequestError(f"{request.path} does not accept {request.method}.", status=405)
            )
        except web.HTTPException:
            raise
        except Exception as exc:  # an engine bug: one line in the log, an OpenAI-shaped 500 to the client
            log.error("%s %s failed: %s: %s", request.method, request.path, type(exc).__name__, exc)
            bug = RequestError(f"the engine failed: {type(exc).__name__}: {exc}", status=500, code="internal")
            if request.path == "/v1/completions" and service is not None:
                service.metrics.request_refused(bug.status, bug.reason)
            return error_response(bug)

    def the_service() -> CompletionService:
        if service is None:
            raise RequestError(
                "this engine serves no model (sandbox admin only).", status=404, code="not_found"
            )
        return service

    async def healthz(_: web.Request) -> web.Response:
        return json_response(200, {"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ready = (service is None or service.ready) and (admin is None or admin.ready())
        body: dict[str, Any] = {"status": "ready" if ready else "not ready"}
        if service is not None:
            body["build"] = service.build_id
            trace = service.metrics.trace_counts()
            if trace:  # traces are sampled: whether they reach the store (serving goes on either way)
                body["trace"] = {
                    "written": trace["written"],
                    "dropped": trace["dropped"],
                    "writeErrors": trace["write_errors"],
                    "lastError": service.metrics.trace_error,
                }
        return json_response(200 if ready else 503, body)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=the_service().metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def models(_: web.Request) -> web.Response:
        svc = the_service()
        data = [
            {
                "id": name,
                "object": "model",
                "created": svc.created,
                "owned_by": "polymorph",
                "build": svc.build_id,
            }
            for name in svc.model_names
        ]
        return json_response(200, {"object": "list", "data": data})

    async def completions(request: web.Request) -> web.StreamResponse:
        svc = the_service()
        body = await _read_body(request, MAX_COMPLETION_BODY)
        params = parse_completion_request(
            body,
            tokenizer=svc.tokenizer,
            vocab_size=svc.vocab_size,
            max_seq_len=svc.max_seq_len,
            model_names=svc.model_names,
        )
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": params.model,
        }
        completion = Completion(svc, params)  # admission: a refusal raises before any answer starts
        if params.stream:
            return await _stream(request, completion, head)
        async with contextlib.aclosing(completion.deltas()) as deltas:
            text = "".join([d async for d in deltas])
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": completion.finish_reason}
        return json_response(200, {**head, "choices": [choice], "usage": _usage(params, completion)})

    async def admin_call(request: web.Request) -> web.Response:
        if admin is None:
            raise web.HTTPNotFound()
        body = await _read_body(request, MAX_ADMIN_BODY)
        status, doc = await asyncio.to_thread(admin.handle, request.method, request.path, body)
        return json_response(status, doc)

    app = web.Application(middlewares=[errors], client_max_size=MAX_ADMIN_BODY)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_route("*", "/admin/{tail:.*}", admin_call)
    return app


async def _stream(request: web.Request, completion: Completion, head: dict[str, Any]) -> web.StreamResponse:
    """SSE: one event per text delta, the finish reason, usage when asked, then ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
    except BaseException:  # the client went away (or the handler was cancelled) before the first byte
        completion.abandon()
        raise
    try:
        return await _events(response, completion, head)
    except ConnectionError:  # the client went away mid-stream; its request is cancelled
        return response


async def _events(
    response: web.StreamResponse, completion: Completion, head: dict[str, Any]
) -> web.StreamResponse:
    async def event(doc: Any) -> None:
        await response.write(b"data: " + json.dumps(doc).encode() + b"\n\n")

    async with contextlib.aclosing(completion.deltas()) as deltas:
        try:
            async for delta in deltas:
                choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": None}
                await event({**head, "choices": [choice]})
            last = {"index": 0, "text": "", "logprobs": None, "finish_reason": completion.finish_reason}
            await event({**head, "choices": [last]})
            if completion.params.include_usage:
                await event({**head, "choices": [], "usage": _usage(completion.params, completion)})
        except RequestError as err:  # the status line is gone; report in-band, as OpenAI does
            await event(err.body())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _usage(params: CompletionParams, completion: Completion) -> dict[str, int]:
    prompt = len(params.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": prompt + completion.completion_tokens,
    }


class EngineServer:
    """The aiohttp application on a socket bound at construction, served on its own loop thread."""

    def __init__(
        self,
        host: str,
        port: int,
        service: CompletionService | None = None,
        admin: AdminRoutes | None = None,
    ) -> None:
        self._sock = bind(host, port)
        self.service = service
        self.admin = admin
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = self._sock.getsockname()[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self, grace_s: float = 30.0) -> None:
        """Serve on a background thread; returns once requests are being accepted."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failure: list[BaseException] = []

        async def setup() -> None:
            runner = ProtocolRunner(
                make_app(self.service, self.admin),
                self.service.metrics if self.service is not None else None,
                handler_cancellation=True,
                access_log=None,
                keepalive_timeout=IDLE_TIMEOUT_S,
                max_line_size=MAX_HEADER_BYTES,
                max_field_size=MAX_HEADER_BYTES,
                max_headers=MAX_HEADERS,
            )
            await runner.setup()
            await web.SockSite(runner, self._sock, shutdown_timeout=grace_s, backlog=BACKLOG).start()
            self._runner = runner

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(setup())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=main, name="polymorph-http", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]

    def close(self) -> None:
        """Stop accepting, let answers in progress end (up to ``grace_s`` of ``start``), release the socket."""
        loop, runner = self._loop, self._runner
        if loop is not None and runner is not None and self._thread is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=120)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=10)
            loop.close()
        self._loop = self._runner = self._thread = None
        self._sock.close()


def make_server(
    service: CompletionService | None,
    host: str = "127.0.0.1",
    port: int = 8000,
    admin: AdminRoutes | None = None,
) -> EngineServer:
    """Bind the engine's HTTP server; call ``start()`` on the result."""
    return EngineServer(host, port, service, admin)
