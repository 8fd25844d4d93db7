"""Traces are never lost silently (issue 17): ``polymorph engine serve`` as a real process.

A store the engine cannot write is refused at start-up, before the model loads, in one line.
A store that starts failing later is shown in ``/metrics`` and ``/readyz``, and the process
says so when it stops, with exit status 1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_serving.test_engine_serving_cli import _start

SERVE = ["--model", "tiny", "--model-deployment", "chat", "--namespace", "inference", "--max-seq-len", "128"]


def _unwritable_proc(_: Path) -> str:
    return "/proc/polymorph-traces"  # nobody, root included, may create a folder here


def _a_file(tmp: Path) -> str:
    path = tmp / "store-file"
    path.write_text("a file, not a folder")
    return str(path)


def _trace_folder_is_a_file(tmp: Path) -> str:
    store = tmp / "store"
    (store / "workloads" / "inference").mkdir(parents=True)
    (store / "workloads" / "inference" / "chat").write_text("in the way")
    return str(store)


def _read_only_folder(tmp: Path) -> str:
    if os.geteuid() == 0:
        return _unwritable_proc(tmp)
    store = tmp / "ro"
    store.mkdir()
    store.chmod(0o555)
    return str(store)


@pytest.mark.parametrize("store", [_unwritable_proc, _a_file, _trace_folder_is_a_file, _read_only_folder])
def test_a_store_traces_cannot_reach_is_refused_at_start(
    tmp_path: Path, store: Callable[[Path], str]
) -> None:
    where = store(tmp_path)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "polymorph.cli", "engine", "serve", *SERVE, "--port", "0",
         "--store", where, "--trace-sample-rate", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: --store {where} is not ") and "Traceback" not in done.stderr
    assert time.monotonic() - began < 30  # before the model loads


def test_no_store_check_without_tracing(tmp_path: Path) -> None:
    """The store is probed only when traces are written: serving a reference build needs no store."""
    proc, url = _start([*SERVE, "--store", _a_file(tmp_path)], tmp_path)
    try:
        assert "trace" not in httpx.get(f"{url}/readyz").json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0


def _trace_counts(url: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name == "polymorph_trace_requests_total":
                counts[s.labels["outcome"]] = s.value
            if s.name == "polymorph_trace_write_errors_total":
                counts["write_errors"] = s.value
    return counts


def test_a_store_that_fails_later_is_exposed_and_the_exit_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc, url = _start(
        [*SERVE, "--store", str(store), "--trace-sample-rate", "1", "--trace-flush-interval", "1s"], tmp_path
    )
    try:
        assert _trace_counts(url) == {"written": 0, "dropped": 0, "write_errors": 0}
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200
        deadline = time.monotonic() + 30
        while _trace_counts(url)["written"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _trace_counts(url)["written"] == 1  # the first trace reached the store
        folder = store / "workloads" / "inference" / "chat"
        shutil.rmtree(folder)
        folder.write_text("the store broke")  # every later write fails
        for _ in range(3):
            assert (
                httpx.post(f"{url}/v1/completions", json={"prompt": "b", "max_tokens": 2}).status_code == 200
            )
        deadline = time.monotonic() + 30
        while _trace_counts(url)["dropped"] < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        counts = _trace_counts(url)
        assert counts["dropped"] == 3 and counts["write_errors"] >= 1
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 200  # serving goes on; the loss is visible
        trace = ready.json()["trace"]
        assert trace["dropped"] == 3 and trace["lastError"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "the traces of 3 sampled requests could not be written" in err and "Traceback" not in err
