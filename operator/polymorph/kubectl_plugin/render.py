"""``kubectl polymorph``'s rendering: a view as a rich tree on a terminal, the same tree in plain
text when piped, and the one-line-per-object table of ``list``. It knows nothing about the cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.text import Text
from rich.tree import Tree

from polymorph.kubectl_plugin.view import JSON, fmt, short_id, threshold_text

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


def word(value: Any) -> Text:
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
            out.append_text(word(part))
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
                (short_id(row["build"]), "cyan"),
                (f"{fmt(row['value'], 4)}", ""),
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
        root.add(_line(_label("Deployment"), (view.get("deployment") or "standalone", ""), (f"agent {view['agent']}", "dim"), (f"base {short_id(view['baseBuild'])}", "dim")))  # fmt: skip
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
            (f"pinned {short_id(view['pinned'])}", "magenta") if view.get("pinned") else None,
        )
    )
    active = view.get("activeBuild") or {}
    root.add(
        _line(
            _label("Active build"),
            (short_id(active.get("id")), "cyan"),
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
        _line(_label("Candidate"), (short_id(cand["id"]), "cyan"))
        if cand
        else _line(_label("Candidate"), ("none", "dim"))
    )
    ro = view["rollout"]
    if ro["step"] is not None:
        where = (f"step {ro['step']}/{ro['steps']}", "bold")
        weight = (f"weight {ro['weight']}% (actual {fmt(ro['actualWeight'])}%)", "")
        replicas = (f"canary {ro['canaryReplicas']}, stable {ro['stableReplicas']}", "dim")
    else:
        where = weight = replicas = ("", "")
    rnode = root.add(_line(_label("Rollout"), ro["phase"], where, weight, replicas))
    if ro.get("build") and ro["step"] is not None:
        rnode.add(_line((f"{short_id(ro['fromBuild'])} -> {short_id(ro['build'])}", "cyan")))
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
            interval = f"[{fmt(a['lo'])}, {fmt(a['hi'])}]" if a.get("lo") is not None else ""
            anode.add(
                _line(
                    (_MARK.get(a.get("verdict") or "", "·"), _STYLE.get(a.get("verdict") or "", "")),
                    (f"{a['name']:<18}", ""),
                    (f"{fmt(a['value'])} {interval}".strip(), "bold"),
                    (f"threshold {threshold_text(a)}", ""),
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
             str(v["experiments"]["total"]), short_id((v.get("best") or {}).get("build")),
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
            [v["namespace"], v["name"], v["phase"], v["kstatus"], short_id((v.get("activeBuild") or {}).get("id")),
             short_id((v.get("candidateBuild") or {}).get("id")), ro["phase"] + step,
             "-" if score is None else f"{score:.2f}/{v['drift']['threshold']:g}",
             f"{cj.get('name')} {cj.get('phase')}" if cj.get("name") else "-"]
        )  # fmt: skip
    return [header, *rows]


def table_text(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
