"""How an engine process is asked to stop: SIGTERM (the kubelet) or SIGINT (Ctrl-C).

``polymorph engine serve`` and ``polymorph sandbox engine`` both make a ``StopSignals`` before
their slow start-up (loading the model), so a signal that comes meanwhile still ends the process
in order rather than killing it, then ``wait()`` in the main thread while their servers run on
threads of their own, and shut those down after it returns.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["StopSignals"]


class StopSignals:
    """From construction on, SIGTERM and SIGINT mark the process as stopping instead of ending it.

    Make it in the main thread (only it may set signal handlers); ``wait()`` returns once either
    signal came, at once when one came before it was called.
    """

    POLL_S = 0.5
    """How often ``wait`` wakes: the main thread runs signal handlers between its waits."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping.set()

    def stop(self) -> None:
        """Stop as a signal would (from any thread): the engine itself cannot go on."""
        self._stopping.set()

    def wait(self) -> None:
        """Block until SIGTERM or SIGINT came."""
        while not self._stopping.wait(self.POLL_S):
            pass
