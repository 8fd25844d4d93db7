"""The command line's input policy: one type per kind of flag value, bounded file reading, and the
help formatter every command shares.

Every command (``compile``, ``experiment``, ``engine serve``, ``sandbox``, ``operator``) takes its
flags through these types, so a value means the same everywhere and a bad one gets the same
sentence: ``argparse`` prints ``polymorph <command>: argument --flag: <what is allowed; what was
given>`` and exits 2. Values are checked before they are used, and before anything large is read:

- ``duration()``: the one duration syntax (``polymorph.contract.api.parse_duration``), the same as manifests
  and the chart's values: a whole number and a unit ``ms``, ``s``, ``m``, ``h`` or ``d``. A
  negative value (``-5m``) is a value, not a flag (``Parser`` sees to that), and is refused as such.
- ``integer(lo, hi)`` and ``number(lo, hi)``: bounded whole and finite numbers; text longer than
  ``MAX_NUMBER_TEXT`` characters is refused before it is converted.
- ``name()`` (a DNS-1123 label) and ``http_url()`` (scheme, host and port checked).
- ``read_text(path, what)``: at most ``MAX_FILE_BYTES`` of a UTF-8 text file (``-`` is standard
  input), so ``/dev/zero`` or a huge file is one sentence, not a memory error.

One reading policy for every file format (YAML, JSON, JSON lines): a leading UTF-8 byte-order mark
is dropped by ``read_text`` whatever the format (editors on Windows write one; YAML allows it,
JSON does not), and a key an object sets twice is refused in JSON (``json_object``) as the YAML
reader (``polymorph.contract.yaml_input``) refuses it. Flags are never abbreviated: ``--max-exp``
is not ``--max-experiments`` (``Parser`` sets ``allow_abbrev=False`` for every command), so a
flag added later cannot change what an old command line means.

``HelpFormatter`` shows every flag's default: a flag whose help does not say its default gets
``(default: X)`` appended; ``Parser`` (the ``polymorph`` parser class) uses it.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from polymorph.contract.api.common import DNS_LABEL_PATTERN, parse_duration
from polymorph.contract.errors import UsageError

__all__ = [
    "BOM",
    "IMAGE_REFERENCE",
    "MAX_FILE_BYTES",
    "MAX_NUMBER_TEXT",
    "DuplicateKey",
    "HelpFormatter",
    "Parser",
    "check_http_url",
    "check_image",
    "duration",
    "http_url",
    "integer",
    "json_object",
    "name",
    "number",
    "read_text",
    "shown",
]

MAX_NUMBER_TEXT = 40
"""The longest text a number flag may be (a 64-bit integer has at most 20 digits)."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""The most bytes any input file (workload, manifest, key file) may hold."""
INT64_MAX = 2**63 - 1
BOM = "\ufeff"
"""The byte-order mark, as decoded: dropped at the start of any file, refused anywhere else by the parsers."""


class DuplicateKey(ValueError):
    """A JSON object names one key twice (``json_object``)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``json.loads``'s ``object_pairs_hook``: the object, or ``DuplicateKey`` for a key set twice
    (Python's ``json`` keeps the last silently; the YAML reader and the API server refuse it)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


# The image reference grammar of distribution/reference (what the kubelet and registries accept):
# [host[:port]/]path[:tag][@digest], path components lowercase, the whole name at most 255 characters.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_HOST}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>{_NAME})(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
"""A container image reference: ``registry.example:5000/team/engine:1.2`` or ``name@sha256:<hex>``."""


def check_image(text: str, flag: str) -> str:
    """``text`` if it is an image reference (``IMAGE_REFERENCE``), else ``UsageError`` naming ``flag``."""
    match = IMAGE_REFERENCE.fullmatch(text)
    if match is None or len(match.group("name")) > 255:
        raise UsageError(
            f"{flag} must be an image reference such as ghcr.io/polymorph/engine:0.1.0 "
            f"([registry/]path[:tag][@sha256:digest], the path in lowercase); got {shown(text)}"
        )
    return text


def shown(value: object, limit: int = 40) -> str:
    """``value`` quoted, cut to ``limit`` characters, for messages (input is never echoed whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _named(func: Callable[[str], object], kind: str) -> Callable[[str], object]:
    func.__name__ = kind  # argparse names the type in "invalid <name> value" for a ValueError
    return func


def duration(*, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse type: seconds in the one duration syntax (``30s``, ``500ms``, ``10m``)."""

    def parse(text: str) -> float:
        if allow_zero and re.fullmatch(r"0+(ms|s|m|h|d)", text):
            return 0.0
        try:
            return parse_duration(text)
        except ValueError as exc:
            zero = " (or 0s)" if allow_zero else ""
            raise argparse.ArgumentTypeError(f"{exc}{zero}") from None

    return _named(parse, "duration")  # type: ignore[return-value]


def integer(lo: int, hi: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse type: a whole number from ``lo`` to ``hi``."""

    def parse(text: str) -> int:
        allowed = f"a whole number from {lo} to {hi}"
        if len(text) > MAX_NUMBER_TEXT or not re.fullmatch(r"\s*[-+]?[0-9]+\s*", text):
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {shown(text)}")
        value = int(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {shown(text)}")
        return value

    return _named(parse, "integer")  # type: ignore[return-value]


def number(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from ``lo`` to ``hi`` (``lo`` excluded with ``lo_open``)."""

    def parse(text: str) -> float:
        allowed = f"a number {'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
        try:
            value = float(text) if len(text) <= MAX_NUMBER_TEXT else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {shown(text)}")
        return value

    return _named(parse, "number")  # type: ignore[return-value]


def name(what: str = "a name") -> Callable[[str], str]:
    """An argparse type: a DNS-1123 label (what Kubernetes takes as an object name and label value)."""

    def parse(text: str) -> str:
        if len(text) > 63 or not re.fullmatch(DNS_LABEL_PATTERN, text):
            raise argparse.ArgumentTypeError(
                f"must be {what}: at most 63 lowercase letters, digits and '-', starting and ending with a "
                f"letter or digit; got {shown(text)}"
            )
        return text

    return _named(parse, "name")  # type: ignore[return-value]


def check_http_url(text: str) -> str:
    """``text`` when it is an ``http(s)://host[:port][/path]`` URL; ``ValueError`` saying why not."""
    if len(text) > 2048:
        raise ValueError(f"must be an http(s):// URL of at most 2048 characters; got {shown(text)}")
    try:
        parts = urlsplit(text)
        port = parts.port  # raises for a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"must be an http(s):// URL ({exc}); got {shown(text)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or re.search(r"\s", text):
        raise ValueError(f"must be an http(s):// URL such as http://prometheus:9090; got {shown(text)}")
    if port == 0:
        raise ValueError(f"must be an http(s):// URL with a port from 1 to 65535; got {shown(text)}")
    return text


def http_url(text: str) -> str:
    """An argparse type for ``check_http_url``."""
    try:
        return check_http_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def read_text(path: str | Path, what: str = "", limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of ``path`` (``-``: standard input), at most ``limit`` bytes.

    ``UsageError`` (one sentence ``<what> <path>: <why>``) for a missing file, a directory, a file
    that cannot be read, one larger than ``limit`` or one that is not UTF-8. Never reads more
    than ``limit + 1`` bytes, whatever the file is (``/dev/zero``, a FIFO, a huge file).
    """
    where = f"{what} {path}".strip()
    try:
        if str(path) == "-":
            stdin = getattr(sys.stdin, "buffer", None)  # a text-only stand-in has no buffer
            data = stdin.read(limit + 1) if stdin is not None else sys.stdin.read(limit + 1).encode()
        else:
            file = Path(path)
            if file.is_dir():
                raise UsageError(f"{where}: is a directory; give a file")
            with file.open("rb") as stream:
                data = stream.read(limit + 1)
    except FileNotFoundError:
        raise UsageError(f"{where}: file not found") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > limit:
        raise UsageError(
            f"{where}: larger than {limit // (1024 * 1024)} MiB, the most an input file may hold"
        )
    try:
        return data.decode("utf-8").removeprefix(BOM)  # one policy for a BOM, whatever the format
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not a UTF-8 text file") from None


class HelpFormatter(argparse.HelpFormatter):
    """Shows every flag's default: help that does not mention one gets ``(default: X)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text
            or action.required
            or action.default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        if action.nargs == 0:  # a switch
            shown_default = "off" if not action.default else "on"
        elif action.default is None or action.default == []:
            shown_default = "none"
        else:
            shown_default = "%(default)s"
        return f"{text} (default: {shown_default})"


class Parser(argparse.ArgumentParser):
    """The parser class of every ``polymorph`` command.

    A usage error is one line and exit status 2; no flag is taken by a prefix of its name;
    help shows every default (``HelpFormatter``); and
    a value that starts with ``-`` and a digit (``-5m``, ``-1``) is a value, so the flag's type
    refuses it with the allowed range instead of argparse saying "expected one argument".
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs["allow_abbrev"] = False  # --max-exp is not --max-experiments, in every command
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = re.compile(r"^-[0-9.]")

    def error(self, message: str) -> None:  # type: ignore[override]
        """``error: --flag: why`` (or ``error: <command>: why`` when no one flag is at fault), exit 2."""
        text = message.removeprefix("argument ")
        self.exit(2, f"error: {text}\n" if text.startswith("-") else f"error: {self.prog}: {text}\n")
