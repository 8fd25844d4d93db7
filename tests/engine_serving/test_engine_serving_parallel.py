"""``polymorph engine serve --tensor-parallel 2`` on a CPU (two gloo ranks): the completions of one
process, and a rank that fails alone stops the server with the rank named."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from engine_support.builds import wrapping_build

_URL = re.compile(r"on (http://127\.0\.0\.1:\d+)")


def _start(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "polymorph.cli", "engine", "serve", "--port", "0", "--model", "tiny", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        cwd=cwd,
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


def _complete(url: str) -> list[str]:
    texts = []
    for prompt in ("The quick brown fox", "hello"):
        response = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 12}, timeout=60)
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
    return texts


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    return err


def test_two_ranks_serve_the_completions_of_one(tmp_path: Path) -> None:
    one, url = _start([], tmp_path)
    try:
        expected = _complete(url)
    finally:
        _stop(one)
    two, url = _start(["--tensor-parallel", "2"], tmp_path)
    try:
        assert _complete(url) == expected
    finally:
        err = _stop(two)
    assert two.returncode == 0, err


def test_a_rank_that_raises_stops_the_server_naming_it(tmp_path: Path) -> None:
    body = "        if model.shard.rank == 1:\n            raise RuntimeError('rank 1 exploded')\n        return original(*args)"
    build = wrapping_build(tmp_path / "b", "one-rank", "decode", body)
    proc, url = _start(["--tensor-parallel", "2", "--rank-timeout", "3s", "--build", str(build)], tmp_path)
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=60)
    assert response.status_code >= 500
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "rank 1 raised in decode: RuntimeError: rank 1 exploded" in err
