"""The engine's HTTP server: OpenAI-compatible completions over one hot path, plus probes and metrics.

Contract:
- ``make_server(service, host, port, admin=None)`` binds a ``ThreadingHTTPServer`` with routes
  ``POST /v1/completions`` (plain and SSE streaming ending ``data: [DONE]``), ``GET /v1/models``,
  ``GET /healthz``, ``GET /readyz`` and ``GET /metrics``. Paths under ``/admin/`` are answered
  by ``admin`` (sandbox mode) and are 404 when it is None (serve mode).
- Requests are parsed by ``polymorph_engine.serving.openai_api``; bad requests get its OpenAI-shaped
  JSON error naming the field (``param``). Completions run through a ``CompletionService``
  (``polymorph_engine.serving.service``); HTTP threads never touch the scheduler.

It only gathers inputs, calls the service and writes responses. It knows nothing about how a
build computes, where weights come from or how a build was fetched: ``server_cli`` assembles
those and hands in a ready service.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from polymorph_engine.serving.metrics import CONTENT_TYPE_LATEST
from polymorph_engine.serving.openai_api import CompletionParams, RequestError, parse_completion_request
from polymorph_engine.serving.service import CompletionService, Outcome, generate

__all__ = ["AdminRoutes", "EngineHTTPServer", "make_server"]

MAX_BODY_BYTES = 64 * 1024 * 1024  # admin calls carry build archives


# --- HTTP ------------------------------------------------------------------------------------


class AdminRoutes(Protocol):
    """Sandbox-mode endpoints under ``/admin/``; absent (404) in serve mode."""

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """Answer one admin call: HTTP status and a JSON-able body. Raise ``RequestError`` to refuse."""
        ...

    def ready(self) -> bool: ...


class EngineHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server holding the completion service and, in sandbox mode, admin routes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], service: CompletionService | None, admin: AdminRoutes | None
    ) -> None:
        super().__init__(address, _Handler)
        self.service = service
        self.admin = admin
        self._thread: threading.Thread | None = None
        self._active = 0
        self._active_lock = threading.Condition()

    def handler_started(self) -> None:
        with self._active_lock:
            self._active += 1

    def handler_finished(self) -> None:
        with self._active_lock:
            self._active -= 1
            self._active_lock.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is being answered (e.g. a stream writing its last events)."""
        with self._active_lock:
            return self._active_lock.wait_for(lambda: self._active == 0, timeout=timeout_s)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{self.port}"

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests, and callers that own the main thread)."""
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="polymorph-http", daemon=True
        )
        self._thread.start()
        return self._thread

    def close(self) -> None:
        """Stop serving and release the socket (the service is closed by its owner)."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=10)
        self.server_close()


def make_server(
    service: CompletionService | None,
    host: str = "127.0.0.1",
    port: int = 8000,
    admin: AdminRoutes | None = None,
) -> EngineHTTPServer:
    """Bind the engine's HTTP server; call ``serve_forever()`` or ``start()`` on the result."""
    return EngineHTTPServer((host, port), service, admin)


class _Handler(BaseHTTPRequestHandler):
    server: EngineHTTPServer
    body: bytes = b""
    protocol_version = "HTTP/1.1"
    server_version = "polymorph-engine"
    timeout = 300  # idle keep-alive connections are dropped after this many seconds

    def log_message(self, format: str, *args: Any) -> None:
        pass  # access logs would drown the engine's own; metrics cover traffic

    # -- plumbing ---------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode())

    def _error(self, err: RequestError) -> None:
        self._json(err.status, err.body())

    def _read_body(self) -> bytes:
        """The whole request body, read before any answer so a kept-alive connection stays in sync."""
        length = self.headers.get("Content-Length")
        if length is None and self.command != "POST":
            return b""
        if length is None or not length.isdigit():
            self.close_connection = True  # we cannot tell where this body ends
            raise RequestError(
                "the request needs a Content-Length header (chunked bodies are not supported).", status=411
            )
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes.", status=413)
        return self.rfile.read(int(length))

    def _not_found(self) -> None:
        self._error(
            RequestError(
                f"there is no endpoint {self.command} {self.path} here.", status=404, code="not_found"
            )
        )

    # -- routes -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", "/healthz"): lambda: self._json(200, {"status": "ok"}),
            ("GET", "/readyz"): self._readyz,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/completions"): self._completions,
        }
        self.server.handler_started()
        try:
            self.body = self._read_body()
            if path.startswith("/admin/") and self.server.admin is not None:
                status, doc = self.server.admin.handle(method, path, self.body)
                self._json(status, doc)
            elif (method, path) in routes:
                routes[(method, path)]()
            elif any(p == path for _, p in routes):
                self._error(RequestError(f"{path} does not accept {method}.", status=405))
            else:
                self._not_found()
        except RequestError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.server.handler_finished()

    def _service(self) -> CompletionService:
        if self.server.service is None:
            raise RequestError(
                "this engine serves no model (sandbox admin only).", status=404, code="not_found"
            )
        return self.server.service

    def _readyz(self) -> None:
        service, admin = self.server.service, self.server.admin
        ready = (service is None or service.ready) and (admin is None or admin.ready())
        body: dict[str, Any] = {"status": "ready" if ready else "not ready"}
        if service is not None:
            body["build"] = service.build_id
        self._json(200 if ready else 503, body)

    def _metrics(self) -> None:
        self._send(200, self._service().metrics.render(), CONTENT_TYPE_LATEST)

    def _models(self) -> None:
        service = self._service()
        data = [
            {
                "id": name,
                "object": "model",
                "created": service.created,
                "owned_by": "polymorph",
                "build": service.build_id,
            }
            for name in service.model_names
        ]
        self._json(200, {"object": "list", "data": data})

    def _completions(self) -> None:
        service = self._service()
        params = parse_completion_request(
            self.body,
            tokenizer=service.tokenizer,
            vocab_size=service.vocab_size,
            max_seq_len=service.max_seq_len,
            model_names=service.model_names,
        )
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": params.model,
        }
        outcome = Outcome()
        if params.stream:
            self._stream(service, params, head, outcome)
            return
        text = "".join(generate(service, params, outcome))
        usage = _usage(params, outcome)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
        self._json(200, {**head, "choices": [choice], "usage": usage})

    def _stream(
        self, service: CompletionService, params: CompletionParams, head: dict[str, Any], outcome: Outcome
    ) -> None:
        if not service.ready:  # refuse while a status line can still say so
            raise RequestError("the engine is shutting down; retry on another replica.", status=503)
        deltas = generate(service, params, outcome)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for delta in deltas:
                self._event(
                    {
                        **head,
                        "choices": [{"index": 0, "text": delta, "logprobs": None, "finish_reason": None}],
                    }
                )
            last = {"index": 0, "text": "", "logprobs": None, "finish_reason": outcome.finish_reason}
            self._event({**head, "choices": [last]})
            if params.include_usage:
                self._event({**head, "choices": [], "usage": _usage(params, outcome)})
        except RequestError as err:  # the status line is gone; report in-band, as OpenAI does
            self._event(err.body())
        finally:
            deltas.close()  # cancels the request if the client went away mid-stream
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, doc: Any) -> None:
        self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _usage(params: CompletionParams, outcome: Outcome) -> dict[str, int]:
    prompt = len(params.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": prompt + outcome.completion_tokens,
    }
