"""What GitOps tools and people see of the live loop: kstatus, Argo CD health and ``kubectl polymorph``.

``Observer`` keeps every distinct version (by resourceVersion) of the ModelDeployment and its
CompileJobs that the scenario's waits read. ``report`` runs them all through the real kstatus
library and the Argo CD health scripts (``tests/tools``), and the real kubectl with the
``kubectl polymorph`` plugin on the final state; ``problems`` says which verdicts disagree with
the mapping docs/operate.md documents (an empty list: none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import NS, Fleet
from support.go_tools import run_json
from support.k8s_binaries import kubectl as kubectl_binary

__all__ = ["Observer", "problems", "report"]

HEALTH = Path(__file__).resolve().parents[1] / "resource_customizations" / "polymorph.dev"
ROLLING = ("Progressing", "Promoting", "RollingBack")


@dataclass
class Observer:
    """Distinct versions of the deployment and its CompileJobs, in the order they were seen."""

    fleet: Fleet
    md: str
    seen: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {"ModelDeployment": [], "CompileJob": []}
    )
    _versions: set[tuple[str, str, str]] = field(default_factory=set)

    def observe(self) -> None:
        objects = [self.fleet.md(self.md), *self.fleet.compilejobs()]
        for obj in objects:
            if not obj:
                continue
            meta = obj["metadata"]
            key = (obj["kind"], meta["name"], meta.get("resourceVersion", ""))
            if key not in self._versions:
                self._versions.add(key)
                self.seen[obj["kind"]].append(obj)


def _verdicts(kind: str, objects: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kstatus, Argo CD health, Argo CD message) of each object, from the real tools."""
    if not objects:
        return []
    text = json.dumps(objects)
    ks = run_json("kstatus", [], text)
    argo = run_json("argocd-lua", ["health", str(HEALTH / kind / "health.lua")], text)
    return [(str(k["status"]), str(a["status"]), str(a["message"])) for k, a in zip(ks, argo, strict=True)]


def plugin(fleet: Fleet, *args: str) -> str:
    """``kubectl polymorph ARGS`` through the real kubectl, which finds the plugin on PATH (with the
    store's credentials, for ``--store``)."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **getattr(fleet, "aws", {}), "KUBECONFIG": str(fleet.kubeconfig), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    done = subprocess.run(
        [str(kubectl_binary()), "polymorph", *args], env=env, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl polymorph {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def report(observer: Observer) -> dict[str, Any]:
    """Every seen version with its verdicts, and the plugin's view of the final state."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for kind, objects in observer.seen.items():
        rows[kind] = [
            {"object": obj, "kstatus": v[0], "health": v[1], "message": v[2]}
            for obj, v in zip(objects, _verdicts(kind, objects), strict=True)
        ]
    return {
        "rows": rows,
        "get": plugin(observer.fleet, "get", "md", observer.md, "-n", NS),
        "json": json.loads(plugin(observer.fleet, "get", "md", observer.md, "-n", NS, "-o", "json")),
        "list": plugin(observer.fleet, "list", "-n", NS),
        "ledger": json.loads(
            plugin(
                observer.fleet,
                "get",
                "md",
                observer.md,
                "-n",
                NS,
                "-o",
                "json",
                "--store",
                observer.fleet.store_uri,
            )
        ),
    }


def _true(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (
            c
            for c in (obj.get("status") or {}).get("conditions") or []
            if c["type"] == kind and c["status"] == "True"
        ),
        None,
    )


def problems(rep: dict[str, Any]) -> list[str]:
    """Where a live verdict disagrees with the documented mapping; also what was never seen."""
    out: list[str] = []
    seen_health: set[str] = set()
    for row in rep["rows"]["ModelDeployment"]:
        obj, ks, health = row["object"], row["kstatus"], row["health"]
        st, meta = obj.get("status") or {}, obj["metadata"]
        rv = meta.get("resourceVersion")
        seen_health.add(health)
        phase = (st.get("rollout") or {}).get("phase") or "Idle"
        stalled = _true(obj, "Stalled")
        for c in st.get("conditions") or []:
            if not isinstance(c.get("observedGeneration"), int):
                out.append(f"md@{rv}: condition {c['type']} has no observedGeneration")
        if st.get("observedGeneration") is None:
            want = ("Current", "Progressing")  # before the first status: kstatus cannot tell yet
        elif st["observedGeneration"] != meta.get("generation"):
            want = ("InProgress", "Progressing")
        elif stalled is not None:
            want = ("Failed", "Suspended" if stalled["reason"] == "AnalysisFailed" else "Degraded")
        elif _true(obj, "Degraded"):
            want = ("InProgress" if _true(obj, "Reconciling") else "Current", "Degraded")
        elif phase in ROLLING:
            want = ("InProgress", "Progressing")
        elif (_true(obj, "Reconciling") or {}).get("reason") == "WaitingForApproval":
            want = ("InProgress", "Suspended")
        elif _true(obj, "Reconciling"):
            want = ("InProgress", "Progressing")
        else:
            want = ("Current", "Healthy")
        if (
            phase in ROLLING
            and stalled is None
            and not _true(obj, "Reconciling")
            and st.get("observedGeneration") == meta.get("generation")
        ):
            out.append(f"md@{rv}: rollout {phase} but Reconciling is not True")
        if (ks, health) != want:
            out.append(f"md@{rv} (rollout {phase}): kstatus {ks}, health {health}; want {want}")
    for status in ("Healthy", "Progressing", "Suspended", "Degraded"):
        if status not in seen_health:
            out.append(f"the ModelDeployment was never {status} in Argo CD")
    final = rep["rows"]["ModelDeployment"][-1]
    if (final["kstatus"], final["health"]) != ("Failed", "Degraded"):
        out.append(f"after the rollback: kstatus {final['kstatus']}, health {final['health']}")
    for row in rep["rows"]["CompileJob"]:
        obj, ks, health = row["object"], row["kstatus"], row["health"]
        phase = (obj.get("status") or {}).get("phase")
        want_cj = {"Pending": ("InProgress", "Progressing"), "Running": ("InProgress", "Progressing"),
                   "Succeeded": ("Current", "Healthy"), "Failed": ("Failed", "Degraded")}.get(phase or "", ("Current", "Progressing"))  # fmt: skip
        if (ks, health) != want_cj:
            out.append(f"cj {obj['metadata']['name']}@{obj['metadata'].get('resourceVersion')} ({phase}): kstatus {ks}, health {health}; want {want_cj}")  # fmt: skip
    return out
