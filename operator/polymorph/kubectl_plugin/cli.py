"""``kubectl polymorph``'s command line: the parser of every command and ``main``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from rich.console import Console

from polymorph.clients.kube import KubeError
from polymorph.contract.errors import StoreError, UsageError
from polymorph.contract.inputs import Parser, duration
from polymorph.contract.store import open_store
from polymorph.kubectl_plugin.change import cmd_abort, cmd_approve, cmd_pin, cmd_retry, cmd_unpin
from polymorph.kubectl_plugin.read import Session, cmd_get, cmd_list, connect
from polymorph.kubectl_plugin.view import Refused

# --------------------------------------------------------------------------------------------
# Command line.


class _Parser(Parser):
    """``polymorph.contract.inputs.Parser`` (defaults in help, ``-5m`` read as a value) with kubectl's wording."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"kubectl polymorph: {message.rstrip('.')}. See kubectl polymorph --help.\n")
        raise SystemExit(2)


_interval = duration()
"""The one duration syntax of every polymorph command (``polymorph.contract.inputs.duration``)."""


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("-n", "--namespace", help="the namespace (default: the context's, else default)")
    common.add_argument("--kubeconfig", help="the kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    common.add_argument("--context", help="the kubeconfig context (default: the current one)")
    common.add_argument(
        "-o", "--output", choices=["tree", "text", "json"], default=None,
        help="tree (rich on a terminal, plain when piped; the default), text (plain) or json",
    )  # fmt: skip
    common.add_argument(
        "--request-timeout", type=_interval, default="30s", help="API request timeout (default 30s)"
    )
    act = _Parser(add_help=False)
    act.add_argument("--dry-run", action="store_true", help="print the change, apply nothing")
    act.add_argument("--timeout", type=_interval, default="2m", help="how long to wait for the operator when an action takes two steps (default 2m)")  # fmt: skip
    parser = _Parser(
        prog="kubectl polymorph",
        description="Watch and steer Polymorph ModelDeployments and CompileJobs.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("get", parents=[common], help="one object as a tree: get md NAME [-w], get cj NAME")
    g.add_argument("kind", help="md or cj")
    g.add_argument("name")
    g.add_argument("-w", "--watch", action="store_true", help="keep showing it as it changes")
    g.add_argument("--interval", type=_interval, default="2s", help="how often -w reads it (default 2s)")
    g.add_argument(
        "--store",
        default=os.environ.get("POLYMORPH_STORE"),
        help="the artifact store (s3://bucket/prefix or a path; default $POLYMORPH_STORE): the leaderboard "
        "then comes from the CompileJob's ledgers, every experiment paired with the baseline",
    )
    g.set_defaults(fn=cmd_get)
    ls = sub.add_parser("list", parents=[common], help="one line per ModelDeployment (or cj)")
    ls.add_argument("kind", nargs="?", default="md", help="md (default) or cj")
    ls.add_argument("-A", "--all-namespaces", action="store_true")
    ls.set_defaults(fn=cmd_list)
    for name, fn, text in (
        ("approve", cmd_approve, "annotate polymorph.dev/approve=<build>: start a Manual rollout, or resume a Paused one"),
        ("abort", cmd_abort, 'annotate polymorph.dev/abort="true": roll back to the stable build'),
        ("retry", cmd_retry, "resume a Paused rollout, clear an abort, or run a failed CompileJob again"),
        ("pin", cmd_pin, "set spec.build.pinned (default: the active build)"),
        ("unpin", cmd_unpin, "remove spec.build.pinned"),
    ):  # fmt: skip
        p = sub.add_parser(name, parents=[common, act], help=text, description=text)
        p.add_argument("name", help="the ModelDeployment")
        if name in ("approve", "pin"):
            p.add_argument(
                "--build", help="a build id (default: the candidate for approve, the active build for pin)"
            )
        if name == "abort":
            p.add_argument(
                "--force", action="store_true", help="set the annotation even with no rollout in progress"
            )
        p.set_defaults(fn=fn)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Console(highlight=False, soft_wrap=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    output = args.output or "tree"
    if output == "text":
        out = Console(highlight=False, color_system=None, force_terminal=False, width=max(out.width, 160))
        output = "tree"
    elif not out.is_terminal:
        out = Console(highlight=False, color_system=None, width=160)
    try:
        kube, namespace = connect(args)
        store = None
        if getattr(args, "store", None):
            try:
                store = open_store(args.store)
            except (UsageError, StoreError) as exc:
                raise Refused(f"--store: {exc}") from None
        return int(args.fn(Session(kube, namespace, out, err, output, store), args))
    except Refused as exc:
        sys.stderr.write(f"kubectl polymorph: {exc}\n")
        return 2
    except KubeError as exc:
        sys.stderr.write(f"kubectl polymorph: the API server refused: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
