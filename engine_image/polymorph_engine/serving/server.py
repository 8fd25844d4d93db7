"""The engine's HTTP server (aiohttp): OpenAI-compatible completions and chat over one hot path, probes,
metrics.

Contract:
- ``EngineServer(host, port)`` binds and listens at once (backlog ``BACKLOG``), so a taken or
  forbidden port is an ``OSError`` before any model loads; ``start()`` then serves on a
  background event-loop thread and ``close()`` stops it, letting answers in progress end.
  ``make_server(service, host, port, admin=None)`` does both steps but ``start()``.
- Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (plain JSON, or SSE
  through aiohttp's ``StreamResponse`` ending ``data: [DONE]``), ``GET /v1/models``,
  ``GET /v1/models/{id}``, ``GET /healthz`` (also ``GET /health``, vLLM's name, which clients
  such as GuideLLM probe), ``GET /readyz`` and ``GET /metrics``; any other path is a 404 that
  lists these.
- One pipeline for both endpoints: a request is parsed into its choices (``openai_api``; a
  chat's messages rendered with the checkpoint's template by ``serving.chat``), each choice is
  a ``Completion`` (admission, metrics, trace: a chat choice counts as a completion whose
  prompt is the rendered text), and only the response shape differs. A stream sends a chat's
  role delta first, then each choice's deltas as they come, each choice's finish reason, usage
  when ``stream_options.include_usage`` (and the usage so far in every chunk with vLLM's
  ``stream_options.continuous_usage_stats``), then ``[DONE]``. Paths under ``/admin/`` are answered by ``admin`` (sandbox mode, called
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

from polymorph_engine.runtime.scheduler import TokenLogprob
from polymorph_engine.serving.chat import chat_messages, render_chat
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
from polymorph_engine.serving.openai_api import (
    CompletionParams,
    RequestError,
    TextTokenizer,
    parse_chat_request,
    parse_completion_request,
)
from polymorph_engine.serving.service import CompletionService

__all__ = [
    "BODY_TIMEOUT_S",
    "ENDPOINTS",
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
            if request.path in _GENERATION_PATHS and service is not None and not err.counted:
                service.metrics.request_refused(err.status, err.reason)
            return error_response(err)
        except web.HTTPNotFound:
            return error_response(
                RequestError(
                    f"there is no endpoint {request.method} {request.path[:200]} here; the endpoints are "
                    f"{', '.join(ENDPOINTS)}.",
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
            if request.path in _GENERATION_PATHS and service is not None:
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

    def model_doc(svc: CompletionService, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": svc.created,
            "owned_by": "polymorph",
            "build": svc.build_id,
        }

    async def models(_: web.Request) -> web.Response:
        svc = the_service()
        return json_response(
            200, {"object": "list", "data": [model_doc(svc, name) for name in svc.model_names]}
        )

    async def model(request: web.Request) -> web.Response:
        svc = the_service()
        name = request.match_info["name"]
        if name not in svc.model_names:
            raise RequestError(
                f"the model {name[:100]!r} is not served here; use one of: {', '.join(svc.model_names)}.",
                param="model",
                status=404,
                code="model_not_found",
            )
        return json_response(200, model_doc(svc, name))

    async def completions(request: web.Request) -> web.StreamResponse:
        svc = the_service()
        body = await _read_body(request, MAX_COMPLETION_BODY)
        choices = parse_completion_request(
            body,
            tokenizer=svc.tokenizer,
            vocab_size=svc.vocab_size,
            max_seq_len=svc.max_seq_len,
            model_names=svc.model_names,
        )
        return await _answer(request, svc, choices, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        svc = the_service()
        chat = getattr(svc.tokenizer, "chat_format", None)
        if chat is None:
            raise RequestError(
                "this model's checkpoint has no chat template (no chat_template in tokenizer_config.json and "
                "no chat_template.jinja); use /v1/completions.",
                status=404,
                code="no_chat_template",
            )
        body = await _read_body(request, MAX_COMPLETION_BODY)
        choices = parse_chat_request(
            body,
            render=lambda raw: render_chat(chat, chat_messages(raw)),
            tokenizer=svc.tokenizer,
            stop_ids=chat.end_of_turn_ids,
            max_seq_len=svc.max_seq_len,
            model_names=svc.model_names,
        )
        return await _answer(request, svc, choices, chat=True)

    async def admin_call(request: web.Request) -> web.Response:
        if admin is None:
            raise web.HTTPNotFound()
        body = await _read_body(request, MAX_ADMIN_BODY)
        status, doc = await asyncio.to_thread(admin.handle, request.method, request.path, body)
        return json_response(status, doc)

    app = web.Application(middlewares=[errors], client_max_size=MAX_ADMIN_BODY)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/health", healthz)  # vLLM's name for it, which clients (GuideLLM) probe
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{name}", model)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_route("*", "/admin/{tail:.*}", admin_call)
    return app


_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
ENDPOINTS = (
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "GET /v1/models",
    "GET /v1/models/{id}",
    "GET /health",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
)
"""The routes served (``/admin/`` too in sandbox mode), as a 404 lists them."""


async def _answer(
    request: web.Request, svc: CompletionService, choices: tuple[CompletionParams, ...], *, chat: bool
) -> web.StreamResponse:
    """Admit every choice (all or none), then answer as one JSON body or as a stream."""
    first = choices[0]
    head = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": first.model,
    }
    admitted: list[Completion] = []
    try:  # admission: a refusal raises before any answer starts
        for params in choices:
            admitted.append(Completion(svc, params))
    except RequestError:
        for completion in admitted:
            completion.abandon()
        raise
    if first.stream:
        head["object"] = "chat.completion.chunk" if chat else "text_completion"
        return await _stream(request, admitted, head, chat)
    texts = await asyncio.gather(*(_collect(c) for c in admitted), return_exceptions=True)
    for text in texts:
        if isinstance(text, BaseException):
            raise text
    out = []
    for completion, text in zip(admitted, texts, strict=True):
        assert isinstance(text, str)
        params, lp = completion.params, completion.logprobs
        if chat:
            choice: dict[str, Any] = {
                "index": params.index,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": _chat_logprobs(svc.tokenizer, lp) if params.logprobs is not None else None,
                "finish_reason": completion.finish_reason,
            }
        else:
            echo = params.echo or ""
            choice = {
                "index": params.index,
                "text": echo + text,
                "logprobs": _text_logprobs(svc.tokenizer, lp, len(echo))
                if params.logprobs is not None
                else None,
                "finish_reason": completion.finish_reason,
            }
        out.append(choice)
    return json_response(200, {**head, "choices": out, "usage": _usage(admitted)})


async def _collect(completion: Completion) -> str:
    async with contextlib.aclosing(completion.deltas()) as deltas:
        return "".join([d async for d in deltas])


async def _stream(
    request: web.Request, completions: list[Completion], head: dict[str, Any], chat: bool
) -> web.StreamResponse:
    """SSE: one event per text delta, each choice's finish reason, usage when asked, then ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
    except BaseException:  # the client went away (or the handler was cancelled) before the first byte
        for completion in completions:
            completion.abandon()
        raise
    try:
        return await _events(response, completions, head, chat)
    except ConnectionError:  # the client went away mid-stream; its request is cancelled
        return response


async def _events(
    response: web.StreamResponse, completions: list[Completion], head: dict[str, Any], chat: bool
) -> web.StreamResponse:
    tokenizer = completions[0].service.tokenizer

    continuous = completions[0].params.continuous_usage

    async def event(doc: Any) -> None:
        if continuous and "choices" in doc and "usage" not in doc:  # vLLM's continuous_usage_stats
            doc = {**doc, "usage": _usage(completions)}
        await response.write(b"data: " + json.dumps(doc).encode() + b"\n\n")

    sent = [0] * len(completions)  # logprobs entries already sent, per choice

    def chunk(i: int, text: str | None, finish: str | None = None) -> dict[str, Any]:
        completion = completions[i]
        params = completion.params
        new = completion.logprobs[sent[i] :]
        sent[i] = len(completion.logprobs)
        choice: dict[str, Any] = {"index": params.index}
        if chat:
            choice["delta"] = {} if text is None else {"content": text}
            choice["logprobs"] = (
                _chat_logprobs(tokenizer, new) if params.logprobs is not None and new else None
            )
        else:
            choice["text"] = text or ""
            lp = _text_logprobs(tokenizer, new, 0) if params.logprobs is not None and new else None
            choice["logprobs"] = lp
        choice["finish_reason"] = finish
        return {**head, "choices": [choice]}

    queue: asyncio.Queue[tuple[int, str | None, RequestError | None]] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async with contextlib.aclosing(completions[i].deltas()) as deltas:
                async for delta in deltas:
                    await queue.put((i, delta, None))
            await queue.put((i, None, None))
        except RequestError as err:
            await queue.put((i, None, err))

    for i, completion in enumerate(completions):  # the role first (chat), or the echoed prompt
        if chat:
            role = {"index": completion.params.index, "delta": {"role": "assistant", "content": ""}}
            await event({**head, "choices": [{**role, "logprobs": None, "finish_reason": None}]})
        elif completion.params.echo:
            await event(chunk(i, completion.params.echo))
    tasks = [asyncio.create_task(pump(i)) for i in range(len(completions))]
    try:
        left = len(completions)
        while left:
            i, delta, err = await queue.get()
            if err is not None:  # the status line is gone; report in-band, as OpenAI does
                await event(err.body())
                break
            if delta is None:
                left -= 1
                await event(chunk(i, None, completions[i].finish_reason))
            else:
                await event(chunk(i, delta))
        else:
            if completions[0].params.include_usage:
                await event({**head, "choices": [], "usage": _usage(completions)})
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _token_bytes(tokenizer: TextTokenizer, token: int) -> bytes:
    own = getattr(tokenizer, "token_bytes", None)
    return bytes(own(token)) if own is not None else tokenizer.decode([token]).encode("utf-8")


def _chat_logprobs(tokenizer: TextTokenizer, entries: list[tuple[int, TokenLogprob]]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = _token_bytes(tokenizer, token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    content = [
        {**one(token, lp), "top_logprobs": [one(t, v) for t, v in top]} for token, (lp, top) in entries
    ]
    return {"content": content, "refusal": None}


def _text_logprobs(
    tokenizer: TextTokenizer, entries: list[tuple[int, TokenLogprob]], offset: int
) -> dict[str, Any]:
    """OpenAI's completions ``logprobs``: tokens, token_logprobs, top_logprobs and text_offset."""

    def text(token: int) -> str:
        return _token_bytes(tokenizer, token).decode("utf-8", errors="replace")

    tokens = [text(token) for token, _ in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, (lp, _) in entries],
        "top_logprobs": [{text(t): v for t, v in top} for _, (_, top) in entries],
        "text_offset": offsets,
    }


def _usage(completions: list[Completion]) -> dict[str, int]:
    prompts = {c.params.prompt_index: len(c.params.prompt_ids) for c in completions}  # each prompt once
    prompt = sum(prompts.values())
    generated = sum(c.completion_tokens for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


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
