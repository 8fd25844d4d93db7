"""Bounded polling on observable state, shared by the operator tests and the e2e.

Tests wait for what a process or server makes observable (a status field, an Event, a file),
never for a fixed time; a wait that runs out fails naming what it waited for and what it last saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["wait_for"]


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 30.0, every: float = 0.2) -> Any:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
