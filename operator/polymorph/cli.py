"""The ``polymorph`` command line: a thin dispatcher over subcommand modules, and the error boundary.

Each subcommand lives in the module that owns its behaviour and exposes two functions:
``configure(parser)`` adds its flags (no heavy imports there) and ``run(args) -> int``
does the work.

The boundary (``main``): every error family a user can cause becomes one line ``error: ...``
and exit status 2: ``UsageError``, ``StoreError``, ``BuildError``, a pydantic
``ValidationError`` (named field paths), ``OSError`` (the path and the reason),
``OverflowError`` and ``RecursionError`` (a number or a nesting too large). SIGINT and
SIGTERM (``Interrupted``, a ``KeyboardInterrupt``) print ``interrupted`` and exit 128 + the
signal number. Anything else is a bug: one line saying so, exit status 1, and the traceback
only with ``POLYMORPH_DEBUG=1``. Nothing a user typed ever produces a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

from polymorph.contract.errors import BuildError, Interrupted, StoreError, UsageError
from polymorph.contract.inputs import Parser
from polymorph.contract.validate import format_validation_error

# name -> (module, help), or (help, {role: (module, help)}) for a command with roles. Modules are
# imported by name, and only for the command being run: the data plane's commands
# (``experiment``, ``engine``, ``sandbox engine``) live in ``polymorph_engine`` and load only
# when the engine extra is installed.
Command = tuple[str, str]
COMMANDS: dict[str, Command | tuple[str, dict[str, Command]]] = {
    "crds": ("polymorph.crdgen", "print, write or check the CustomResourceDefinitions"),
    "validate": ("polymorph.contract.validate", "validate ModelDeployment and CompileJob manifests"),
    "experiment": (
        "polymorph_engine.experiment.cli",
        "run builds through verification and benchmark in one hot engine",
    ),
    "engine": ("polymorph_engine.serving.cli", "run the inference engine (serve)"),
    "sandbox": (
        "sandbox pod entrypoints (engine, agent)",
        {
            "engine": (
                "polymorph_engine.sandbox.cli",
                "serve the engine's admin API on localhost (no secrets)",
            ),
            "agent": (
                "polymorph.compile.sandbox_agent",
                "drive the engine and write ledger, progress and result to the store",
            ),
        },
    ),
    "compile": ("polymorph.compile.cli", "run a compile campaign locally (the demo)"),
    "operator": ("polymorph.handlers.process", "run the Kubernetes operator (kopf)"),
}


def _attach(parser: argparse.ArgumentParser, name: str, module_name: str) -> None:
    """Let ``module_name`` configure ``parser``; a missing optional extra becomes a one-line error."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # an optional extra is missing
        parser.set_defaults(
            _missing=f"polymorph {name} needs an optional dependency that is not installed: {exc}"
        )
        return
    module.configure(parser)
    parser.set_defaults(_module=module)


def build_parser(selected: str | None = None, role: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; only the ``selected`` command's modules are imported (all when None),
    and of a command with roles only the ``role``'s (all when None), so ``polymorph validate`` and
    ``polymorph sandbox agent`` never pay for the engine's torch import."""
    parser = Parser(prog="polymorph", description="Continual compilation for LLM inference fleets.")
    parser.add_argument("--version", action="version", version=f"polymorph {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, entry in COMMANDS.items():
        target, help_text = entry if isinstance(entry[1], str) else (entry[1], entry[0])
        if selected is not None and name != selected:
            subparsers.add_parser(name, help=help_text, description=help_text)
            continue
        if isinstance(target, str):
            sub = subparsers.add_parser(name, help=help_text, description=help_text)
            _attach(sub, name, target)
            continue
        group = subparsers.add_parser(name, help=help_text, description=help_text)
        roles = group.add_subparsers(dest="role", metavar="ROLE", required=True, parser_class=Parser)
        for role_name, (module_name, role_help) in target.items():
            sub = roles.add_parser(role_name, help=role_help, description=role_help)
            if role is None or role_name == role:
                _attach(sub, f"{name} {role_name}", module_name)
    return parser


def _version() -> str:
    try:
        return version("polymorph")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def describe(exc: BaseException) -> str | None:
    """One sentence for an error a user can cause, or None when ``exc`` is a bug."""
    if isinstance(exc, UsageError | StoreError | BuildError):
        return str(exc)
    if isinstance(exc, ValidationError):
        lines = format_validation_error(exc)
        more = f" (and {len(lines) - 1} more problems)" if len(lines) > 1 else ""
        return f"{exc.title}: {lines[0]}{more}" if lines else str(exc).splitlines()[0]
    if isinstance(exc, OSError):
        what = exc.strerror or type(exc).__name__
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where}: {what}" if where else f"{what}: {exc}"
    if isinstance(exc, OverflowError):
        return f"a number is too large to use ({exc}); give a smaller value"
    if isinstance(exc, RecursionError):
        return "the input is nested too deeply to read"
    return None


def _run(module: object, args: argparse.Namespace) -> int:
    """``module.run(args)`` with SIGTERM raising ``Interrupted`` in the main thread, as Ctrl-C does."""

    def terminate(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return int(module.run(args) or 0)  # type: ignore[attr-defined]
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return int(module.run(args) or 0)  # type: ignore[attr-defined]
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:  # also while the command's modules are still importing
        print("interrupted", file=sys.stderr, flush=True)
        return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)


def _main(argv: Sequence[str] | None) -> int:
    # One OpenBLAS thread, before any command imports numpy: no command multiplies large matrices
    # (the search agent's have tens of features), and OpenBLAS's idle threads spin on the cores an
    # engine measures on. An OPENBLAS_NUM_THREADS already set wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    words = [a for a in argv if not a.startswith("-")]  # the command, then its role if it has roles
    parser = build_parser(words[0] if words else "", words[1] if len(words) > 1 else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad flag: Parser.error printed its one line
        if exc.code == 2:
            return 2
        raise  # --help and --version exit 0
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"error: {args._missing}", file=sys.stderr)
        return 2
    try:
        return _run(args._module, args)
    except BrokenPipeError:  # stdout was closed early (``| head``): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        sentence = describe(exc)
        if sentence is not None:
            print(f"error: {sentence}", file=sys.stderr)
            return 2
        if os.environ.get("POLYMORPH_DEBUG"):
            raise
        print(
            f"error: internal error ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); this is a bug in polymorph, please "
            "report it (POLYMORPH_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
