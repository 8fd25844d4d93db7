"""``kubectl polymorph``'s view: a ModelDeployment or CompileJob read into a plain dict.

The tree, the plain text and ``-o json`` all render this one view. Owns the leaderboard (from
status, or from the campaign's ledgers in the store with ``--store``), each analysis value
beside its threshold, and the kstatus reading of the conditions. It knows nothing about the
terminal or the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polymorph.contract.api.common import DEFAULT_NAMESPACE
from polymorph.contract.store import KeyNotFound, Store, ledger_key
from polymorph.core.resources import ANNOTATION_ABORT, ANNOTATION_APPROVE

JSON = dict[str, Any]
KINDS = {"md": "md", "modeldeployment": "md", "modeldeployments": "md", "cj": "cj", "compilejob": "cj", "compilejobs": "cj"}  # fmt: skip
LOWER_IS_BETTER = {"ttftP95", "itlP95"}


class Refused(Exception):
    """Bad input or a state the action does not apply to: one sentence, exit status 2."""


# --------------------------------------------------------------------------------------------
# Reading the objects into a view (a plain dict: the tree, the text and -o json all render it).


def short_id(build: str | None) -> str:
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


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def threshold_text(v: Mapping[str, Any]) -> str:
    lo, hi = v.get("min"), v.get("max")
    if lo is not None and hi is not None:
        return f"{fmt(lo)}..{fmt(hi)}"
    if lo is not None:
        return f">= {fmt(lo)}"
    if hi is not None:
        return f"<= {fmt(hi)}"
    return "-"


def _leaderboard(cj: Mapping[str, Any]) -> list[JSON]:
    """Baseline and each sandbox's best, the campaign's best first, with the factor over the baseline
    on the objective."""
    status = cj.get("status") or {}
    metric = ((cj.get("spec") or {}).get("objective") or {}).get("metric", "outputTokensPerSecond")
    lower = metric in LOWER_IS_BETTER
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
    # The campaign's verdict first: its speedup is the paired comparison it kept, the others' are
    # a sandbox's best value over the baseline's, unpaired, which noise can put above it.
    out.sort(key=lambda r: (r["role"] != "best", -(r["speedup"] or 0.0)))
    for i, row in enumerate(out, 1):
        row["rank"] = i
    return out


def ledger_records(store: Store, cj: Mapping[str, Any]) -> list[tuple[int, JSON]]:
    """Every experiment record in the CompileJob's ledgers, with its sandbox."""
    meta, spec, status = cj.get("metadata", {}), cj.get("spec") or {}, cj.get("status") or {}
    ns, name, uid = meta.get("namespace") or DEFAULT_NAMESPACE, meta.get("name", ""), meta.get("uid", "")
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
    maximize = ((spec.get("objective") or {}).get("metric", "outputTokensPerSecond")) not in LOWER_IS_BETTER
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
