"""``kubectl polymorph``'s session and its read commands: ``get`` (one object, ``-w`` to watch) and
``list``. ``Session`` holds the cluster client, the namespace, the consoles and the optional
store (``kubeconfig.connect`` makes the client).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from polymorph.clients.kube import COMPILEJOBS, MODELDEPLOYMENTS, KubeError
from polymorph.contract.errors import StoreError
from polymorph.contract.store import Store
from polymorph.kubectl_plugin.render import render_list, render_tree, table_text, word
from polymorph.kubectl_plugin.view import (
    JSON,
    KINDS,
    Refused,
    compilejob_view,
    deployment_view,
    ledger_leaderboard,
    ledger_records,
)

# --------------------------------------------------------------------------------------------
# The cluster side.


@dataclass
class Session:
    kube: Any
    namespace: str
    console: Console
    err: Console
    output: str
    store: Store | None = None

    def with_ledger(self, view: JSON, cj: Mapping[str, Any] | None) -> JSON:
        """``view`` (a CompileJob's) with the leaderboard from its ledgers when --store is given."""
        if self.store is None or cj is None:
            return view
        try:
            records = ledger_records(self.store, cj)
        except StoreError as exc:
            raise Refused(f"--store: {exc}") from None
        board = ledger_leaderboard(self.store, cj, records=records)
        return {**view, "leaderboard": board, "leaderboardFrom": "ledger", "ledgerRecords": len(records)}

    def md(self, name: str) -> JSON:
        obj = self.kube.get(MODELDEPLOYMENTS, self.namespace, name)
        if obj is None:
            raise Refused(f"ModelDeployment {self.namespace}/{name} not found.")
        return dict(obj)

    def last_compilejob(self, md: Mapping[str, Any]) -> JSON | None:
        """The deployment's newest CompileJob (opened by drift or by hand), else None."""
        return newest_compilejob(
            md, self.kube.list(COMPILEJOBS, md["metadata"].get("namespace") or self.namespace)
        )


def newest_compilejob(md: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]]) -> JSON | None:
    """Of ``jobs``, the newest whose deploymentRef is ``md`` (by creation time, then resourceVersion)."""
    name, ns = md["metadata"]["name"], md["metadata"].get("namespace")
    mine = [
        j
        for j in jobs
        if ((j.get("spec") or {}).get("deploymentRef") or {}).get("name") == name
        and j["metadata"].get("namespace") == ns
    ]
    if not mine:
        return None
    last = ((md.get("status") or {}).get("lastCompileJob") or {}).get("name")
    return dict(
        max(
            mine,
            key=lambda j: (
                j["metadata"].get("creationTimestamp") or "",
                int(rv) if (rv := str(j["metadata"].get("resourceVersion") or "")).isdigit() else 0,
                j["metadata"].get("name") == last,
            ),
        )
    )


def print_json(console: Console, data: Any) -> None:
    console.file.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    console.file.flush()


def _show(s: Session, renderable_view: JSON) -> None:
    if s.output == "json":
        print_json(s.console, renderable_view)
    else:
        s.console.print(render_tree(renderable_view))


def cmd_get(s: Session, args: argparse.Namespace) -> int:
    kind = KINDS.get(args.kind.lower())
    if kind is None:
        raise Refused(f"get: unknown TYPE {args.kind!r}; use md (ModelDeployment) or cj (CompileJob).")

    def view() -> JSON:
        if kind == "cj":
            cj = s.kube.get(COMPILEJOBS, s.namespace, args.name)
            if cj is None:
                raise Refused(f"CompileJob {s.namespace}/{args.name} not found.")
            return s.with_ledger(compilejob_view(cj), cj)
        md = s.md(args.name)
        last = s.last_compilejob(md)
        out = deployment_view(md, last)
        if isinstance(out.get("lastCompileJob"), dict) and out["lastCompileJob"].get("kind") == "CompileJob":
            out["lastCompileJob"] = s.with_ledger(out["lastCompileJob"], last)
        return out

    if not args.watch:
        _show(s, view())
        return 0
    interval = args.interval
    if s.output == "tree" and s.console.is_terminal:
        with Live(render_tree(view()), console=s.console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                try:
                    live.update(Group(render_tree(view()), Text(f"every {interval:g}s; Ctrl-C to stop", style="dim")), refresh=True)  # fmt: skip
                except KubeError as exc:
                    live.update(Text(f"(retrying) {exc}", style="red"), refresh=True)
    last = None
    while True:
        current = view()
        key = json.dumps(current, sort_keys=True, default=str)
        if key != last:
            if s.output == "json":
                s.console.file.write(json.dumps(current, default=str) + "\n")
                s.console.file.flush()
            else:
                if last is not None:
                    s.console.print("")
                s.console.print(render_tree(current))
            last = key
        time.sleep(interval)


def cmd_list(s: Session, args: argparse.Namespace) -> int:
    kind = KINDS.get(args.kind.lower())
    if kind is None:
        raise Refused(f"list: unknown TYPE {args.kind!r}; use md (ModelDeployment) or cj (CompileJob).")
    ns = None if args.all_namespaces else s.namespace
    if kind == "cj":
        views = [compilejob_view(j) for j in s.kube.list(COMPILEJOBS, ns)]
    else:
        jobs = s.kube.list(COMPILEJOBS, ns)
        views = []
        for md in s.kube.list(MODELDEPLOYMENTS, ns):
            views.append(deployment_view(md, newest_compilejob(md, jobs)))
    views.sort(key=lambda v: (v["namespace"] or "", v["name"] or ""))
    if s.output == "json":
        print_json(s.console, views)
        return 0
    if not views:
        where = "any namespace" if args.all_namespaces else f"namespace {s.namespace}"
        s.err.print(f"No {'CompileJobs' if kind == 'cj' else 'ModelDeployments'} in {where}.")
        return 0
    rows = render_list(views)
    if s.console.is_terminal and s.output == "tree":
        table = Table(box=None, header_style="bold", pad_edge=False)
        for h in rows[0]:
            table.add_column(h)
        for r in rows[1:]:
            table.add_row(*[word(c) for c in r])
        s.console.print(table)
    else:
        s.console.file.write(table_text(rows) + "\n")
    return 0
