"""``kubectl polymorph``'s views, from objects: the leaderboard and the plain tree (the running system is
in tests/operator/test_operator_kubectl_plugin.py and the e2e)."""

from __future__ import annotations

import io

from phases import CANDIDATE, compilejob_phases, deployment_phases
from rich.console import Console

from polymorph.kubectl_plugin import compilejob_view, deployment_view, render_tree


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
