"""Build directories: read ``build.toml``, resolve knobs, import the entry module, make variants.

A build is a directory holding ``build.toml`` and Python modules::

    [build]
    name = "reference"
    parent = ""                 # the build this one was derived from ("" or omitted: none)
    entry = "hotpath.py"        # the entry module (default hotpath.py)
    description = "..."
    notes = "..."               # optional free text

    [knobs.kv_cache]
    choices = ["concat", "static"]
    default = "concat"
    description = "..."         # optional

The entry module defines ``load(model, knobs) -> HotPath`` (see ``polymorph_engine.hotpath``).
It is imported as a fresh package ``polymorph_build_<n>_<hash>`` on every call, so two imports of
the same directory are two distinct modules; sibling modules are reached with relative imports
(``from . import layers``). The package stays in ``sys.modules`` only while it is live, because
torch.compile (dynamo) re-imports the modules it traces by name: ``load_hotpath`` removes it when
the hot path it returned is garbage-collected, and ``forget_build`` removes it at once. So nothing
accumulates across hundreds of hot reloads.

This module knows nothing about what a hot path computes, nor about the artifact store (a build's id
is the store's business). Every error about a build is a ``BuildError`` whose message is one sentence
naming the file and the field.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import itertools
import re
import shutil
import sys
import tomllib
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polymorph.errors import BuildError

if TYPE_CHECKING:
    from polymorph_engine.hotpath import HotPath
    from polymorph_engine.model import LoadedModel

__all__ = [
    "REFERENCE_BUILD",
    "BuildSpec",
    "Knob",
    "KnobValue",
    "forget_build",
    "format_knob_value",
    "import_build",
    "knob_variant",
    "load_hotpath",
    "read_build",
    "resolve_build_arg",
    "resolve_knobs",
]

REFERENCE_BUILD: Path = Path(__file__).resolve().parent / "builds" / "reference"

KnobValue = str | bool | int | float
_BUILD_KEYS = {"name", "parent", "entry", "description", "notes"}
_KNOB_KEYS = {"choices", "default", "description", "requires"}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_import_counter = itertools.count(1)


@dataclass(frozen=True)
class Knob:
    """One dimension of a build's search space: every value in ``choices`` must be correct."""

    choices: tuple[KnobValue, ...]
    default: KnobValue
    description: str = ""
    requires: dict[str, KnobValue] = field(default_factory=dict)
    """Other knobs' values without which this knob's non-default values change nothing
    (``decode_capture`` needs ``kv_cache = "static"``). A search applies them together."""


@dataclass(frozen=True)
class BuildSpec:
    """What ``build.toml`` declares, plus the directory it was read from."""

    name: str
    dir: Path
    entry: str = "hotpath.py"
    parent: str | None = None
    description: str = ""
    notes: str = ""
    knobs: dict[str, Knob] = field(default_factory=dict)

    def defaults(self) -> dict[str, KnobValue]:
        return {name: knob.default for name, knob in self.knobs.items()}


def format_knob_value(value: Any) -> str:
    """A knob value as TOML / a person writes it: ``true``, ``"static"`` -> ``static``, ``4``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _same(a: Any, b: Any) -> bool:
    # True == 1 in Python; a knob value must match in type as well as value.
    return type(a) is type(b) and a == b


def _is_knob_value(v: Any) -> bool:
    return isinstance(v, str | bool | int | float)


def read_build(dir: Path) -> BuildSpec:
    """Parse and validate ``<dir>/build.toml``."""
    dir = Path(dir)
    toml_path = dir / "build.toml"
    where = str(toml_path)
    if not toml_path.is_file():
        raise BuildError(f"{where} does not exist; a build directory needs a build.toml.")
    try:
        doc = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise BuildError(f"{where} is not valid TOML: {e}.") from None
    except UnicodeDecodeError:
        raise BuildError(f"{where} is not UTF-8 text.") from None

    unknown_tables = sorted(set(doc) - {"build", "knobs"})
    if unknown_tables:
        raise BuildError(
            f"{where}: unknown table [{unknown_tables[0]}]; allowed are [build] and [knobs.<name>]."
        )
    build = doc.get("build")
    if not isinstance(build, dict):
        raise BuildError(f'{where}: missing [build] table (with at least name = "...").')
    unknown = sorted(set(build) - _BUILD_KEYS)
    if unknown:
        raise BuildError(
            f"{where}: unknown field build.{unknown[0]}; allowed are {', '.join(sorted(_BUILD_KEYS))}."
        )
    for key in _BUILD_KEYS:
        if key in build and not isinstance(build[key], str):
            raise BuildError(f"{where}: build.{key} must be a string; got {build[key]!r}.")
    name = build.get("name", "")
    if not name.strip():
        raise BuildError(f"{where}: build.name must be a non-empty string.")
    entry = build.get("entry", "hotpath.py")
    if not entry.endswith(".py") or "/" in entry or "\\" in entry or not _NAME_RE.match(entry[:-3]):
        raise BuildError(
            f"{where}: build.entry must be a module file name in the build directory, like hotpath.py; got {entry!r}."
        )
    if not (dir / entry).is_file():
        raise BuildError(f"{where}: build.entry names {entry!r}, which is not a file in {dir}.")

    knobs_doc = doc.get("knobs", {})
    if not isinstance(knobs_doc, dict):
        raise BuildError(f"{where}: knobs must be tables [knobs.<name>].")
    knobs: dict[str, Knob] = {}
    for kname, kdoc in knobs_doc.items():
        knobs[kname] = _read_knob(where, kname, kdoc)
    for kname, knob in knobs.items():
        for other, value in knob.requires.items():
            if other == kname or other not in knobs:
                raise BuildError(
                    f"{where}: knobs.{kname}.requires names {other!r}, which is not another knob."
                )
            if not any(_same(value, c) for c in knobs[other].choices):
                allowed = ", ".join(format_knob_value(c) for c in knobs[other].choices)
                raise BuildError(
                    f"{where}: knobs.{kname}.requires.{other} must be one of {allowed}; got {value!r}."
                )
    return BuildSpec(
        name=name,
        dir=dir,
        entry=entry,
        parent=build.get("parent") or None,
        description=build.get("description", ""),
        notes=build.get("notes", ""),
        knobs=knobs,
    )


def _read_knob(where: str, name: str, doc: Any) -> Knob:
    path = f"knobs.{name}"
    if not _NAME_RE.match(name):
        raise BuildError(f"{where}: knob name {name!r} must be an identifier (letters, digits, underscores).")
    if not isinstance(doc, dict):
        raise BuildError(f"{where}: {path} must be a table with choices and default.")
    unknown = sorted(set(doc) - _KNOB_KEYS)
    if unknown:
        raise BuildError(
            f"{where}: unknown field {path}.{unknown[0]}; allowed are choices, default, description, requires."
        )
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        raise BuildError(f"{where}: {path}.choices must be a non-empty list of values.")
    for c in choices:
        if not _is_knob_value(c):
            raise BuildError(
                f"{where}: {path}.choices may hold strings, booleans and numbers only; got {c!r}."
            )
    for i, c in enumerate(choices):
        if any(_same(c, other) for other in choices[:i]):
            raise BuildError(f"{where}: {path}.choices lists {format_knob_value(c)} twice.")
    if "default" not in doc:
        raise BuildError(f"{where}: {path}.default is missing; it must be one of the choices.")
    default = doc["default"]
    if not any(_same(default, c) for c in choices):
        allowed = ", ".join(format_knob_value(c) for c in choices)
        raise BuildError(f"{where}: {path}.default must be one of {allowed}; got {default!r}.")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise BuildError(f"{where}: {path}.description must be a string.")
    requires = doc.get("requires", {})
    if not isinstance(requires, dict) or not all(_is_knob_value(v) for v in requires.values()):
        raise BuildError(
            f'{where}: {path}.requires must be a table of knob = value, like {{ kv_cache = "static" }}.'
        )
    return Knob(tuple(choices), default, description, dict(requires))


def _coerce(knob: Knob, value: Any) -> KnobValue | None:
    """The choice ``value`` stands for: itself, or its text form (``"true"`` from a CLI flag)."""
    for c in knob.choices:
        if _same(c, value):
            return c
    if isinstance(value, str):
        for c in knob.choices:
            if format_knob_value(c) == value.strip().lower() or format_knob_value(c) == value.strip():
                return c
    return None


def resolve_knobs(spec: BuildSpec, overrides: dict[str, Any] | None = None) -> dict[str, KnobValue]:
    """The build's defaults with ``overrides`` applied; an unknown knob or value raises BuildError."""
    knobs = spec.defaults()
    for name, value in (overrides or {}).items():
        if name not in spec.knobs:
            known = ", ".join(sorted(spec.knobs)) or "none"
            raise BuildError(f"build {spec.name!r} has no knob {name!r}; its knobs are: {known}.")
        chosen = _coerce(spec.knobs[name], value)
        if chosen is None:
            allowed = ", ".join(format_knob_value(c) for c in spec.knobs[name].choices)
            raise BuildError(f"knob {name!r} of build {spec.name!r} must be one of {allowed}; got {value!r}.")
        knobs[name] = chosen
    return knobs


def import_build(dir: Path, spec: BuildSpec | None = None) -> types.ModuleType:
    """Import the build's entry module as a fresh, uniquely named package; returns the entry module.

    The package stays registered in ``sys.modules`` until ``forget_build`` is called with the
    module (or anything defined in it). Import failures (syntax errors, missing siblings,
    exceptions at import time) unregister it and become a BuildError whose ``__cause__`` keeps
    the original exception and traceback.
    """
    dir = Path(dir).resolve()
    spec = spec or read_build(dir)
    digest = hashlib.sha256(str(dir).encode()).hexdigest()[:8]
    pkg_name = f"polymorph_build_{next(_import_counter)}_{digest}"
    pkg = types.ModuleType(pkg_name, f"Build {spec.name!r} from {dir}")
    pkg.__path__ = [str(dir)]
    pkg.__package__ = pkg_name
    pkg.__file__ = None
    sys.modules[pkg_name] = pkg
    # No __pycache__ in a build directory: it would change the build's archive (and its id),
    # and sandboxes mount builds read-only.
    saved_flag = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        return importlib.import_module(f"{pkg_name}.{spec.entry[:-3]}")
    except Exception as e:
        _forget_package(pkg_name)
        raise BuildError(
            f"build {spec.name!r}: importing {spec.entry} failed with {type(e).__name__}: {_first_line(e)}."
        ) from e
    finally:
        sys.dont_write_bytecode = saved_flag


def _package_of(obj: object) -> str:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
    return name.split(".", 1)[0]


def _forget_package(pkg_name: str) -> None:
    for key in [k for k in sys.modules if k == pkg_name or k.startswith(pkg_name + ".")]:
        del sys.modules[key]


def forget_build(obj: object) -> None:
    """Unregister the build package that ``obj`` (its module, or an object it defined) came from.

    A no-op for objects that do not come from an imported build.
    """
    pkg_name = _package_of(obj)
    if pkg_name.startswith("polymorph_build_"):
        _forget_package(pkg_name)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0].rstrip(".") if text else "no message"


def load_hotpath(
    model: LoadedModel, build_dir: Path, knobs: dict[str, Any] | None = None
) -> tuple[HotPath, BuildSpec, dict[str, KnobValue]]:
    """Read, resolve, import and ``load`` a build: the hot path, its spec and the knobs it got.

    The build's modules stay importable (for torch.compile) while the hot path is alive, and are
    unregistered from ``sys.modules`` when it is garbage-collected (or by ``forget_build``).
    """
    spec = read_build(Path(build_dir))
    resolved = resolve_knobs(spec, knobs)
    module = import_build(Path(build_dir), spec)
    load = getattr(module, "load", None)
    if not callable(load):
        forget_build(module)
        raise BuildError(f"build {spec.name!r}: {spec.entry} must define load(model, knobs) -> HotPath.")
    try:
        hotpath = load(model, dict(resolved))
    except BaseException:
        forget_build(module)
        raise
    # The build's modules leave sys.modules with the hot path itself. A hot path that cannot be
    # weakly referenced stays registered until the caller's forget_build(hotpath).
    with contextlib.suppress(TypeError):
        weakref.finalize(hotpath, _forget_package, _package_of(module))
    return hotpath, spec, resolved


def _toml_value(value: KnobValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _rewrite_build_field(lines: list[str], key: str, value: str) -> list[str]:
    """Set ``key = value`` (a string) in the [build] table, keeping every other line as it was."""
    headers = [i for i, line in enumerate(lines) if re.match(r"^\s*\[", line)]
    start = next(i for i in headers if re.match(r"^\s*\[\s*build\s*\]", lines[i]))
    end = next((i for i in headers if i > start), len(lines))
    new_line = f"{key} = {_toml_value(value)}"
    for i in range(start + 1, end):
        if re.match(rf"^\s*{key}\s*=", lines[i]):
            return [*lines[:i], new_line, *lines[i + 1 :]]
    return [*lines[: start + 1], new_line, *lines[start + 1 :]]


def _rewrite_default(lines: list[str], knob: str, value: KnobValue) -> list[str]:
    """Set ``default`` in the [knobs.<knob>] table, keeping comments and every other line."""
    out: list[str] = []
    in_table = False
    for line in lines:
        header = re.match(r"^\s*\[([^\]]+)\]", line)
        if header:
            in_table = header.group(1).strip() == f"knobs.{knob}"
        elif in_table and re.match(r"^\s*default\s*=", line):
            out.append(f"default = {_toml_value(value)}")
            continue
        out.append(line)
    return out


def knob_variant(
    base_dir: Path,
    knobs: dict[str, Any],
    dest: Path,
    *,
    name: str | None = None,
    parent: str | None = None,
    description: str | None = None,
) -> Path:
    """Copy the build at ``base_dir`` to ``dest`` with ``knobs`` as its new defaults.

    The variant is a build in its own right (its archive, hence its id, differs whenever a default
    changes). ``name``, ``parent`` and ``description`` optionally replace the [build] fields.
    ``dest`` must not exist yet, or be an empty directory.
    """
    base_dir, dest = Path(base_dir), Path(dest)
    spec = read_build(base_dir)
    resolved = resolve_knobs(spec, knobs)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BuildError(f"cannot write a build variant to {dest}: it exists and is not an empty directory.")
    shutil.copytree(base_dir, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    toml_path = dest / "build.toml"
    lines = toml_path.read_text().splitlines()
    for knob, value in resolved.items():
        if not _same(spec.knobs[knob].default, value):
            lines = _rewrite_default(lines, knob, value)
    for key, new in (("name", name), ("parent", parent), ("description", description)):
        if new is not None:
            lines = _rewrite_build_field(lines, key, new)
    toml_path.write_text("\n".join(lines) + "\n")
    written = read_build(dest)
    if written.defaults() != resolved or any(
        not _same(written.defaults()[k], v) for k, v in resolved.items()
    ):
        raise BuildError(
            f"{toml_path}: could not rewrite the knob defaults; write each default on its own line."
        )
    return dest


def resolve_build_arg(arg: str, flag: str, open_store: Callable[[], Any], cache: Path) -> Path:
    """The build directory a command-line argument names, for every command that takes one.

    ``arg`` is ``reference``, a build id (fetched through ``open_store()`` into ``cache`` and
    hash-verified by the store) or a build directory (its ``build.toml`` is read). Anything else
    is a ``UsageError`` naming ``flag``.
    """
    from polymorph.errors import StoreError, UsageError
    from polymorph.store import check_build_id

    if arg == "reference":
        return REFERENCE_BUILD
    if arg.startswith("sha256:"):
        try:
            check_build_id(arg)
            return Path(open_store().get_build(arg, cache))
        except (StoreError, ValueError) as exc:
            raise UsageError(f"{flag} {arg}: {exc}.") from None
    path = Path(arg)
    if not path.is_dir():
        raise UsageError(
            f"{flag} must be 'reference', a build id sha256:<64 hex> or a build directory; got {arg!r}."
        )
    try:
        read_build(path)
    except BuildError as exc:
        raise UsageError(f"{flag} {arg}: {exc}") from None
    return path
