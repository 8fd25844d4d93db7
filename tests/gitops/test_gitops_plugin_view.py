"""``kubectl polymorph``'s views, from objects: the leaderboard and the plain tree (the running system is
in tests/operator/test_operator_kubectl_plugin.py and the e2e)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from phases import CANDIDATE, compilejob_phases, deployment_phases
from rich.console import Console

from polymorph.contract.store import LocalStore, ledger_key
from polymorph.kubectl_plugin.render import render_tree
from polymorph.kubectl_plugin.view import compilejob_view, deployment_view, ledger_leaderboard


def plain(view: dict[str, object]) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(render_tree(view))
    return out.getvalue()


def cj_with_sandboxes(metric: str = "outputTokensPerSecond") -> dict[str, object]:
    cj = compilejob_phases()["succeeded"]
    cj["spec"] = {**cj["spec"], "objective": {"metric": metric}}
    cj["status"]["sandboxes"] = [
        {"index": 0, "phase": "Done", "experiments": 5, "bestBuild": CANDIDATE, "bestValue": 152.3},
        {
            "index": 1,
            "phase": "Done",
            "experiments": 3,
            "bestBuild": "sha256:" + "c" * 64,
            "bestValue": 120.0,
        },
    ]
    return cj


def test_leaderboard_ranks_by_factor_over_the_baseline() -> None:
    board = compilejob_view(cj_with_sandboxes())["leaderboard"]
    assert [(r["rank"], r["role"], r["speedup"]) for r in board] == [
        (1, "best", 1.52), (2, "candidate", 1.2), (3, "baseline", 1.0)
    ]  # fmt: skip
    assert board[0]["sandbox"] == 0


def test_leaderboard_of_a_latency_objective_ranks_lower_first() -> None:
    cj = cj_with_sandboxes("itlP95")
    cj["status"]["best"] = None
    board = compilejob_view(cj)["leaderboard"]
    # baseline 100 ms; 120 is slower (0.833x), 152.3 slower still
    assert [r["role"] for r in board] == ["baseline", "candidate", "candidate"]
    assert board[1]["speedup"] == round(100 / 120, 3)


def test_tree_shows_step_weight_analysis_drift_and_the_compilejob() -> None:
    md = deployment_phases()["paused-after-failures"]
    md["status"]["drift"] = {
        "score": 0.61,
        "reasons": ["input tokens moved 1.8 doublings"],
        "checkedAt": None,
    }
    md["status"]["rollout"]["analysis"] = [
        {"name": "throughput", "value": 0.91, "lo": 0.88, "hi": 0.93, "min": 0.98, "verdict": "Fail"},
        {"name": "itl-p95", "value": 1.02, "lo": 0.99, "hi": 1.05, "max": 1.1, "verdict": "Pass"},
    ]
    text = plain(deployment_view(md, cj_with_sandboxes()))
    assert "ModelDeployment inference/chat" in text and "Failed" in text
    assert "step 1/2" in text and "weight 25%" in text
    assert "throughput" in text and "0.91 [0.88, 0.93]" in text and "threshold >= 0.98" in text
    assert "threshold <= 1.1" in text
    assert "0.61" in text and "threshold 0.25" in text and "input tokens moved 1.8 doublings" in text
    assert "CompileJob" in text and "★ 1." in text and "1.52x" in text and "sandbox 1" in text
    assert "Stalled" in text and "AnalysisFailed" in text


def test_ledger_leaderboard_ranks_paired_experiments(tmp_path: Path) -> None:
    """With --store, the leaderboard is every passed experiment paired with the baseline, from the ledgers."""
    store = LocalStore(tmp_path)
    cj = cj_with_sandboxes()
    base = cj["status"]["baseline"]["build"]
    other = "sha256:" + "e" * 64

    def rec(
        build: str, status: str, ratio: float | None, against: str = base, desc: str = ""
    ) -> dict[str, Any]:
        paired = None if ratio is None else {"against": against, "ratio": ratio, "lo": ratio - 0.1, "hi": ratio + 0.1, "pairs": 6}  # fmt: skip
        return {"build": build, "status": status, "comparison": paired, "description": desc}

    meta = cj["metadata"]
    store.append_jsonl(
        ledger_key(meta["namespace"], meta["name"], meta["uid"], 0),
        [rec(base, "passed", None, desc="baseline"), rec(CANDIDATE, "passed", 1.5, desc="static cache"),
         rec(other, "passed", 1.2, desc="fused mlp"), rec(other, "passed", 1.1, desc="again, lower")],
    )  # fmt: skip
    store.append_jsonl(
        ledger_key(meta["namespace"], meta["name"], meta["uid"], 1),
        [rec("sha256:" + "f" * 64, "rejected", 2.0), rec("sha256:" + "d" * 64, "passed", 1.9, against=other)],
    )
    board = ledger_leaderboard(store, cj)
    assert [(r["rank"], r["build"], r["speedup"], r["role"]) for r in board] == [
        (1, CANDIDATE, 1.5, "best"), (2, other, 1.2, "candidate")
    ]  # fmt: skip
    assert board[0]["ci"] == [1.4, 1.6] and board[0]["pairs"] == 6 and board[1]["description"] == "fused mlp"
    view = {**compilejob_view(cj), "leaderboard": board, "leaderboardFrom": "ledger"}
    text = plain(view)
    assert "from the ledgers, paired with the baseline" in text and "1.50x  [1.40, 1.60] (6 pairs)" in text
