"""``polymorph sandbox engine`` and ``polymorph sandbox agent`` as real processes on loopback, S3 on moto.

One engine process (tiny model, CPU) serves two agent processes in turn, sandbox 0 and 1
of a CompileJob with ``budget.sandboxes: 2``; everything they write lands in an S3 bucket
on the moto server, under ``compilejobs/<ns>/<name>-<uid>/``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from polymorph.contract.store import open_store

POLYMORPH = [sys.executable, "-m", "polymorph.cli"]

JOB = {
    "apiVersion": "polymorph.dev/v1alpha1",
    "kind": "CompileJob",
    "metadata": {"name": "tiny-cj", "namespace": "inference", "uid": "0f1e2d3c-aaaa-bbbb"},
    "spec": {
        "model": {"uri": "tiny", "dtype": "float32", "maxSeqLen": 256},
        "hardware": {"accelerator": "cpu"},
        "workload": {
            "profile": {
                "inputTokens": {"bounds": [32, 64], "counts": [3, 1]},
                "outputTokens": {"bounds": [16, 32], "counts": [3, 1]},
                "concurrency": 4,
            }
        },
        "agent": {"kind": "Search"},
        "budget": {"maxExperiments": 5, "deadline": "10m", "sandboxes": 2, "experimentTimeout": "2m"},
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def engine(tmp_path: Path) -> Iterator[str]:
    spec = tmp_path / "cj.yaml"
    spec.write_text(yaml.safe_dump(JOB))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ANTHROPIC_", "POLYMORPH_S3"))}
    proc = subprocess.Popen(
        [*POLYMORPH, "sandbox", "engine", "--spec", str(spec), "--port", str(port), "--repeats", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err


@pytest.mark.slow
def test_agent_and_engine_sandboxes_write_the_campaign_to_s3(
    engine: str, s3_bucket: str, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/polymorph"
    outputs = []
    for index in (0, 1):
        env = dict(os.environ, JOB_COMPLETION_INDEX=str(index), POLYMORPH_COMPILEJOB=json.dumps(JOB))
        env.pop("ANTHROPIC_API_KEY", None)
        proc = subprocess.run(
            [
                *POLYMORPH,
                "sandbox",
                "agent",
                "--engine-url",
                engine,
                "--store",
                uri,
                "--ready-timeout",
                "120s",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(json.loads(proc.stdout))
    store = open_store(uri)
    prefix = "compilejobs/inference/tiny-cj-0f1e2d3c-aaaa-bbbb/"
    keys = set(store.list(prefix))
    assert {
        prefix + f
        for f in ("ledger-0.jsonl", "ledger-1.jsonl", "progress-0.json", "progress-1.json", "result.json")
    } <= keys
    ledgers = [store.read_jsonl(prefix + f"ledger-{i}.jsonl") for i in (0, 1)]
    # 5 experiments shared 3 + 2: sandbox 0 keeps its third for the judgement's final pairing
    # (unused when the baseline leads), sandbox 1's two are the baseline and one candidate.
    assert [len(x) for x in ledgers] in ([3, 2], [2, 2])
    base = ledgers[0][0]["build"]
    assert ledgers[1][0]["build"] == base, "each sandbox measures the baseline"
    rest = [{r["build"] for r in ledger[1:]} for ledger in ledgers]
    assert not rest[0] & rest[1], "sandboxes explored the same candidate"
    assert all(r["sandbox"] == i for i, ledger in enumerate(ledgers) for r in ledger)
    progress = store.get_json(prefix + "progress-1.json")
    assert progress["state"] == "finished" and progress["stopReason"] == "maxExperiments"
    assert progress["budget"]["maxExperiments"] == 2
    result = store.get_json(prefix + "result.json")
    assert result["experiments"]["total"] == sum(len(x) for x in ledgers)
    assert result["state"] in ("improved", "noImprovement")
    if result["best"]:
        assert store.has_build(result["best"]["build"])
        assert result["best"]["uri"].startswith(f"s3://{s3_bucket}/")
    assert outputs[1]["result"].endswith("result.json")
    # report.html beside it, on S3: the last sandbox's covers both ledgers (each one's baseline is no point).
    assert outputs[1]["report"] == f"{uri}/{prefix}report.html"
    page = store.get_bytes(prefix + "report.html").decode()
    points = page.count('<circle class="point"') + page.count('<g class="no-figures">')
    assert points == sum(len(x) for x in ledgers) - 2


def test_agent_rejects_a_bad_spec_in_one_sentence(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(JOB))
    bad["spec"]["budget"]["sandboxz"] = 3
    env = dict(os.environ, POLYMORPH_COMPILEJOB=json.dumps(bad))
    proc = subprocess.run(
        [*POLYMORPH, "sandbox", "agent", "--store", str(tmp_path / "s")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2
        and "spec.budget: unknown field 'sandboxz'" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    env = dict(os.environ, POLYMORPH_COMPILEJOB=json.dumps(JOB), JOB_COMPLETION_INDEX="2")
    proc = subprocess.run(
        [*POLYMORPH, "sandbox", "agent", "--store", str(tmp_path / "s")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "sandbox index" in proc.stderr


@pytest.mark.slow
def test_claude_sandbox_agent_reads_its_key_from_the_mounted_file(engine: str, tmp_path: Path) -> None:
    from fake_anthropic import FakeAnthropic, message, tool_use

    key = "sk-ant-sandbox-" + os.urandom(12).hex()
    keyfile = tmp_path / "api-key"
    keyfile.write_text(key + "\n")
    job = json.loads(json.dumps(JOB))
    job["spec"]["agent"] = {"kind": "Claude", "apiKeySecretRef": {"name": "anthropic", "key": "api-key"}}
    job["spec"]["budget"]["sandboxes"] = 1
    replies = [
        message([tool_use("list_files", {})]),
        message([tool_use("finish", {"summary": "nothing to do"})]),
    ]
    store = tmp_path / "store"
    with FakeAnthropic(key, lambda req, n: replies[n]) as api:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        env.update(
            ANTHROPIC_BASE_URL=api.url,
            POLYMORPH_ANTHROPIC_KEY_FILE=str(keyfile),
            POLYMORPH_COMPILEJOB=json.dumps(job),
        )
        proc = subprocess.run(
            [*POLYMORPH, "sandbox", "agent", "--engine-url", engine, "--store", str(store)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 0, proc.stderr
    assert len(api.requests) == 2 and json.loads(proc.stdout)["stopReason"] == "finished"
    s = open_store(str(store))
    prefix = "compilejobs/inference/tiny-cj-0f1e2d3c-aaaa-bbbb/"
    assert [r["agent"] for r in s.read_jsonl(prefix + "ledger-0.jsonl")] == ["claude"]
    everything = "".join(p.read_text(errors="replace") for p in store.rglob("*.json*"))
    assert key not in everything and key not in proc.stdout and key not in proc.stderr
