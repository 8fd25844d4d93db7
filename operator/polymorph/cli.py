"""The ``polymorph`` command line: a thin dispatcher over subcommand modules.

Each subcommand lives in the module that owns its behaviour and exposes two functions:
``configure(parser)`` adds its flags (no heavy imports there) and ``run(args) -> int``
does the work. Errors meant for people are raised as ``UsageError`` and printed as one
line; nothing a user typed ever produces a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from polymorph.errors import UsageError

# name -> (module, help), or (help, {role: (module, help)}) for a command with roles. Modules are
# imported by name, and only for the command being run: the data plane's commands
# (``experiment``, ``engine``, ``sandbox engine``) live in ``polymorph_engine`` and load only
# when the engine extra is installed.
Command = tuple[str, str]
COMMANDS: dict[str, Command | tuple[str, dict[str, Command]]] = {
    "crds": ("polymorph.crdgen", "print, write or check the CustomResourceDefinitions"),
    "validate": ("polymorph.validate", "validate ModelDeployment and CompileJob manifests"),
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}\n")


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


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; only the ``selected`` command's modules are imported (all when None),
    so ``polymorph validate`` never pays for the engine's torch import."""
    parser = _Parser(prog="polymorph", description="Continual compilation for LLM inference fleets.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
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
        roles = group.add_subparsers(dest="role", metavar="ROLE", required=True, parser_class=_Parser)
        for role, (module_name, role_help) in target.items():
            _attach(
                roles.add_parser(role, help=role_help, description=role_help), f"{name} {role}", module_name
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(selected)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"error: {args._missing}", file=sys.stderr)
        return 2
    try:
        return int(args._module.run(args) or 0)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
