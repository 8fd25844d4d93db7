"""Build directories as data: read ``build.toml``, resolve knobs, make knob variants, name builds.

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

Owns: the ``BuildDeclaration`` a ``build.toml`` makes (name, entry, parent, knob space), knob
resolution and variants, the location of the reference build that ships with the engine, and
``resolve_build_arg`` (what a ``--build``-style argument names). Every error about a build is a
``BuildError`` whose message is one sentence naming the file and the field.

It never imports a build: this module is trusted and torch-free, so the compile loop and the
operator can read knob spaces. Importing and loading a build is the engine's business
(``polymorph_engine.runtime.loader``).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polymorph.contract.errors import BuildError, StoreError, UsageError
from polymorph.contract.store import Store, check_build_id

__all__ = [
    "REFERENCE_BUILD",
    "BuildDeclaration",
    "Knob",
    "KnobValue",
    "format_knob_value",
    "knob_variant",
    "read_build",
    "resolve_build_arg",
    "resolve_knobs",
]


def _reference_build() -> Path:
    # find_spec locates the engine package on the path without importing (executing) any of it:
    # the reference build is package data of polymorph_engine, and this package never imports it.
    spec = importlib.util.find_spec("polymorph_engine")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if roots:
        return Path(roots[0]).resolve() / "builds" / "reference"
    return Path(__file__).resolve().parents[2] / "engine_image" / "polymorph_engine" / "builds" / "reference"


REFERENCE_BUILD: Path = _reference_build()
"""The reference build's directory: plain PyTorch, shipped as package data of ``polymorph_engine``."""

KnobValue = str | bool | int | float
_BUILD_KEYS = {"name", "parent", "entry", "description", "notes"}
_KNOB_KEYS = {"choices", "default", "description", "requires", "accelerator_only", "slow_prepare"}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Knob:
    """One dimension of a build's search space: every value in ``choices`` must be correct."""

    choices: tuple[KnobValue, ...]
    default: KnobValue
    description: str = ""
    requires: dict[str, KnobValue] = field(default_factory=dict)
    """Other knobs' values without which this knob's non-default values change nothing
    (``decode_capture`` needs ``kv_cache = "static"``). A search applies them together."""
    accelerator_only: tuple[KnobValue, ...] = ()
    """Values that act only on an accelerator: on a CPU they compute as the default does (a CUDA
    graph, a Triton kernel), so a campaign on a CPU does not search them."""
    slow_prepare: tuple[KnobValue, ...] = ()
    """Values whose prepare compiles (``torch.compile``): tens of seconds the first time on an
    accelerator, where the other values take a second or two. A search under a short budget
    leaves them out (``SearchAgent``)."""

    def choices_on(self, device: str) -> tuple[KnobValue, ...]:
        """The choices a campaign on ``device`` (``cpu``, ``cuda``, an accelerator's name) searches."""
        if device != "cpu":
            return self.choices
        return tuple(c for c in self.choices if not any(_same(c, a) for a in self.accelerator_only))

    def slow_on(self, device: str) -> tuple[KnobValue, ...]:
        """The values slow to prepare on ``device``: ``slow_prepare`` on an accelerator; none on a
        CPU, where a small model compiles in seconds."""
        return self.slow_prepare if device != "cpu" else ()


@dataclass(frozen=True)
class BuildDeclaration:
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


def format_knob_value(value: object) -> str:
    """A knob value as TOML / a person writes it: ``true``, ``"static"`` -> ``static``, ``4``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _same(a: object, b: object) -> bool:
    # True == 1 in Python; a knob value must match in type as well as value.
    return type(a) is type(b) and a == b


def _is_knob_value(v: object) -> bool:
    return isinstance(v, str | bool | int | float)


@functools.lru_cache(maxsize=64)
def _parse_toml(text: str) -> dict[str, object]:
    """``tomllib.loads``, once per distinct text: a campaign reads the same few build.toml files
    for every experiment. Callers only read the document (``_read_knob`` copies what it keeps)."""
    return tomllib.loads(text)


def read_build(dir: Path) -> BuildDeclaration:
    """Parse and validate ``<dir>/build.toml``."""
    dir = Path(dir)
    toml_path = dir / "build.toml"
    where = str(toml_path)
    if not toml_path.is_file():
        raise BuildError(f"{where} does not exist; a build directory needs a build.toml.")
    try:
        doc = _parse_toml(toml_path.read_text())
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
    _refuse_unknown_fields(where, "build", build, _BUILD_KEYS, ", ".join(sorted(_BUILD_KEYS)))
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
    return BuildDeclaration(
        name=name,
        dir=dir,
        entry=entry,
        parent=build.get("parent") or None,
        description=build.get("description", ""),
        notes=build.get("notes", ""),
        knobs=knobs,
    )


def _refuse_unknown_fields(
    where: str, path: str, table: Mapping[str, object], known: set[str], allowed: str
) -> None:
    """``BuildError`` naming the first (sorted) key of the ``path`` table outside ``known``, and
    ``allowed`` (the known keys as the message lists them)."""
    unknown = sorted(set(table) - known)
    if unknown:
        raise BuildError(f"{where}: unknown field {path}.{unknown[0]}; allowed are {allowed}.")


def _read_knob(where: str, name: str, doc: object) -> Knob:
    path = f"knobs.{name}"
    if not _NAME_RE.match(name):
        raise BuildError(f"{where}: knob name {name!r} must be an identifier (letters, digits, underscores).")
    if not isinstance(doc, dict):
        raise BuildError(f"{where}: {path} must be a table with choices and default.")
    _refuse_unknown_fields(
        where,
        path,
        doc,
        _KNOB_KEYS,
        "choices, default, description, requires, accelerator_only, slow_prepare",
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
    accelerated = _some_choices(where, path, doc, "accelerator_only", choices)
    if any(_same(default, a) for a in accelerated):
        raise BuildError(
            f"{where}: {path}.accelerator_only may not hold the default, which every device runs."
        )
    slow = _some_choices(where, path, doc, "slow_prepare", choices)
    return Knob(tuple(choices), default, description, dict(requires), accelerated, slow)


def _some_choices(
    where: str, path: str, doc: dict[str, object], name: str, choices: list[KnobValue]
) -> tuple[KnobValue, ...]:
    """The knob's list ``name`` (empty when absent), each entry one of its ``choices``."""
    values = doc.get(name, [])
    if not isinstance(values, list) or not all(any(_same(a, c) for c in choices) for a in values):
        raise BuildError(f"{where}: {path}.{name} must be a list of its choices.")
    return tuple(values)


def _coerce(knob: Knob, value: object) -> KnobValue | None:
    """The choice ``value`` stands for: itself, or its text form (``"true"`` from a CLI flag)."""
    for c in knob.choices:
        if _same(c, value):
            return c
    if isinstance(value, str):
        for c in knob.choices:
            if format_knob_value(c) == value.strip().lower() or format_knob_value(c) == value.strip():
                return c
    return None


def resolve_knobs(
    spec: BuildDeclaration, overrides: Mapping[str, object] | None = None
) -> dict[str, KnobValue]:
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


def _rewrite_default(
    lines: list[str], knob: str, value: KnobValue, accelerated: tuple[KnobValue, ...]
) -> list[str]:
    """Set ``default`` in the [knobs.<knob>] table, keeping comments and every other line.

    ``accelerated``: the knob's ``accelerator_only`` values; the new default leaves that list (a
    variant whose default is an accelerator's value runs it wherever it is loaded)."""
    rest = [a for a in accelerated if not _same(a, value)]
    out: list[str] = []
    in_table = False
    for line in lines:
        header = re.match(r"^\s*\[([^\]]+)\]", line)
        if header:
            in_table = header.group(1).strip() == f"knobs.{knob}"
        elif in_table and re.match(r"^\s*default\s*=", line):
            out.append(f"default = {_toml_value(value)}")
            continue
        elif in_table and len(rest) < len(accelerated) and re.match(r"^\s*accelerator_only\s*=", line):
            out.append(f"accelerator_only = [{', '.join(_toml_value(a) for a in rest)}]")
            continue
        out.append(line)
    return out


def knob_variant(
    base_dir: Path,
    knobs: Mapping[str, object],
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
            lines = _rewrite_default(lines, knob, value, spec.knobs[knob].accelerator_only)
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


def resolve_build_arg(arg: str, flag: str, open_store: Callable[[], Store], cache: Path) -> Path:
    """The build directory a command-line argument names, for every command that takes one.

    ``arg`` is ``reference``, a build id (fetched through ``open_store()`` into ``cache`` and
    hash-verified by the store) or a build directory (its ``build.toml`` is read). Anything else
    is a ``UsageError`` naming ``flag``.
    """
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
