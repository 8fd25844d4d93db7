"""Plain-HTTP GETs on loopback as a kubelet's probe makes them: a new connection each time.

The tests poll health, readiness and metrics endpoints thousands of times (each local pod's
readiness every second, each operator's ``/healthz`` while it starts). ``httpx.get`` builds a
client, and with it an SSL context, for every call, even to a plain ``http://`` address: about
20 ms of CPU each, a fifth of the e2e fleet loop's test process. ``http.client`` builds none.
"""

from __future__ import annotations

import http.client

__all__ = ["get"]


def get(port: int, path: str, timeout: float) -> tuple[int, str] | None:
    """``GET http://127.0.0.1:{port}{path}``: (status, body), or None when nothing answered in time."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
