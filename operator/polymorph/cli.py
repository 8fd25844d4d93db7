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

# name -> (module, help). Modules are imported only to configure their parser and run.
COMMANDS: dict[str, tuple[str, str]] = {
    "crds": ("polymorph.crdgen", "print, write or check the CustomResourceDefinitions"),
    "validate": ("polymorph.validate", "validate ModelDeployment and CompileJob manifests"),
    "experiment": (
        "polymorph_engine.experiment_cli",
        "run builds through verification and benchmark in one hot engine",
    ),
    "engine": ("polymorph_engine.server_cli", "run the inference engine (serve)"),
    "sandbox": ("polymorph_engine.sandbox", "sandbox pod entrypoints (engine, agent)"),
    "compile": ("polymorph_engine.compile_cli", "run a compile campaign locally (the demo)"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="polymorph", description="Continual compilation for LLM inference fleets.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # an optional extra is missing
            sub.set_defaults(
                _missing=f"polymorph {name} needs an optional dependency that is not installed: {exc}"
            )
            continue
        module.configure(sub)
        sub.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
