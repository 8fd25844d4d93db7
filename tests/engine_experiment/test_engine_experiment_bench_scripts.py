"""The benchmark scripts in bench/: bad flags get one line naming the flag (never a traceback, and
before any model loads), and search_quality's choice of which sweep points may be the best."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import search_quality  # noqa: E402  (a script beside the others in bench/)

BAD_FLAGS = [
    ("search_quality.py", ["--max-experiments", "0"], "--max-experiments must be a positive integer"),
    ("search_quality.py", ["--deadline", "soon"], "--deadline: 'soon' is not a duration"),
    ("search_quality.py", ["--min-speedup", "nan"], "--min-speedup must be a finite number >= 1"),
    ("search_quality.py", ["--experiment-timeout", "0"], "--experiment-timeout must be a positive number"),
    (
        "search_quality.py",
        ["--anchor", "kv_cache=nope"],
        "--anchor 'kv_cache=nope': knob 'kv_cache' of build 'reference' must be one of concat, static",
    ),
    ("search_quality.py", ["--sweep-from", "/nonexistent.json"], "--sweep-from /nonexistent.json: not a"),
    (
        "search_quality.py",
        ["--sweep-only", "--sweep-from", "x.json"],
        "--sweep-only and --sweep-from: give one",
    ),
    (
        "search_quality.py",
        ["--sweep-screen", "--sweep-from", "x.json"],
        "--sweep-screen and --sweep-from: --sweep-from reuses a sweep",
    ),
    ("search_quality.py", ["--sweep-timeout", "-1"], "--sweep-timeout must be a positive number of seconds"),
    ("search_quality.py", ["--model", "nope"], "model source 'nope' is neither a shape"),
    ("tile_tuning.py", [], "bench/tile_tuning.py needs a CUDA device"),
    ("moe_down.py", ["--layers", "0"], "--layers must be a positive integer; got 0"),
    ("decode.py", ["--device", "cpu", "--models", "nope"], "--models must name shapes from"),
    ("decode.py", ["--device", "cpu", "--batches", "1,0"], "--batches must be comma-separated positive"),
    ("decode.py", ["--device", "cpu", "--knobs", "kv_cache=nope"], "knob 'kv_cache' of build 'reference'"),
    ("decode.py", ["--device", "cpu", "--engines", "vllm"], "--engines must be comma-separated from"),
    (
        "decode.py",
        ["--device", "cpu", "--prefill-lengths", "64,x"],
        "--prefill-lengths must be comma-separated",
    ),
    ("hot_vs_cold.py", ["--model", "nope"], "model source 'nope' is neither a shape"),
    ("hot_vs_cold.py", ["--dtype", "int3"], "dtype must be one of bfloat16, float16, float32"),
    ("demo_stability.py", ["--runs", "0"], "--runs must be a positive integer"),
    ("demo_stability.py", ["--limit", "-3"], "--limit must be a positive number of seconds"),
    ("fleet_drift.py", ["--drifted", "9", "--deployments", "3"], "--drifted between 0 and --deployments"),
    ("fleet_drift.py", ["--scrape-interval", "5"], "--scrape-interval must be whole seconds such as 5s"),
    ("fleet_drift.py", ["--timeout", "0"], "--timeout must be a positive number of seconds"),
    ("fleet_drift.py", ["--kubeconfig", "/nonexistent"], "--kubeconfig /nonexistent: no such file"),
    ("serve_load.py", ["--clients", "0"], "--clients must be a positive integer"),
    ("serve_guidellm.py", ["--requests", "0"], "--requests: must be a positive integer, got '0'"),
    ("serve_guidellm.py", ["--endpoints", "embeddings"], "--endpoints: must be comma-separated from chat"),
    ("fidelity.py", ["--requests", "0"], "--requests: must be a whole number from 1 to 100000"),
    ("fidelity.py", ["--builds", "kv_cache=nope"], "knob 'kv_cache' of build 'reference' must be one of"),
    ("fidelity.py", ["--builds", ";"], "--builds names no knob set"),
    ("fidelity.py", ["--model", "nope"], "model source 'nope' is neither a shape"),
    ("fidelity.py", ["--shapes", "/nonexistent.yaml"], "workload file /nonexistent.yaml: file not found"),
]


@pytest.mark.parametrize(("script", "args", "expected"), BAD_FLAGS, ids=lambda v: str(v)[:40])
def test_a_bad_flag_gets_one_line(script: str, args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-2000:]
    assert expected in lines[0] and "Traceback" not in done.stderr, lines
    assert not out.exists(), "a refused run writes no result"


def _point(speedup: float, lo: float, hi: float, gain: float = 1.0, status: str = "passed") -> dict[str, Any]:
    """A sweep point as search_quality records it: its interval over the anchor, the chained speedup."""
    return {
        "config": {"speedup": speedup},
        "status": status,
        "speedup": speedup,
        "vsAnchor": speedup / gain,
        "ci": [lo / gain, hi / gain],
    }


def test_contenders_are_the_points_whose_interval_reaches_the_best() -> None:
    noisy_top = _point(4.50, 4.03, 5.04, gain=1.33)  # the highest estimate, but wide
    tight = _point(4.20, 4.14, 4.27, gain=1.33)
    also = _point(4.11, 3.96, 4.26, gain=1.33)
    below = _point(2.81, 2.79, 2.83, gain=1.33)  # its interval ends under the top's lower bound
    failed = _point(9.0, 8.0, 10.0, status="failed")
    chosen = search_quality.contenders([below, tight, failed, noisy_top, also])
    assert [p["speedup"] for p in chosen] == [4.50, 4.20, 4.11]
    assert search_quality.chained_ci(tight) == pytest.approx((4.14, 4.27))


def test_contenders_of_one_precise_best_is_that_point_alone_and_at_most_four() -> None:
    precise = _point(2.0, 1.98, 2.02)
    assert search_quality.contenders([precise, _point(1.5, 1.45, 1.55)]) == [precise]
    many = [_point(3.0 - i / 100, 2.5, 3.5) for i in range(8)]
    assert len(search_quality.contenders(many)) == search_quality.MAX_CONTENDERS
    assert search_quality.contenders([_point(2.0, 1.9, 2.1, status="crashed")]) == []


def test_a_screened_sweep_measures_its_contenders_again_by_the_full_protocol(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "search_quality.py"), "--knobs", "kv_cache,attention", "--sweep-only",
         "--sweep-screen", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    points = json.loads(out.read_text())["exhaustive"]["points"]
    assert len(points) == 3
    full = [p for p in points if not p["screen"]]
    # Every point that may be the best was measured again in full; its screen is kept beside it.
    assert full and all(not p["screen"] for p in search_quality.contenders(points))
    assert all(set(p["screened"]) == {"speedup", "ci", "passes"} for p in full)
    assert all("screened" not in p for p in points if p["screen"])


def test_fidelity_records_the_estimate_beside_the_full_replay(tmp_path: Path) -> None:
    shape = tmp_path / "shape.yaml"
    shape.write_text(
        "inputTokens: {bounds: [8, 32], counts: [50, 50]}\noutputTokens: {bounds: [4, 12], counts: [50, 50]}\n"
        "concurrency: 3\n"
    )
    out = tmp_path / "fidelity.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "fidelity.py"), "--shapes", str(shape), "--requests", "8", "--full-passes", "1",
         "--builds", "kv_cache=concat;kv_cache=static", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    (entry,) = doc["shapes"]
    assert entry["concurrency"] == 3 and entry["requests"] == 8 and entry["plan"].startswith("sampled steps")
    assert [b["knobs"] for b in entry["builds"]] == [{"kv_cache": "concat"}, {"kv_cache": "static"}]
    for build in entry["builds"]:
        assert build["full"]["outputTokS"] > 0 and build["estimate"]["outputTokS"] > 0
        assert set(build["error"]) == {"outputTokS", "totalTokS", "ttftP95Ms", "itlP95Ms"}
        for gaps in (build["estimateItlMs"], build["fullItlMs"]):  # the ITL's tail, for where p95 sits
            assert list(gaps) == ["p50", "p90", "p95", "p98", "p99"] and list(gaps.values()) == sorted(
                gaps.values()
            )
        # Where a sampled pass's time goes: its calls, layout and host work add up to its wall time.
        split = build["passSplit"]
        assert split["callsPerPass"]["prefill"] >= 1 and split["callsS"]["prefill"] > 0
        parts = sum(split["callsS"].values()) + split["layoutS"] + split["hostS"]
        assert parts == pytest.approx(split["wallS"], abs=2e-3)
    assert doc["device"]["type"] == "cpu" and doc["command"] and doc["date"]


def test_decode_times_a_prefill_of_each_length_and_composes_a_shapes_tok_s(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    workload = tmp_path / "shape.yaml"
    workload.write_text("inputTokens: {bounds: [16, 48], counts: [50, 50]}\n"
                        "outputTokens: {bounds: [4, 8], counts: [50, 50]}\nconcurrency: 2\n")  # fmt: skip
    run = subprocess.run(
        [sys.executable, str(BENCH / "decode.py"), "--device", "cpu", "--models", "tiny", "--batches", "2",
         "--engines", "polymorph,hf-eager", "--knobs", "kv_cache=static,decode_step=fused", "--steps", "2",
         "--warmup", "1", "--prefill-lengths", "8,40", "--workload", str(workload), "--out", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["protocol"]["prefillLengths"] == [8, 40]
    assert [r["engine"] for r in doc["rows"]] == ["polymorph", "hf-eager"]
    for row in doc["rows"]:
        assert row.get("error") is None, row
        assert set(row["prefill_ms"]) == {"8", "40"} and all(ms > 0 for ms in row["prefill_ms"].values())
        # Composed from the row's own timings: every step at the batch's step time, prefills between.
        assert 0 < row["shape_tok_s"] < row["tok_s"]
