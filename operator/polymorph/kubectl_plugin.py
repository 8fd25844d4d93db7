"""``kubectl polymorph``: read and steer ModelDeployments the way ``kubectl argo rollouts`` does.

Commands (``kubectl-polymorph`` on ``PATH`` makes them ``kubectl polymorph ...``):
- ``get md NAME [-w]``: a tree of one deployment: the active build, the candidate, the rollout
  step and weight, each analysis value beside its threshold, drift and its reasons, the
  conditions, and its last CompileJob with a leaderboard (baseline and each sandbox's best);
  ``get cj NAME`` shows one CompileJob the same way;
- ``list [md|cj]``: one line per object;
- ``approve``, ``abort``, ``retry``, ``pin``, ``unpin``: each is the annotation or spec change
  the operator already honours (``polymorph.dev/approve``, ``polymorph.dev/abort``,
  ``spec.build.pinned``, or a new CompileJob from a failed one's spec), printed before it is
  applied (``--dry-run``: printed only).

Output: a rich tree on a terminal; plain text when piped (or ``-o text``); ``-o json`` for
scripts. The kubeconfig is ``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``, its
current context (or ``--context``) and that context's namespace (or ``-n``). Bad input gets
one sentence naming the flag or object and exit status 2; an API refusal, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

import kubernetes
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from polymorph.api.common import BUILD_ID_PATTERN
from polymorph.clients.kube import COMPILEJOBS, MODELDEPLOYMENTS, KubeClient, KubeError
from polymorph.errors import StoreError, UsageError
from polymorph.inputs import Parser, duration
from polymorph.store import KeyNotFound, Store, ledger_key, open_store

__all__ = ["ANNOTATION_ABORT", "ANNOTATION_APPROVE", "main"]

ANNOTATION_APPROVE = "polymorph.dev/approve"
ANNOTATION_ABORT = "polymorph.dev/abort"
JSON = dict[str, Any]
_KINDS = {"md": "md", "modeldeployment": "md", "modeldeployments": "md", "cj": "cj", "compilejob": "cj", "compilejobs": "cj"}  # fmt: skip
_LOWER_IS_BETTER = {"ttftP95", "itlP95"}


class Refused(Exception):
    """Bad input or a state the action does not apply to: one sentence, exit status 2."""


# --------------------------------------------------------------------------------------------
# Reading the objects into a view (a plain dict: the tree, the text and -o json all render it).


def _short(build: str | None) -> str:
    if not build:
        return "-"
    return build[:19] if build.startswith("sha256:") else build


def _condition(obj: Mapping[str, Any], kind: str) -> JSON | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def _kstatus(obj: Mapping[str, Any]) -> str:
    """The kstatus verdict from the conditions the operator writes (for display; kstatus itself decides)."""
    meta, status = obj.get("metadata", {}), obj.get("status") or {}
    if status.get("observedGeneration") is not None and status["observedGeneration"] != meta.get(
        "generation"
    ):
        return "InProgress"
    for c in status.get("conditions") or []:
        if c.get("type") == "Reconciling" and c.get("status") == "True":
            return "InProgress"
        if c.get("type") == "Stalled" and c.get("status") == "True":
            return "Failed"
    return "Current"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _threshold(v: Mapping[str, Any]) -> str:
    lo, hi = v.get("min"), v.get("max")
    if lo is not None and hi is not None:
        return f"{_fmt(lo)}..{_fmt(hi)}"
    if lo is not None:
        return f">= {_fmt(lo)}"
    if hi is not None:
        return f"<= {_fmt(hi)}"
    return "-"


def _leaderboard(cj: Mapping[str, Any]) -> list[JSON]:
    """Baseline and each sandbox's best, best first, with the factor over the baseline on the objective."""
    status = cj.get("status") or {}
    metric = ((cj.get("spec") or {}).get("objective") or {}).get("metric", "outputTokensPerSecond")
    lower = metric in _LOWER_IS_BETTER
    base = status.get("baseline") or {}
    base_value = base.get("value")
    rows: dict[str, JSON] = {}
    for s in status.get("sandboxes") or []:
        build, value = s.get("bestBuild"), s.get("bestValue")
        if not build or value is None:
            continue
        row = rows.get(build)
        if row is None or (value < row["value"] if lower else value > row["value"]):
            rows[build] = {"build": build, "value": value, "sandbox": s.get("index"), "role": "candidate"}
    best = status.get("best") or {}
    if best.get("build"):
        rows.setdefault(best["build"], {"build": best["build"], "value": best.get("value"), "sandbox": None})
        rows[best["build"]]["role"] = "best"
    if base.get("build"):
        rows.setdefault(base["build"], {"build": base["build"], "value": base_value, "sandbox": None, "role": "baseline"})  # fmt: skip
    out = list(rows.values())
    for row in out:
        v = row.get("value")
        row["speedup"] = (
            None if v is None or not base_value else round((base_value / v) if lower else (v / base_value), 3)
        )
        if row["role"] == "best" and best.get("speedup") is not None:
            row["speedup"] = best["speedup"]  # the paired, interleaved comparison the campaign kept
    out.sort(key=lambda r: -(r["speedup"] or 0.0))
    for i, row in enumerate(out, 1):
        row["rank"] = i
    return out


def ledger_records(store: Store, cj: Mapping[str, Any]) -> list[tuple[int, JSON]]:
    """Every experiment record in the CompileJob's ledgers, with its sandbox."""
    meta, spec, status = cj.get("metadata", {}), cj.get("spec") or {}, cj.get("status") or {}
    ns, name, uid = meta.get("namespace") or "default", meta.get("name", ""), meta.get("uid", "")
    sandboxes = max(int((spec.get("budget") or {}).get("sandboxes") or 2), len(status.get("sandboxes") or []))
    out: list[tuple[int, JSON]] = []
    for i in range(sandboxes):
        try:
            out += [(i, rec) for rec in store.read_jsonl(ledger_key(ns, name, uid, i))]
        except KeyNotFound:
            continue
    return out


def ledger_leaderboard(
    store: Store, cj: Mapping[str, Any], top: int = 5, records: list[tuple[int, JSON]] | None = None
) -> list[JSON]:
    """The campaign's best experiments from its ledgers in the store, as ``polymorph compile`` ranks them.

    Passed experiments paired against the baseline, by their paired ratio (inverted for a
    latency objective), with its confidence interval; one row per build, best first.
    """
    spec, status = cj.get("spec") or {}, cj.get("status") or {}
    maximize = ((spec.get("objective") or {}).get("metric", "outputTokensPerSecond")) not in _LOWER_IS_BETTER
    base = (status.get("baseline") or {}).get("build")
    best = (status.get("best") or {}).get("build")
    rows: dict[str, JSON] = {}
    for i, rec in ledger_records(store, cj) if records is None else records:
        paired = rec.get("comparison") or {}
        if rec.get("status") != "passed" or not paired or paired.get("against") != base:
            continue
        ratio, lo, hi = float(paired["ratio"]), float(paired["lo"]), float(paired["hi"])
        if not maximize:
            ratio, lo, hi = 1.0 / ratio, 1.0 / hi, 1.0 / lo
        build = str(rec.get("build"))
        if build in rows and rows[build]["speedup"] >= ratio:
            continue
        rows[build] = {
            "build": build, "speedup": round(ratio, 3), "ci": [round(lo, 3), round(hi, 3)],
            "pairs": paired.get("pairs"), "value": ((rec.get("figures") or {}).get("outputTokensPerSecond")),
            "sandbox": i, "role": "best" if build == best else "candidate",
            "description": str(rec.get("description") or rec.get("name") or "")[:60],
        }  # fmt: skip
    out = sorted(rows.values(), key=lambda r: -r["speedup"])[:top]
    for rank, row in enumerate(out, 1):
        row["rank"] = rank
    return out


def compilejob_view(cj: Mapping[str, Any]) -> JSON:
    meta, spec, status = cj.get("metadata", {}), cj.get("spec") or {}, cj.get("status") or {}
    counts = status.get("experiments") or {}
    return {
        "kind": "CompileJob",
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "phase": status.get("phase") or "Pending",
        "kstatus": _kstatus(cj),
        "deployment": (spec.get("deploymentRef") or {}).get("name"),
        "agent": (spec.get("agent") or {}).get("kind", "Search"),
        "objective": (spec.get("objective") or {}).get("metric", "outputTokensPerSecond"),
        "baseBuild": spec.get("baseBuild", "reference"),
        "message": status.get("message"),
        "experiments": {k: counts.get(k, 0) for k in ("total", "passed", "rejected", "failed", "crashed", "timeout")},
        "best": status.get("best"),
        "baseline": status.get("baseline"),
        "leaderboard": _leaderboard(cj),
        "leaderboardFrom": "status",
        "sandboxes": [
            {k: s.get(k) for k in ("index", "phase", "experiments", "bestBuild", "bestValue", "message")}
            for s in status.get("sandboxes") or []
        ],
        "startedAt": status.get("startedAt"),
        "finishedAt": status.get("finishedAt"),
        "conditions": _conditions_view(cj),
    }  # fmt: skip


def _conditions_view(obj: Mapping[str, Any]) -> list[JSON]:
    return [
        {k: c.get(k) for k in ("type", "status", "reason", "message", "observedGeneration")}
        for c in (obj.get("status") or {}).get("conditions") or []
    ]


def deployment_view(md: Mapping[str, Any], cj: Mapping[str, Any] | None) -> JSON:
    meta, spec, status = md.get("metadata", {}), md.get("spec") or {}, md.get("status") or {}
    ro = status.get("rollout") or {}
    steps = (spec.get("rollout") or {}).get("steps") or [{"weight": 25}, {"weight": 50}]
    active, cand = status.get("activeBuild") or {}, status.get("candidateBuild") or {}
    drift = status.get("drift") or {}
    recompile = spec.get("recompile") or {}
    annotations = meta.get("annotations") or {}
    in_progress = ro.get("phase") in ("Progressing", "Paused", "Promoting", "RollingBack")
    return {
        "kind": "ModelDeployment",
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "generation": meta.get("generation"),
        "observedGeneration": status.get("observedGeneration"),
        "phase": status.get("phase") or "Pending",
        "kstatus": _kstatus(md),
        "policy": (spec.get("build") or {}).get("policy", "Auto"),
        "pinned": (spec.get("build") or {}).get("pinned"),
        "replicas": spec.get("replicas", 1),
        "annotations": {k: v for k, v in annotations.items() if k in (ANNOTATION_APPROVE, ANNOTATION_ABORT)},
        "activeBuild": {k: active.get(k) for k in ("id", "name", "tokensPerSecond", "since")} if active else None,
        "candidateBuild": (
            {"id": cand.get("id"), "tokensPerSecond": cand.get("tokensPerSecond")} if cand.get("id") else None
        ),
        "rollout": {
            "phase": ro.get("phase") or "Idle",
            "build": ro.get("build"),
            "fromBuild": ro.get("fromBuild"),
            "step": (ro.get("step") or 0) + 1 if in_progress else None,
            "steps": len(steps),
            "weight": ro.get("weight"),
            "actualWeight": ro.get("actualWeight"),
            "canaryReplicas": ro.get("canaryReplicas"),
            "stableReplicas": ro.get("stableReplicas"),
            "failures": ro.get("failures"),
            "lastVerdict": ro.get("lastVerdict"),
            "lastAnalysisAt": ro.get("lastAnalysisAt"),
            "message": ro.get("message"),
            "analysis": [
                {k: a.get(k) for k in ("name", "value", "lo", "hi", "min", "max", "verdict", "measuredAt")}
                for a in ro.get("analysis") or []
            ],
        },
        "drift": {
            "score": drift.get("score"),
            "threshold": recompile.get("driftThreshold", 0.25),
            "checkedAt": drift.get("checkedAt"),
            "reasons": list(drift.get("reasons") or []),
            "requests": (status.get("trafficProfile") or {}).get("requests"),
        },
        "lastCompileJob": compilejob_view(cj) if cj is not None else status.get("lastCompileJob"),
        "history": list(status.get("history") or [])[-3:],
        "conditions": _conditions_view(md),
    }  # fmt: skip


# --------------------------------------------------------------------------------------------
# Rendering: a rich tree on a terminal, the same tree in plain text when piped.


_STYLE = {
    "Healthy": "green", "Current": "green", "Serving": "green", "Succeeded": "green", "Pass": "green",
    "Promoted": "green", "True": "green", "InProgress": "yellow", "Progressing": "yellow", "Promoting": "yellow",
    "RollingOut": "yellow", "Compiling": "yellow", "Running": "yellow", "Pending": "yellow",
    "Inconclusive": "yellow", "Paused": "magenta", "Failed": "red", "Fail": "red", "Degraded": "red",
    "RolledBack": "red", "RollingBack": "red", "Aborted": "red",
}  # fmt: skip
_MARK = {"Pass": "✔", "Fail": "✖", "Inconclusive": "?"}


def _word(value: Any) -> Text:
    text = str(value if value is not None else "-")
    return Text(text, style=_STYLE.get(text, ""))


def _line(*parts: Any) -> Text:
    """Parts joined by two spaces; a (text, style) tuple is styled, a str from _STYLE is coloured."""
    out = Text()
    kept = [p for p in parts if p not in (None, "") and not (isinstance(p, tuple) and p[0] in (None, ""))]
    for i, part in enumerate(kept):
        if i:
            out.append("  ")
        if isinstance(part, tuple):
            out.append(str(part[0]), style=part[1])
        elif isinstance(part, Text):
            out.append_text(part)
        else:
            out.append_text(_word(part))
    return out


def _label(name: str) -> Text:
    return Text(f"{name:<13}", style="bold")


def _when(stamp: str | None) -> str:
    if not stamp:
        return ""
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago" if seconds < 172800 else f"{seconds // 86400}d ago"


def _compilejob_tree(node: Tree, cj: JSON) -> None:
    e = cj["experiments"]
    node.add(
        _line(
            _label("Experiments"),
            (f"{e['total']} ({e['passed']} passed, {e['rejected']} rejected, {e['failed']} failed, "
             f"{e['crashed']} crashed, {e['timeout']} timed out)", ""),
        )
    )  # fmt: skip
    if cj.get("message"):
        node.add(_line(_label("Message"), (cj["message"], "")))
    source = "from the ledgers, paired with the baseline" if cj.get("leaderboardFrom") == "ledger" else "baseline and each sandbox's best"  # fmt: skip
    board = node.add(_line(_label("Leaderboard"), (f"objective {cj['objective']}; {source}", "dim")))
    if not cj["leaderboard"]:
        board.add(Text("no results yet", style="dim"))
    for row in cj["leaderboard"]:
        star = "★" if row["role"] == "best" else " "
        where = f"sandbox {row['sandbox']}" if row.get("sandbox") is not None else ""
        board.add(
            _line(
                (f"{star} {row['rank']}.", "bold yellow" if star == "★" else ""),
                (_short(row["build"]), "cyan"),
                (f"{_fmt(row['value'], 4)}", ""),
                (f"{row['speedup']:.2f}x" if row.get("speedup") is not None else "-", "bold"),
                (f"[{row['ci'][0]:.2f}, {row['ci'][1]:.2f}] ({row.get('pairs')} pairs)", "")
                if row.get("ci")
                else None,
                (row["role"], "dim"),
                (where, "dim"),
                (row.get("description") or "", "dim"),
            )
        )


def render_tree(view: JSON) -> Tree:
    if view["kind"] == "CompileJob":
        root = Tree(
            _line(
                (f"CompileJob {view['namespace']}/{view['name']}", "bold"),
                view["phase"],
                ("kstatus", "dim"),
                view["kstatus"],
            )
        )
        root.add(_line(_label("Deployment"), (view.get("deployment") or "standalone", ""), (f"agent {view['agent']}", "dim"), (f"base {_short(view['baseBuild'])}", "dim")))  # fmt: skip
        _compilejob_tree(root, view)
        _conditions_tree(root, view["conditions"])
        return root
    root = Tree(
        _line(
            (f"ModelDeployment {view['namespace']}/{view['name']}", "bold"),
            view["phase"],
            ("kstatus", "dim"),
            view["kstatus"],
            (f"policy {view['policy']}", "dim"),
            (f"pinned {_short(view['pinned'])}", "magenta") if view.get("pinned") else None,
        )
    )
    active = view.get("activeBuild") or {}
    root.add(
        _line(
            _label("Active build"),
            (_short(active.get("id")), "cyan"),
            (active["name"], "dim")
            if active.get("name") and active.get("name") != active.get("id")
            else None,
            (f"{active['tokensPerSecond']} tok/s", "") if active.get("tokensPerSecond") else None,
            (f"since {_when(active.get('since'))}", "dim") if active.get("since") else None,
            (f"{view['replicas']} replicas", "dim"),
        )
    )
    cand = view.get("candidateBuild")
    root.add(
        _line(_label("Candidate"), (_short(cand["id"]), "cyan"))
        if cand
        else _line(_label("Candidate"), ("none", "dim"))
    )
    ro = view["rollout"]
    if ro["step"] is not None:
        where = (f"step {ro['step']}/{ro['steps']}", "bold")
        weight = (f"weight {ro['weight']}% (actual {_fmt(ro['actualWeight'])}%)", "")
        replicas = (f"canary {ro['canaryReplicas']}, stable {ro['stableReplicas']}", "dim")
    else:
        where = weight = replicas = ("", "")
    rnode = root.add(_line(_label("Rollout"), ro["phase"], where, weight, replicas))
    if ro.get("build") and ro["step"] is not None:
        rnode.add(_line((f"{_short(ro['fromBuild'])} -> {_short(ro['build'])}", "cyan")))
    if ro.get("message"):
        rnode.add(Text(ro["message"], style="dim"))
    if ro["analysis"]:
        anode = rnode.add(
            _line(
                ("Analysis", "bold"),
                ro.get("lastVerdict"),
                (f"{_when(ro.get('lastAnalysisAt'))}", "dim"),
                (f"failures {ro['failures']}", "red") if ro.get("failures") else None,
            )
        )
        for a in ro["analysis"]:
            interval = f"[{_fmt(a['lo'])}, {_fmt(a['hi'])}]" if a.get("lo") is not None else ""
            anode.add(
                _line(
                    (_MARK.get(a.get("verdict") or "", "·"), _STYLE.get(a.get("verdict") or "", "")),
                    (f"{a['name']:<18}", ""),
                    (f"{_fmt(a['value'])} {interval}".strip(), "bold"),
                    (f"threshold {_threshold(a)}", ""),
                    a.get("verdict"),
                )
            )
    d = view["drift"]
    score = d.get("score")
    over = score is not None and score >= d["threshold"]
    dnode = root.add(
        _line(
            _label("Drift"),
            (f"{score:.2f}" if score is not None else "no data", "bold red" if over else "bold"),
            (f"threshold {d['threshold']:g}", ""),
            (f"{d['requests']} requests", "dim") if d.get("requests") is not None else None,
            (f"checked {_when(d.get('checkedAt'))}", "dim") if d.get("checkedAt") else None,
        )
    )
    for reason in d["reasons"]:
        dnode.add(Text(reason))
    cj = view.get("lastCompileJob")
    if isinstance(cj, dict) and cj.get("kind") == "CompileJob":
        cnode = root.add(
            _line(_label("CompileJob"), (cj["name"], "cyan"), cj["phase"], (f"agent {cj['agent']}", "dim"))
        )
        _compilejob_tree(cnode, cj)
    elif isinstance(cj, dict) and cj.get("name"):
        root.add(_line(_label("CompileJob"), (cj["name"], "cyan"), cj.get("phase"), ("(deleted)", "dim")))
    else:
        root.add(_line(_label("CompileJob"), ("none yet", "dim")))
    if view["annotations"]:
        root.add(
            _line(_label("Annotations"), (", ".join(f"{k}={v}" for k, v in view["annotations"].items()), ""))
        )
    _conditions_tree(root, view["conditions"])
    return root


def _conditions_tree(root: Tree, conditions: list[JSON]) -> None:
    """Each condition with its reason; the message only where it says something (True, or Ready)."""
    node = root.add(_label("Conditions"))
    for c in conditions:
        talk = c.get("status") == "True" or c["type"] == "Ready"
        node.add(
            _line(
                (f"{c['type']:<12}", ""),
                c.get("status"),
                (c.get("reason") or "", "bold"),
                (c.get("message") or "", "dim") if talk else None,
            )
        )


def render_list(views: list[JSON]) -> list[list[str]]:
    if views and views[0]["kind"] == "CompileJob":
        header = ["NAMESPACE", "NAME", "PHASE", "STATUS", "DEPLOYMENT", "EXPERIMENTS", "BEST", "SPEEDUP"]
        rows = [
            [v["namespace"], v["name"], v["phase"], v["kstatus"], v.get("deployment") or "-",
             str(v["experiments"]["total"]), _short((v.get("best") or {}).get("build")),
             f"{(v.get('best') or {}).get('speedup'):.2f}x" if (v.get("best") or {}).get("speedup") else "-"]
            for v in views
        ]  # fmt: skip
        return [header, *rows]
    header = ["NAMESPACE", "NAME", "PHASE", "STATUS", "ACTIVE", "CANDIDATE", "ROLLOUT", "DRIFT", "COMPILEJOB"]
    rows = []
    for v in views:
        ro = v["rollout"]
        step = f" {ro['step']}/{ro['steps']} {ro['weight']}%" if ro["step"] is not None else ""
        cj = v.get("lastCompileJob") or {}
        score = v["drift"].get("score")
        rows.append(
            [v["namespace"], v["name"], v["phase"], v["kstatus"], _short((v.get("activeBuild") or {}).get("id")),
             _short((v.get("candidateBuild") or {}).get("id")), ro["phase"] + step,
             "-" if score is None else f"{score:.2f}/{v['drift']['threshold']:g}",
             f"{cj.get('name')} {cj.get('phase')}" if cj.get("name") else "-"]
        )  # fmt: skip
    return [header, *rows]


def _table_text(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


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


def _connect(args: argparse.Namespace) -> tuple[Any, str]:
    config = kubernetes.client.Configuration()
    path = args.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    path = path.split(os.pathsep)[0]
    namespace = args.namespace
    if os.path.exists(path):
        try:
            kubernetes.config.load_kube_config(
                config_file=path, context=args.context, client_configuration=config
            )
            contexts, current = kubernetes.config.list_kube_config_contexts(config_file=path)
        except (kubernetes.config.ConfigException, ValueError, OSError) as exc:
            raise Refused(f"--kubeconfig {path}: {str(exc).splitlines()[0]}") from None
        chosen = (
            next((c for c in contexts if c["name"] == args.context), current) if args.context else current
        )
        namespace = namespace or (chosen or {}).get("context", {}).get("namespace")
    else:
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)
        except kubernetes.config.ConfigException:
            raise Refused(
                f"--kubeconfig: no kubeconfig at {path} and not in a cluster; set KUBECONFIG or --kubeconfig."
            ) from None
    return KubeClient(config, timeout=args.request_timeout), namespace or "default"


def _print_json(console: Console, data: Any) -> None:
    console.file.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    console.file.flush()


def _show(s: Session, renderable_view: JSON) -> None:
    if s.output == "json":
        _print_json(s.console, renderable_view)
    else:
        s.console.print(render_tree(renderable_view))


def cmd_get(s: Session, args: argparse.Namespace) -> int:
    kind = _KINDS.get(args.kind.lower())
    if kind is None:
        raise Refused(f"get: unknown kind {args.kind!r}; use md (ModelDeployment) or cj (CompileJob).")

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
    kind = _KINDS.get(args.kind.lower())
    if kind is None:
        raise Refused(f"list: unknown kind {args.kind!r}; use md (ModelDeployment) or cj (CompileJob).")
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
        _print_json(s.console, views)
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
            table.add_row(*[_word(c) for c in r])
        s.console.print(table)
    else:
        s.console.file.write(_table_text(rows) + "\n")
    return 0


# --------------------------------------------------------------------------------------------
# Actions: each one the operator already honours, printed before it is applied.


@dataclass(frozen=True)
class Change:
    """One API write: a merge patch of a ModelDeployment, or a new CompileJob."""

    what: str
    kubectl: str
    apply: Callable[[], Any]
    patch: JSON | None = None


def _annotate(s: Session, name: str, values: Mapping[str, str | None], why: str) -> Change:
    patch: JSON = {"metadata": {"annotations": dict(values)}}
    parts = [f"{k}={v}" if v is not None else f"{k}-" for k, v in values.items()]
    overwrite = " --overwrite" if any(v is not None for v in values.values()) else ""
    return Change(
        why,
        f"kubectl -n {s.namespace} annotate modeldeployment {name} {' '.join(parts)}{overwrite}",
        lambda: s.kube.patch(MODELDEPLOYMENTS, s.namespace, name, patch),
        patch,
    )


def _spec_patch(s: Session, name: str, patch: JSON, why: str) -> Change:
    text = json.dumps(patch, separators=(",", ":"))
    return Change(
        why,
        f"kubectl -n {s.namespace} patch modeldeployment {name} --type merge -p '{text}'",
        lambda: s.kube.patch(MODELDEPLOYMENTS, s.namespace, name, patch),
        patch,
    )


def _apply(s: Session, args: argparse.Namespace, changes: Sequence[Change], then: Callable[[], None] | None = None) -> int:  # fmt: skip
    """Print every change, then (unless --dry-run) apply each in turn."""
    for change in changes:
        if s.output == "json":
            _print_json(s.console, {"action": change.what, "kubectl": change.kubectl, "patch": change.patch, "dryRun": args.dry_run})  # fmt: skip
        else:
            s.console.print(Text(change.what, style="bold"))
            s.console.print(Text(f"  $ {change.kubectl}", style="cyan"), soft_wrap=True)
    if args.dry_run:
        if s.output != "json":
            s.console.print(Text("(dry run: nothing applied)", style="dim"))
        return 0
    for i, change in enumerate(changes):
        change.apply()
        if then is not None and i == 0 and len(changes) > 1:
            then()
    if s.output != "json":
        s.console.print(Text("applied", style="green"))
    return 0


def _check_build(flag: str, build: str) -> str:
    if not re.match(BUILD_ID_PATTERN, build):
        raise Refused(f"{flag}: {build!r} is not a build id; use reference or sha256:<64 hex digits>.")
    return build


def _wait_for(s: Session, name: str, what: str, done: Callable[[JSON], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done(s.md(name)):
            return
        time.sleep(0.5)
    raise Refused(f"the operator did not {what} within --timeout {timeout:g}s; is it running?")


def _approve_changes(s: Session, args: argparse.Namespace, md: JSON, build: str) -> tuple[list[Change], Callable[[], None] | None]:  # fmt: skip
    name = md["metadata"]["name"]
    annotations = md["metadata"].get("annotations") or {}
    ro = (md.get("status") or {}).get("rollout") or {}
    values: dict[str, str | None] = {ANNOTATION_APPROVE: build}
    if annotations.get(ANNOTATION_ABORT, "").lower() == "true":
        values[ANNOTATION_ABORT] = None  # a left-over abort would abort the approved rollout at once
    paused = ro.get("phase") == "Paused" and ro.get("build") == build
    if paused and (ro.get("approvalAtPause") or annotations.get(ANNOTATION_APPROVE) == build):
        # The operator resumes only on an approval given after the pause: remove it, let the
        # operator see it gone (approvalAtPause turns false), then set it again.
        remove = _annotate(
            s, name, {ANNOTATION_APPROVE: None}, f"remove the approval given before {name} paused"
        )
        again = _annotate(
            s, name, values, f"approve {build} again: resume {name} at step {(ro.get('step') or 0) + 1}"
        )

        def seen() -> None:
            _wait_for(s, name, "see the approval removed", lambda m: not ((m.get("status") or {}).get("rollout") or {}).get("approvalAtPause"), args.timeout)  # fmt: skip

        return [remove, again], seen
    why = f"resume {name} at step {(ro.get('step') or 0) + 1} with {build}" if paused else f"approve {build} for {name}: start its canary rollout"  # fmt: skip
    return [_annotate(s, name, values, why)], None


def cmd_approve(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    status = md.get("status") or {}
    ro = status.get("rollout") or {}
    build = args.build
    if build is None:
        build = (
            ro.get("build") if ro.get("phase") == "Paused" else (status.get("candidateBuild") or {}).get("id")
        )
    if not build:
        raise Refused(
            f"{args.name} has no candidate build to approve (status.candidateBuild is empty); pass --build."
        )
    _check_build("--build", build)
    paused = ro.get("phase") == "Paused" and ro.get("build") == build
    if not paused:
        active = (status.get("activeBuild") or {}).get("id")
        candidate = (status.get("candidateBuild") or {}).get("id")
        if build == active:
            raise Refused(f"{args.name} already serves {build}; there is nothing to approve.")
        if build != candidate:
            raise Refused(
                f"--build: {build} is not {args.name}'s candidate ({candidate or 'none'}); "
                "the operator rolls out only status.candidateBuild."
            )
        if ro.get("build") == build and ro.get("phase") not in (None, "Idle"):
            raise Refused(
                f"{args.name}'s rollout of {_short(build)} already ran ({ro.get('phase')}); "
                "the operator does not roll the same build out twice."
            )
    changes, then = _approve_changes(s, args, md, build)
    return _apply(s, args, changes, then)


def cmd_abort(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    ro = (md.get("status") or {}).get("rollout") or {}
    if ro.get("phase") not in ("Progressing", "Paused") and not args.force:
        raise Refused(
            f"{args.name} has no rollout to abort (rollout phase {ro.get('phase') or 'Idle'}); "
            "--force sets the annotation anyway, so the next rollout is aborted at once."
        )
    why = f"abort the rollout of {_short(ro.get('build'))} on {args.name}: back to {_short(ro.get('fromBuild'))} on all replicas"  # fmt: skip
    return _apply(s, args, [_annotate(s, args.name, {ANNOTATION_ABORT: "true"}, why)])


def _retry_name(s: Session, base: str) -> str:
    taken = {j["metadata"]["name"] for j in s.kube.list(COMPILEJOBS, s.namespace)}
    stem = re.sub(r"-retry-[0-9]+$", "", base)[:52].rstrip("-")
    n = 1
    while f"{stem}-retry-{n}" in taken:
        n += 1
    return f"{stem}-retry-{n}"


def cmd_retry(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    name = md["metadata"]["name"]
    status = md.get("status") or {}
    ro = status.get("rollout") or {}
    annotations = md["metadata"].get("annotations") or {}
    if ro.get("phase") == "Paused" and ro.get("build"):
        changes, then = _approve_changes(s, args, md, ro["build"])
        return _apply(s, args, changes, then)
    if annotations.get(ANNOTATION_ABORT, "").lower() == "true":
        why = f"clear the abort of {name}, so its next candidate rolls out"
        return _apply(s, args, [_annotate(s, name, {ANNOTATION_ABORT: None}, why)])
    cj = s.last_compilejob(md)
    phase = ((cj or {}).get("status") or {}).get("phase")
    if cj is not None and phase in ("Failed", "Cancelled"):
        new_name = _retry_name(s, cj["metadata"]["name"])
        meta = cj["metadata"]
        body: JSON = {
            "apiVersion": cj.get("apiVersion", "polymorph.dev/v1alpha1"),
            "kind": "CompileJob",
            "metadata": {
                "name": new_name,
                "namespace": s.namespace,
                "labels": dict(meta.get("labels") or {}),
                "annotations": {"polymorph.dev/retry-of": meta["name"]},
                "ownerReferences": [
                    {"apiVersion": md.get("apiVersion", "polymorph.dev/v1alpha1"), "kind": "ModelDeployment",
                     "name": name, "uid": md["metadata"]["uid"], "controller": True}
                ],
            },
            "spec": cj["spec"],
        }  # fmt: skip
        what = f"run CompileJob {meta['name']} ({phase}) again as {new_name} with the same spec"
        manifest = json.dumps(body, indent=2)
        change = Change(
            what + f"; its best build becomes {name}'s candidate",
            f"kubectl -n {s.namespace} create -f - <<'EOF'\n{manifest}\nEOF",
            lambda: s.kube.create(COMPILEJOBS, s.namespace, body),
            body,
        )
        return _apply(s, args, [change])
    if ro.get("phase") == "RolledBack":
        raise Refused(
            f"{name}'s rollout of {_short(ro.get('build'))} was rolled back by analysis, and the operator does not "
            "roll the same build out twice; a new candidate comes from the next CompileJob (drift, after the cooldown)."
        )
    raise Refused(
        f"{name} has nothing to retry: no paused rollout, no abort annotation and no failed CompileJob "
        f"(rollout {ro.get('phase') or 'Idle'}, last CompileJob {phase or 'none'})."
    )


def cmd_pin(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    status = md.get("status") or {}
    build = args.build or (status.get("activeBuild") or {}).get("id")
    if not build:
        raise Refused(f"{args.name} has no active build yet; pass --build.")
    _check_build("--build", build)
    current = ((md.get("spec") or {}).get("build") or {}).get("pinned")
    if current == build:
        raise Refused(f"{args.name} is already pinned to {build}.")
    why = f"pin {args.name} to {build}: serve it, end any rollout, open no CompileJob"
    s.err.print(Text("note: spec is owned by git; commit spec.build.pinned too, or a GitOps sync undoes it", style="yellow"))  # fmt: skip
    return _apply(s, args, [_spec_patch(s, args.name, {"spec": {"build": {"pinned": build}}}, why)])


def cmd_unpin(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    current = ((md.get("spec") or {}).get("build") or {}).get("pinned")
    if not current:
        raise Refused(f"{args.name} is not pinned (spec.build.pinned is empty).")
    why = f"unpin {args.name} (was {current}): candidates roll out and drift recompiles again"
    s.err.print(Text("note: spec is owned by git; remove spec.build.pinned there too, or a GitOps sync undoes it", style="yellow"))  # fmt: skip
    return _apply(s, args, [_spec_patch(s, args.name, {"spec": {"build": {"pinned": None}}}, why)])


# --------------------------------------------------------------------------------------------
# Command line.


class _Parser(Parser):
    """``polymorph.inputs.Parser`` (defaults in help, ``-5m`` read as a value) with kubectl's wording."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"kubectl polymorph: {message.rstrip('.')}. See kubectl polymorph --help.\n")
        raise SystemExit(2)


_interval = duration()
"""The one duration syntax of every polymorph command (``polymorph.inputs.duration``)."""


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
        kube, namespace = _connect(args)
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
