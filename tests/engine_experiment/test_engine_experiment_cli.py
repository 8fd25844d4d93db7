"""``polymorph experiment`` end to end through ``polymorph.cli.main``: JSON lines, a table, one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from engine_support.builds import MODEL, patched_build, sensitive_checkpoint, wrapping_build
from polymorph.cli import main
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import LocalStore

QUICK = ["--model", MODEL, "--repeats", "2", "--warmup", "0", "--threads", "1"]


def test_json_lines_for_dirs_store_ids_and_knob_variants_in_one_engine(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    checkpoint = sensitive_checkpoint(tmp_path / "checkpoint")  # --model also takes a checkpoint dir
    store = LocalStore(tmp_path / "store")
    stored = store.put_build(REFERENCE_BUILD)
    wrong = patched_build(
        tmp_path / "no-norm",
        "no-norm",
        [("h = rms_norm(x, lw.mlp_norm, self.eps)", "h = x")],
        file="model.py",
    )
    # A build that prints from the worker: its chatter must go to stderr, never into --json stdout.
    chatty = wrapping_build(
        tmp_path / "chatty", "chatty", "decode", "        print('chatter')\n        return original(*args)"
    )
    workload = tmp_path / "trace.jsonl"
    workload.write_text(
        "".join(
            json.dumps({"inputTokens": 6, "outputTokens": 3, "arrivalS": i * 0.01}) + "\n" for i in range(4)
        )
    )
    argv = [
        "experiment",
        *QUICK,
        "--model",
        str(checkpoint),
        "--build",
        "reference",
        "--build",
        stored,
        "--store",
        str(tmp_path / "store"),
    ]
    argv += ["--build", str(wrong), "--build", str(chatty), "--knob", "kv_cache=static"]
    argv += ["--workload", str(workload), "--json"]
    assert main(argv) == 1  # one build was rejected
    captured = capfd.readouterr()  # file descriptors: what the worker process wrote too
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert "chatter" in captured.err
    assert [r["status"] for r in records] == ["passed", "passed", "rejected", "passed"]
    assert [r["name"] for r in records] == ["reference", "reference", "no-norm", "chatty"]
    assert all(r["knobs"]["kv_cache"] == "static" for r in records)
    assert records[0]["build"] == records[1]["build"] != stored  # the same variant of the same build
    assert records[0]["figures"]["outputTokensPerSecond"] > 0 and records[2]["figures"] is None
    assert records[2]["verification"]["logitError"] > 0.05


def test_a_readable_table_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", *QUICK, "--build", "reference"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "passed" in out and "worker starts: 1" in out
    # The shape measured, with what the CPU scaling changed (issue 31: printed on every device).
    assert re.search(
        r"measured at: \d+ requests at concurrency \d+, .*\(full replay\); workload scaled down", out
    )


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["experiment", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--build", "reference", "--knob", "kv_cache"], "--knob must look like name=value"),
        (["--build", "reference", "--knob", "nope=1"], "has no knob 'nope'"),
        (["--build", "reference", "--knob", "kv_cache=paged"], "must be one of concat, static"),
        (["--build", "reference", "--device", "tpu"], "--device must be cpu or cuda"),
        (["--build", "reference", "--dtype", "int8"], "dtype must be one of"),
        (["--build", "reference", "--model", "gpt-9"], "--model must be a shape"),
        (
            ["--build", "reference", "--experiment-timeout", "soon"],
            "--experiment-timeout: 'soon' is not a duration",
        ),
        (["--build", "reference", "--experiment-timeout", "-3"], "durations must be positive"),
        (["--build", "reference", "--repeats", "1"], "--repeats: must be a whole number from 2 to 1000"),
        (["--build", "reference", "--threads", "0"], "--threads: must be a whole number from 1 to 4096"),
        (["--build", "sha256:xyz"], "is not a build id"),
        (
            ["--build", "no/such/dir"],
            "--build must be 'reference', a build id sha256:<64 hex> or a build directory",
        ),
    ],
)
def test_bad_flags_are_one_sentence(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _error(argv, capsys)


def test_files_and_store_errors_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = "sha256:" + "0" * 64
    assert "has no build" in _error(["--build", missing, "--store", str(tmp_path / "store")], capsys)
    assert "w.yaml: file not found" in _error(
        ["--build", "reference", "--workload", str(tmp_path / "w.yaml")], capsys
    )
    not_a_build = tmp_path / "empty"
    not_a_build.mkdir()
    assert "needs a build.toml" in _error(["--build", str(not_a_build)], capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where no GPU is visible")
def test_cuda_without_a_gpu_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert "no CUDA device is visible" in _error(["--build", "reference", "--device", "cuda"], capsys)
