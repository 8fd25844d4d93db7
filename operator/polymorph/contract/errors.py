"""Exceptions whose message is one sentence for a person: shown as-is, never with a traceback.

``polymorph.cli`` is the one boundary that turns these, and the other error families a user can
cause (store, OS, validation, overflow, bad numbers), into one line and exit status 2;
``Interrupted`` (SIGINT or SIGTERM) into ``interrupted`` and 128 + the signal number.
"""

from __future__ import annotations

import signal


class UsageError(Exception):
    """Bad input from a person (a flag, a file, a manifest). The message names what and how to fix it."""


class StoreError(Exception):
    """The artifact store refused an operation (missing object, tampered build, bad configuration)."""


class BuildError(Exception):
    """A build directory is malformed (bad build.toml, missing entry module, unknown knob value)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM asked the command to stop; ``signum`` says which (the exit status is 128 + it).

    A ``KeyboardInterrupt``, so code that cleans up on Ctrl-C cleans up on SIGTERM too.
    """

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


__all__ = ["BuildError", "Interrupted", "StoreError", "UsageError"]
