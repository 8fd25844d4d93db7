"""``polymorph compile`` end to end on the real engine (tiny model, CPU), as real processes.

Covers: the --json report and its fields, the best build running again by id through
``polymorph experiment``, resume after SIGKILL mid-campaign without repeating an
experiment, and one-sentence errors for bad flags. The campaigns search the reference build less
its torch.compile values (``support.builds.eager_reference_build``): what these tests hold does
not depend on the candidates, and inductor compiling them would be most of their CPU time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polymorph.contract.store import open_store
from support.builds import eager_reference_build

POLYMORPH = [sys.executable, "-m", "polymorph.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ANTHROPIC_API_KEY", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _compile(store: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [*POLYMORPH, "compile", "--store", str(store), "--json", "--repeats", "3", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def _ledger_builds(store: Path) -> list[tuple[str, str | None, bool]]:
    """The ledger's experiments as (build, the build it was paired against, screened): one build
    may run paired with several others (a comparator, the leader, the baseline), and screened
    then by the full protocol, never twice the same way."""
    s = open_store(str(store))
    keys = [k for k in s.list("compilejobs/") if k.endswith(".jsonl")]
    assert len(keys) == 1, keys
    return [
        (r["build"], (r.get("comparison") or {}).get("against"), bool(r.get("screen")))
        for r in s.read_jsonl(keys[0])
    ]


@pytest.mark.slow
def test_compile_json_report_and_the_best_build_runs_again_by_id(tmp_path: Path) -> None:
    store = tmp_path / "store"
    base = eager_reference_build(tmp_path / "base")
    proc = _compile(store, "--max-experiments", "5", "--campaign", "cli", "--base-build", str(base))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["state"] in ("improved", "noImprovement")
    assert doc["baseline"]["value"] > 0 and doc["baseline"]["build"].startswith("sha256:")
    # The agent's share is 4 (one is kept for the judgement's final pairing, unused when the
    # baseline leads).
    assert 4 <= doc["experiments"]["total"] == doc["experiments"]["ranThisRun"] <= 5
    assert doc["experimentsPerHour"] > 0
    assert doc["overhead"]["coldStartS"] > doc["overhead"]["hotSwapS"] > 0
    builds = _ledger_builds(store)
    assert len(builds) == len(set(builds)) == doc["experiments"]["total"]
    # A CPU campaign searches no value that acts only on an accelerator (build.toml's accelerator_only).
    s = open_store(str(store))
    (ledger,) = [k for k in s.list("compilejobs/") if k.endswith(".jsonl")]
    inert = {
        ("decode_capture", "cuda_graph"),
        ("kernels", "triton"),
        ("gemv", "triton"),
        ("pdl", True),
        ("residual", "norm"),
    }
    assert not [r["knobs"] for r in s.read_jsonl(ledger) if inert & set(r["knobs"].items())]
    # Progress lines went to stderr; stdout is exactly the JSON object.
    assert "baseline" in proc.stderr
    # The best (or, without a winner, the leading candidate) is stored with a manifest and runs by id.
    s = open_store(str(store))
    best = (doc["best"] or doc["bestCandidate"])["build"]
    manifest = s.get_manifest(best)
    assert manifest.workload is not None and manifest.figures is not None and manifest.knobs
    rerun = subprocess.run(
        [*POLYMORPH, "experiment", "--build", best, "--store", str(store), "--json", "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(),
    )
    assert rerun.returncode == 0, rerun.stderr
    record = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert record["build"] == best and record["status"] == "passed"


@pytest.mark.slow
def test_resume_after_kill_repeats_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    base = eager_reference_build(tmp_path / "base")
    flags = ["--max-experiments", "6", "--campaign", "kill", "--base-build", str(base)]
    cmd = [*POLYMORPH, "compile", "--store", str(store), "--json", "--repeats", "3", *flags]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), start_new_session=True
    )
    s = open_store(str(store))
    deadline = time.monotonic() + 180
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None:
        keys = (
            [k for k in s.list("compilejobs/") if k.endswith(".jsonl")]
            if (store / "compilejobs").exists()
            else []
        )
        seen = len(s.read_jsonl(keys[0])) if keys else 0
        if seen >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the campaign ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its engine worker, mid-campaign
    proc.communicate(timeout=30)
    before = _ledger_builds(store)
    assert 3 <= len(before) < 6
    again = _compile(store, *flags)
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    after = _ledger_builds(store)
    assert after[: len(before)] == before
    assert len(after) == len(set(after)), "an experiment ran twice"
    assert doc["experiments"]["fromLedger"] >= len(before)
    assert doc["experiments"]["ranThisRun"] == len(after) - len(before)
    assert doc["experiments"]["total"] == len(after) <= 6


def test_bad_flags_are_one_sentence(tmp_path: Path) -> None:
    for flags, needle in (
        (["--deadline", "soon"], "--deadline"),
        (["--max-experiments", "0"], "--max-experiments"),
        (["--workload", str(tmp_path / "missing.yaml")], "workload"),
        (["--campaign", "Bad Name"], "--campaign"),
        (["--base-build", "sha256:" + "0" * 64], "--base-build"),
    ):
        proc = _compile(tmp_path / "store", *flags, timeout=60)
        assert proc.returncode == 2, (flags, proc.stderr)
        assert needle in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_claude_agent_without_a_key_is_a_usage_error(tmp_path: Path) -> None:
    proc = _compile(tmp_path / "store", "--agent", "claude", timeout=60)
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr and "Traceback" not in proc.stderr
