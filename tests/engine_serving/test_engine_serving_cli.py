"""``polymorph engine serve`` as a real process: store builds, SIGTERM, trace flushed to the store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from polymorph.cli import main
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import LocalStore, archive_build, build_archive_key
from polymorph.contract.workload import parse_trace

_URL = re.compile(r"on (http://127\.0\.0\.1:\d+)")


def _start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """Start the server on a free port (``--port 0``) and return it with its URL once it listens."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polymorph.cli", "engine", "serve", "--port", "0", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        match = _URL.search(line)
        if match:
            return proc, match.group(1)
    proc.kill()
    raise AssertionError(f"the server did not start: {proc.stderr.read()}")


def test_serve_a_store_build_and_flush_the_trace_on_sigterm(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    build = store.put_build(REFERENCE_BUILD)
    proc, url = _start(
        [
            "--model", "tiny", "--build", build, "--store", str(tmp_path / "store"),
            "--model-deployment", "chat", "--namespace", "inference", "--trace-sample-rate", "1",
            "--max-seq-len", "256", "--build-cache", str(tmp_path / "cache"),
        ],
        tmp_path,
    )  # fmt: skip
    try:
        trace = {"written": 0, "dropped": 0, "writeErrors": 0, "lastError": None}
        assert httpx.get(f"{url}/readyz").json() == {"status": "ready", "build": build, "trace": trace}
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["chat", "tiny"]
        plain = httpx.post(
            f"{url}/v1/completions", json={"model": "chat", "prompt": "hello", "max_tokens": 4}
        )
        assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 4
        body = {"prompt": "hi there", "max_tokens": 3, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        too_long = httpx.post(f"{url}/v1/completions", json={"prompt": "x" * 300})
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"
        metrics = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
        ttft = [
            s for s in metrics["polymorph_time_to_first_token_seconds"].samples if s.name.endswith("_count")
        ]
        assert [(s.labels, s.value) for s in ttft] == [
            ({"build": build, "model_deployment": "chat", "track": "stable"}, 2.0)
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    keys = store.list("workloads/inference/chat/")
    assert len(keys) == 1 and re.fullmatch(r"workloads/inference/chat/trace-[0-9T.]+Z\.jsonl", keys[0])
    lines = store.get_bytes(keys[0]).decode().splitlines()
    assert "hello" not in "".join(lines)  # shapes, never content
    workload = parse_trace(lines)
    assert sorted((r.input_tokens, r.output_tokens) for r in workload.requests) == [(5, 4), (8, 3)]
    assert {tuple(json.loads(line)) for line in lines} == {("inputTokens", "outputTokens", "arrivalS")}


def test_a_tampered_store_build_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    build = store.put_build(REFERENCE_BUILD)
    other = tmp_path / "other"
    other.mkdir()
    (other / "build.toml").write_text('[build]\nname = "other"\n')
    store.put_bytes(build_archive_key(build), archive_build(other))
    proc = subprocess.run(
        [sys.executable, "-m", "polymorph.cli", "engine", "serve", "--model", "tiny", "--build", build,
         "--store", str(tmp_path / "store"), "--port", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "refusing" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--trace-sample-rate", "2", "--store", "x"], "--trace-sample-rate"),
        (["--trace-sample-rate", "0.5"], "--store"),
        (["--max-batch", "0"], "--max-batch"),
        (["--port", "70000"], "--port"),
        (["--track", "blue"], "--track must be stable or canary"),
        (["--build", "no/such/dir"], "--build"),
        (["--build", "sha256:1234", "--store", "s"], "--build"),
    ],
)
def test_bad_flags_are_one_sentence(
    flags: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    # Every case fails before the model loads, so nothing here ever starts serving.
    code = main(["engine", "serve", "--model", "tiny", *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err


def test_engine_without_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine"]) == 2
    assert "serve" in capsys.readouterr().err
