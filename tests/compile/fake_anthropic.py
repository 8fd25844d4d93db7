"""A local HTTP server that speaks the Anthropic Messages API (``POST /v1/messages``), for tests.

The real ``anthropic`` SDK talks to it through ``ANTHROPIC_BASE_URL`` (or ``base_url``). Each
request is checked for the API key (``x-api-key``, or ``Authorization: Bearer`` as SDK 2.x
sends it) and recorded; the answer comes from ``brain(request, n)``, a function of the request
body and its index that returns ``(status, body, headers)``. Helpers build message and error
bodies exactly as the API does. Nothing in the SDK is patched.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, Any], dict[str, str]]
Brain = Callable[[dict[str, Any], int], Reply]

_ids = itertools.count(1)


def message(
    content: list[dict[str, Any]], stop_reason: str = "tool_use", usage: tuple[int, int] = (1000, 200)
) -> Reply:
    """A 200 answer holding one assistant message."""
    body = {
        "id": f"msg_{next(_ids):08d}",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }
    return 200, body, {}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool_use(name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):08d}", "name": name, "input": tool_input}


def error(status: int, kind: str, msg: str) -> Reply:
    """An API error body; the SDK retries 408/409/429/5xx (here after 5 ms)."""
    return status, {"type": "error", "error": {"type": kind, "message": msg}}, {"retry-after-ms": "5"}


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool_result blocks of the request's last user message."""
    last = request["messages"][-1]
    if last["role"] != "user" or isinstance(last["content"], str):
        return []
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        return "".join(c.get("text", "") for c in content)
    return str(content)


@dataclass
class FakeAnthropic:
    """The server; use as a context manager. ``url`` is what ANTHROPIC_BASE_URL should be."""

    api_key: str
    brain: Brain
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def __enter__(self) -> FakeAnthropic:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.split("?")[0] != "/v1/messages":
                    return self._send(*error(404, "not_found_error", f"no route {self.path}"))
                auth = self.headers.get("x-api-key") or ""
                bearer = self.headers.get("authorization") or ""
                if auth != fake.api_key and bearer != f"Bearer {fake.api_key}":
                    return self._send(
                        401,
                        {
                            "type": "error",
                            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
                        },
                        {},
                    )
                with lock:
                    n = len(fake.requests)
                    fake.requests.append(body)
                    fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                self._send(*fake.brain(body, n))

            def _send(self, status: int, doc: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("request-id", f"req_{next(_ids)}")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
