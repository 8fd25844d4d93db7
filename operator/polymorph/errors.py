"""Exceptions whose message is one sentence for a person: shown as-is, never with a traceback."""


class UsageError(Exception):
    """Bad input from a person (a flag, a file, a manifest). The message names what and how to fix it."""


class StoreError(Exception):
    """The artifact store refused an operation (missing object, tampered build, bad configuration)."""


class BuildError(Exception):
    """A build directory is malformed (bad build.toml, missing entry module, unknown knob value)."""


__all__ = ["BuildError", "StoreError", "UsageError"]
