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
from polymorph.contract.inputs import Parser, duration, shown
from polymorph.contract.store import open_store
from polymorph.kubectl_plugin.change import check_build, cmd_abort, cmd_approve, cmd_pin, cmd_retry, cmd_unpin
from polymorph.kubectl_plugin.kubeconfig import check_name, connect
from polymorph.kubectl_plugin.read import Session, cmd_get, cmd_list
from polymorph.kubectl_plugin.view import KINDS, Refused

# --------------------------------------------------------------------------------------------
# Command line.


class _Parser(Parser):
    """``polymorph.contract.inputs.Parser`` (defaults in help, ``-5m`` read as a value) with kubectl's wording."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"kubectl polymorph: {message.rstrip('.')}. See kubectl polymorph --help.\n")
        raise SystemExit(2)


_interval = duration()
"""The one duration syntax of every polymorph command (``polymorph.contract.inputs.duration``)."""


# kubectl's global flags: on the top-level parser with their defaults, and on every subcommand with
# none (SUPPRESS), so a flag given before the subcommand is kept and one given after it is taken; a
# subcommand's default never overwrites what was given before it, as kubectl reads its flags.
GLOBAL_FLAGS = ("namespace", "kubeconfig", "context", "output", "request_timeout")


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument("-n", "--namespace", default=default(None), help="the namespace (default: the context's namespace, else default)")  # fmt: skip
    parser.add_argument("--kubeconfig", default=default(None), help="the kubeconfig file (default: the first path of $KUBECONFIG, else ~/.kube/config)")  # fmt: skip
    parser.add_argument("--context", default=default(None), help="the kubeconfig context (default: its current-context)")  # fmt: skip
    parser.add_argument(
        "-o", "--output", choices=["tree", "text", "json"], default=default(None),
        help="tree (rich on a terminal, plain when piped), text (plain) or json (default: tree)",
    )  # fmt: skip
    parser.add_argument("--request-timeout", type=_interval, metavar="DURATION", default=default("30s"), help="API request timeout (default: 30s)")  # fmt: skip


# Every command names its object the same way, as kubectl does: [TYPE] NAME or TYPE/NAME; TYPE is
# md (ModelDeployment, the default) or cj (CompileJob).
_OBJECT_HELP = (
    "the object: [TYPE] NAME or TYPE/NAME, TYPE md (ModelDeployment) or cj (CompileJob) (default: md)"
)
_CHANGE_OBJECT_HELP = "the ModelDeployment: [md] NAME or md/NAME"


def build_parser() -> argparse.ArgumentParser:
    act = _Parser(add_help=False)
    act.add_argument("--dry-run", action="store_true", help="print the change, apply nothing")
    act.add_argument("--timeout", type=_interval, metavar="DURATION", default="2m", help="how long to wait for the operator when an action takes two steps")  # fmt: skip
    parser = _Parser(
        prog="kubectl polymorph",
        description="Watch and steer Polymorph ModelDeployments and CompileJobs. Global flags "
        "(-n, --kubeconfig, --context, -o, --request-timeout) go before or after the command.",
    )
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, text: str, usage: str, parents: tuple[_Parser, ...] = ()) -> argparse.ArgumentParser:  # fmt: skip
        p = sub.add_parser(name, parents=list(parents), help=text, description=text, usage=f"kubectl polymorph {name} {usage} [flags]")  # fmt: skip
        _global_flags(p, top=False)
        return p

    g = command("get", "one object as a tree: get [md] NAME [-w], get cj NAME", "([TYPE] NAME | TYPE/NAME)")
    g.add_argument("object", nargs="+", metavar="OBJECT", help=_OBJECT_HELP)
    g.add_argument("-w", "--watch", action="store_true", help="keep showing it as it changes")
    g.add_argument(
        "--interval", type=_interval, metavar="DURATION", default="2s", help="how often -w reads it"
    )
    g.add_argument(
        "--store",
        default=os.environ.get("POLYMORPH_STORE"),
        help="the artifact store (s3://bucket/prefix or a path): the leaderboard then comes from the "
        "CompileJob's ledgers, every experiment paired with the baseline (default: $POLYMORPH_STORE)",
    )
    g.set_defaults(fn=cmd_get, types=("md", "cj"))
    ls = command("list", "one line per ModelDeployment (or cj)", "[TYPE]")
    ls.add_argument("kind", nargs="?", default="md", metavar="TYPE", help="md or cj (default: md)")
    ls.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    ls.set_defaults(fn=cmd_list)
    for name, fn, text in (
        ("approve", cmd_approve, "annotate polymorph.dev/approve=<build>: start a Manual rollout, or resume a Paused one"),
        ("abort", cmd_abort, 'annotate polymorph.dev/abort="true": roll back to the stable build'),
        ("retry", cmd_retry, "resume a Paused rollout, clear an abort, or run a failed CompileJob again"),
        ("pin", cmd_pin, "set spec.build.pinned"),
        ("unpin", cmd_unpin, "remove spec.build.pinned"),
    ):  # fmt: skip
        p = command(name, text, "([md] NAME | md/NAME)", parents=(act,))
        p.add_argument("object", nargs="+", metavar="OBJECT", help=_CHANGE_OBJECT_HELP)
        if name == "approve":
            p.add_argument(
                "--build", help="a build id (default: the candidate, or the paused rollout's build)"
            )
        if name == "pin":
            p.add_argument("--build", help="a build id (default: the active build)")
        if name == "abort":
            p.add_argument("--force", action="store_true", help="set the annotation even with no rollout in progress")  # fmt: skip
        p.set_defaults(fn=fn, types=("md",))
    return parser


_TYPE_NAMES = {"md": "ModelDeployment", "cj": "CompileJob"}


def resolve_object(command: str, words: Sequence[str], types: Sequence[str]) -> tuple[str, str]:
    """``(type, name)`` of a command's object, ``[TYPE] NAME`` or ``TYPE/NAME``, every part checked
    (the type one of ``types``, the name a Kubernetes object name) before any request."""
    allowed = " or ".join(f"{t} ({_TYPE_NAMES[t]})" for t in types)
    shape = f"{command} [md] NAME or {command} md/NAME" if types == ("md",) else f"{command} [TYPE] NAME or {command} TYPE/NAME"  # fmt: skip
    if len(words) > 2:
        raise Refused(f"{command} takes one object ({shape}); got {len(words)} words.")
    if len(words) == 2:
        kind_word, name = words
        if "/" in kind_word:
            raise Refused(f"{command}: TYPE {shown(kind_word)} has a '/'; write {shape}.")
    elif "/" in words[0]:
        kind_word, _, name = words[0].partition("/")
    else:
        kind_word, name = "md", words[0]
        if words[0].lower() in KINDS:
            raise Refused(f"{command} {shown(words[0])}: that is a TYPE; name the object too ({shape}).")
    kind = KINDS.get(kind_word.lower())
    if kind is None or kind not in types:
        if len(words) == 1:  # TYPE/NAME: a '/' in a name is never allowed, so the part before it is a TYPE
            raise Refused(f"{command} {shown(words[0])}: unknown TYPE {shown(kind_word)} before the '/'; use {allowed}, and a NAME without '/'.")  # fmt: skip
        raise Refused(f"{command}: unknown TYPE {shown(kind_word)}; use {allowed}.")
    return kind, check_name(f"{_TYPE_NAMES[kind]} NAME", name)


def check_args(args: argparse.Namespace) -> None:
    """Every value that goes into a request, checked before any is made (the namespace and the
    context with the kubeconfig, in ``connect``)."""
    if hasattr(args, "object"):
        args.kind, args.name = resolve_object(args.command, args.object, args.types)
    elif args.command == "list" and KINDS.get(args.kind.lower()) is None:
        raise Refused(f"list: unknown TYPE {shown(args.kind)}; use md (ModelDeployment) or cj (CompileJob).")
    if getattr(args, "build", None) is not None:
        check_build("--build", args.build)


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
        check_args(args)
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
