"""A pod's ``/metrics`` for a real Prometheus to scrape: ``ServerMetrics`` served over HTTP by a
thread, on a free local port, with the content type the engine's server gives."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from polymorph_engine.serving.metrics import CONTENT_TYPE_LATEST, ServerMetrics

__all__ = ["MetricsEndpoint"]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        body = self.server.metrics.render()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    metrics: ServerMetrics


class MetricsEndpoint:
    """``metrics`` served at ``http://{address}/metrics`` until ``close``."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.metrics = metrics
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
