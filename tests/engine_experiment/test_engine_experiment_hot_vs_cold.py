"""bench/hot_vs_cold.py runs end to end (small) and reports what docs/performance.md promises."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "hot_vs_cold.py"


def test_hot_vs_cold_small_run(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    command = [
        sys.executable,
        str(SCRIPT),
        "--model",
        "tiny",
        "--builds",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "0",
    ]
    command += ["--verify-steps", "4", "--decode-steps", "8", "--json", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result == json.loads(out.read_text())
    assert [b["name"] for b in result["builds"]] == ["reference", "kv_cache=static"]
    assert result["all_passed"], result["builds"]
    assert result["cold_s_per_experiment"] > result["hot_s_per_experiment"] > 0
    assert result["ratio"] > 3  # cold pays imports and weights every time (~20x+ unloaded)
    assert result["hot_experiments_per_hour"] == pytest.approx(
        3600 / result["hot_s_per_experiment"], rel=0.01
    )
    b = result["builds"][1]
    assert b["coldPhases"]["importS"] > 0 and b["hotTimings"]["verifyS"] > 0
    assert 0 < b["rooflineFraction"] < 1 and b["decodeBatch1TokensPerSecond"] > 0
    assert result["roofline"]["copyBandwidthGBps"] > 0 and result["device"]["type"] == "cpu"
    assert result["command"].endswith("--out " + str(out)) and result["versions"]["torch"]


def test_bad_build_count_is_one_sentence() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--builds", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    message = done.stderr.strip()
    assert done.returncode == 2 and message.count("\n") == 0
    assert re.fullmatch(r"error: --builds must be between 1 and \d+; got 0\.", message)
