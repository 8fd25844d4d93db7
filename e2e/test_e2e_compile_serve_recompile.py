"""Whole loop on a laptop: compile, serve the winner by id, capture traffic, recompile on it.

Every step is the real command line in its own process, sharing one local store:

1. ``polymorph compile`` runs a search campaign on the tiny model and stores its builds;
2. ``polymorph experiment --build <id>`` runs the stored build again, hash-verified;
3. ``polymorph engine serve --build <id>`` serves it; chat completions (plain and streaming, the
   client traffic), a streamed completion and ``/metrics`` carry the build id; the sampled
   traffic trace, a chat request at its rendered prompt length, is flushed on SIGTERM;
4. ``polymorph compile --workload <trace>`` tunes again for the traffic the server saw.

Both campaigns start from the reference less its torch.compile values (``--base-build``,
``support.builds``): what each step hands the next holds whichever build the search keeps, and a
compiled one cost the campaign, the re-run and the server a compilation each on two shared cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from polymorph.contract.store import LocalStore
from polymorph.contract.workload import parse_trace
from support.builds import eager_reference_build

_URL = re.compile(r"on (http://\S+)")


def _polymorph(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymorph.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _compile(cwd: Path, store: Path, campaign: str, *extra: str) -> dict[str, Any]:
    base = cwd / "eager-reference"
    if not base.exists():
        eager_reference_build(base)
    proc = _polymorph(
        [
            "compile",
            "--base-build",
            str(base),
            "--store",
            str(store),
            "--campaign",
            campaign,
            "--max-experiments",
            "4",
            "--repeats",
            "3",
            "--json",
            *extra,
        ],
        cwd,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _serve(cwd: Path, args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "polymorph.cli", "engine", "serve", "--port", "0", *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if match := _URL.search(line):
            return proc, match.group(1)
    proc.kill()
    raise AssertionError(f"the engine did not start: {proc.stderr.read()}")


def test_compile_serve_capture_and_recompile(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)

    # 1. A campaign on the embedded defaults (but its base) stores every build that passed the gates.
    first = _compile(tmp_path, store_dir, "e2e")
    assert first["baseline"] is not None
    assert first["experiments"]["total"] >= 2
    chosen = first["best"] or first["bestCandidate"]
    assert chosen is not None, first
    build = chosen["build"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", build)
    assert store.has_build(build)
    manifest = store.get_manifest(build)
    assert manifest.workload is not None and manifest.figures is not None

    # 2. The stored build runs again by id.
    again = _polymorph(
        ["experiment", "--model", "tiny", "--build", build, "--store", str(store_dir), "--json"], tmp_path
    )
    assert again.returncode == 0, again.stderr
    record = json.loads(again.stdout.splitlines()[-1])
    assert record["build"] == build and record["status"] == "passed"

    # 3. Serve it by id; every request is sampled into the trace.
    proc, url = _serve(
        tmp_path,
        [
            "--model",
            "tiny",
            "--build",
            build,
            "--store",
            str(store_dir),
            "--model-deployment",
            "chat",
            "--namespace",
            "e2e",
            "--trace-sample-rate",
            "1",
            "--track",
            "canary",
        ],
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/readyz").status_code == 200
            prompt_tokens = []  # the rendered prompts' lengths, as the engine counted them
            for n in range(5):  # client traffic is chat
                message = {"role": "user", "content": "x" * (10 + 7 * n)}
                r = client.post(
                    "/v1/chat/completions",
                    json={"model": "tiny", "messages": [message], "max_completion_tokens": 4 + n},
                )
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] >= 1
                prompt_tokens.append(r.json()["usage"]["prompt_tokens"])
            assert prompt_tokens[0] > 10  # the chat template's text is part of the prompt
            with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 5,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ) as s:
                events = [line for line in s.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            prompt_tokens.append(json.loads(events[-2].removeprefix("data: "))["usage"]["prompt_tokens"])
            with client.stream(  # and a completion, streamed
                "POST",
                "/v1/completions",
                json={"model": "tiny", "prompt": "hello", "max_tokens": 5, "stream": True},
            ) as s:
                events = [line for line in s.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            prompt_tokens.append(len(b"hello"))
            metrics = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        requests = [s for s in metrics["polymorph_requests"].samples if s.name == "polymorph_requests_total"]
        assert sum(s.value for s in requests if s.labels["status"] == "ok") == 7
        assert {s.labels["build"] for s in requests} == {build}
        assert {s.labels["model_deployment"] for s in requests} == {"chat"}
        assert {s.labels["track"] for s in requests} == {"canary"}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0

    traces = store.list("workloads/e2e/chat/")
    assert len(traces) == 1, traces
    trace_file = tmp_path / "trace.jsonl"
    trace_file.write_bytes(store.get_bytes(traces[0]))
    captured = parse_trace(trace_file.read_text().splitlines())
    assert len(captured.requests) == 7
    assert sorted(r.input_tokens for r in captured.requests) == sorted(prompt_tokens)  # chat: rendered

    # 4. Recompile for the traffic the server captured: a different workload, a new campaign.
    second = _compile(tmp_path, store_dir, "e2e-captured", "--workload", str(trace_file))
    assert second["baseline"] is not None
    assert second["campaign"]["prefix"] != first["campaign"]["prefix"]
    assert second["experiments"]["total"] >= 2
