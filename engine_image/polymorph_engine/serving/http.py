"""HTTP itself, for the engine's server: the listening socket, JSON answers, and requests that break HTTP.

``bind`` makes the listening socket (backlog ``BACKLOG``). A request line or header over
``MAX_HEADER_BYTES``, or more than ``MAX_HEADERS`` headers, is 431, any other request that
breaks HTTP 400, both as the OpenAI error JSON (``protocol_refusal``), one log line that never
echoes the client's bytes, and a count in ``polymorph_http_protocol_errors_total``
(``ProtocolRunner`` serves connections that answer so). ``json_response`` and
``error_response`` are the JSON answers every route gives.

It knows nothing about completions or routes (``server`` owns those).
"""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler

from polymorph_engine.serving.openai_api import RequestError

__all__ = [
    "BACKLOG",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "ProtocolRunner",
    "bind",
    "error_response",
    "json_response",
    "protocol_refusal",
]

log = logging.getLogger("polymorph_engine.serving")

BACKLOG = 2048
"""Pending connections the kernel queues before accept: far above any burst a pod sees."""
MAX_HEADER_BYTES = 8190
"""The longest request line or header field; a longer one, or more than ``MAX_HEADERS``, is 431."""
MAX_HEADERS = 128


def json_response(status: int, doc: Any, headers: dict[str, str] | None = None) -> web.Response:
    """``doc`` as a JSON answer."""
    return web.Response(status=status, text=json.dumps(doc), content_type="application/json", headers=headers)


def error_response(err: RequestError) -> web.Response:
    """A refusal as the OpenAI-shaped JSON error (with ``Retry-After`` when it says when to retry)."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return json_response(err.status, err.body(), headers)


def protocol_refusal(exc: BaseException | None) -> RequestError:
    """What a request that broke HTTP itself gets: 431 for headers too large, else 400.

    The sentence names the limit, never the client's bytes (aiohttp's own messages echo them).
    """
    if isinstance(exc, LineTooLong) or (isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc)):
        return RequestError(
            f"the request line or headers are too large: at most {MAX_HEADERS} headers of at most "
            f"{MAX_HEADER_BYTES} bytes each.",
            status=431,
            code="headers_too_large",
        )
    kind = type(exc).__name__ if exc is not None else "BadHttpMessage"
    return RequestError(f"the request is not valid HTTP/1.1 ({kind}).", status=400, code="bad_http")


class _ProtocolHandler(RequestHandler):
    """aiohttp's connection handler, with the engine's answer to a request that broke HTTP: the
    OpenAI error JSON (431 or 400), one log line without the client's bytes, and a count in
    ``polymorph_http_protocol_errors_total`` (aiohttp's own logs a traceback and answers text)."""

    __slots__ = ()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        err = protocol_refusal(exc)
        metrics = getattr(self._manager, "protocol_metrics", None)
        if metrics is not None:
            metrics.protocol_error(err.reason)
        log.info("refused a request from %s: %s (%s)", request.remote, err.reason, type(exc).__name__)
        response = error_response(err)
        response.force_close()
        return response


class _ProtocolServer(web.Server):
    """Makes ``_ProtocolHandler`` connections; ``protocol_metrics`` counts their refusals."""

    protocol_metrics: Any = None

    def __call__(self) -> RequestHandler:
        return _ProtocolHandler(self, loop=self._loop, **self._kwargs)


class ProtocolRunner(web.AppRunner):
    def __init__(self, app: web.Application, metrics: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._protocol_metrics = metrics

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProtocolServer  # same layout: only __call__ and one class attribute differ
        server.protocol_metrics = self._protocol_metrics  # type: ignore[attr-defined]
        return server


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``OSError`` when it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
