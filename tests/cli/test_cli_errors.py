"""The CLI's error boundary (issue 9): each case a user once met as a traceback is now one line.

Every case runs ``polymorph.cli.main`` in process and asserts exit status 2, exactly one line
on stderr naming the problem, and no traceback. Where the issue asks for the check to come
before expensive work, ``no_model_load`` makes loading a model fail the test: the error must
be reported before any model or engine worker is started.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from polymorph.cli import main
from polymorph.contract.errors import UsageError
from polymorph.contract.job import read_compilejob
from polymorph.contract.workload import load_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
STANDALONE = EXAMPLES / "compilejob-standalone.yaml"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``polymorph *argv``; never a traceback."""
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.err.strip().splitlines()


def one_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The single ``error: ...`` line of a command that must exit 2."""
    code, lines = cli(capsys, *argv)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, lines)
    return lines[0]


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model or starting an engine worker fails the test (as an internal error, exit 1)."""

    def loaded(*_: object, **__: object) -> None:
        raise AssertionError("a model was loaded before the error was reported")

    monkeypatch.setattr("polymorph_engine.experiment.supervisor.Supervisor.start", loaded)
    monkeypatch.setattr("polymorph_engine.experiment.supervisor.Supervisor.__enter__", loaded)
    monkeypatch.setattr("polymorph_engine.serving.cli.load_model", loaded)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the store, checked before the baseline runs ------------------------------------------------


@pytest.mark.usefixtures("no_model_load")
def test_compile_store_under_proc(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, "compile", "--store", "/proc/x")
    assert "--store /proc/x is not writable" in line


@pytest.mark.usefixtures("no_model_load")
def test_compile_store_that_is_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    file = tmp_path / "store.txt"
    file.write_text("not a folder")
    line = one_line(capsys, "compile", "--store", str(file))
    assert f"--store {file} is not writable" in line and "Not a directory" in line


@pytest.mark.usefixtures("no_model_load")
def test_compile_store_s3_unreachable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    for name, value in {
        "POLYMORPH_S3_ENDPOINT": endpoint,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    line = one_line(capsys, "compile", "--store", "s3://bucket/prefix")
    assert "cannot reach the S3 endpoint" in line and endpoint in line


# --- numbers and durations ------------------------------------------------------------------------


@pytest.mark.usefixtures("no_model_load")
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_compile_min_speedup_not_finite(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    line = one_line(capsys, "compile", "--store", str(tmp_path), f"--min-speedup={value}")
    assert "--min-speedup: must be a number >= 1 and <= 1000" in line


@pytest.mark.usefixtures("no_model_load")
def test_compile_experiment_timeout_overflow(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = one_line(
        capsys, "compile", "--store", str(tmp_path), "--experiment-timeout", "99999999999999999999d"
    )
    assert "--experiment-timeout" in line and "longest duration allowed, 366d" in line


def test_validate_refuses_an_overflowing_duration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = yaml.safe_load(STANDALONE.read_text())
    doc["spec"]["budget"]["experimentTimeout"] = "99999999999999999999d"
    path = tmp_path / "cj.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = main(["validate", str(path)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 1 and len(lines) == 1
    assert "spec.budget.experimentTimeout" in lines[0] and "366d" in lines[0]


@pytest.mark.usefixtures("no_model_load")
def test_compile_deadline_zero_says_positive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = one_line(capsys, "compile", "--store", str(tmp_path), "--deadline", "0s")
    assert "--deadline" in line and "durations must be positive" in line


@pytest.mark.usefixtures("no_model_load")
@pytest.mark.parametrize("command", ["compile", "experiment"])
def test_bare_seconds_get_the_same_answer_everywhere(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    extra = ["--store", str(tmp_path)] if command == "compile" else ["--build", "reference"]
    line = one_line(capsys, command, *extra, "--experiment-timeout", "90")
    assert "--experiment-timeout: '90' is not a duration (add a unit: 90s)" in line


# --- files and ports ----------------------------------------------------------------------------


def test_crds_output_under_proc(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, "crds", "--output", "/proc/x")
    assert "/proc/x" in line


@pytest.mark.usefixtures("no_model_load")
def test_sandbox_engine_port_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(
        capsys, "sandbox", "engine", "--spec", str(STANDALONE), "--model", "tiny", "--port", "99999"
    )
    assert "--port: must be a whole number from 1 to 65535" in line


@pytest.mark.usefixtures("no_model_load")
def test_sandbox_engine_port_taken_before_the_model_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = one_line(
            capsys, "sandbox", "engine", "--spec", str(STANDALONE), "--model", "tiny", "--port", port
        )
    assert f"cannot listen on 127.0.0.1:{port}" in line


@pytest.mark.usefixtures("no_model_load")
def test_engine_serve_port_taken_before_the_model_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = one_line(capsys, "engine", "serve", "--model", "tiny", "--port", port)
    assert f"cannot listen on 127.0.0.1:{port}" in line


def test_checkpoint_config_json_that_is_a_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    line = one_line(capsys, "engine", "serve", "--model", str(tmp_path), "--port", "0")
    assert "config.json" in line


# --- the smaller edges ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trace.JSONL", "trace.json"])
def test_a_trace_named_jsonl_in_capitals_or_json_is_a_trace(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(
        '{"inputTokens": 12, "outputTokens": 3, "arrivalS": 0}\n{"inputTokens": 40, "outputTokens": 9, "arrivalS": 0.5}\n'
    )
    workload = load_workload(path)
    assert [(r.input_tokens, r.output_tokens) for r in workload.requests] == [(12, 3), (40, 9)]


@pytest.mark.usefixtures("no_model_load")
def test_a_knob_whose_requirement_is_unmet_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, "experiment", "--build", "reference", "--knob", "decode_capture=compile")
    assert "has no effect with kv_cache=concat" in line and "add --knob kv_cache=static" in line


def test_workload_errors_read_like_validate(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("inputTokens: {bounds: [1], counts: [1]}\nconcurrency: 0\n")
    with pytest.raises(UsageError) as err:
        load_workload(path)
    assert str(err.value) == f"workload file {path}: outputTokens: is required."
    path.write_text("inputTokens: {bounds: [1], counts: [1]}\ninputTokens: {bounds: [2], counts: [1]}\n")
    with pytest.raises(UsageError, match="duplicate key 'inputTokens'"):
        load_workload(path)


def test_sandbox_spec_errors_read_like_validate(tmp_path: Path) -> None:
    doc = yaml.safe_load(STANDALONE.read_text())
    doc["spec"]["budget"]["deadline"] = "soon"
    path = tmp_path / "cj.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError) as err:
        read_compilejob(str(path))
    message = str(err.value)
    assert "spec.budget.deadline: must be a duration: a positive whole number" in message
    assert "^" not in message and "\n" not in message  # no raw regex


def test_help_states_the_real_store_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["experiment", "--help"])
    assert "./.polymorph/store" in " ".join(capsys.readouterr().out.split())


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("polymorph ")


def test_a_bug_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_: object) -> int:
        raise KeyError("oops")

    monkeypatch.setattr("polymorph.contract.validate.run", broken)
    monkeypatch.delenv("POLYMORPH_DEBUG", raising=False)
    code, lines = cli(capsys, "validate", "x.yaml")
    assert code == 1 and len(lines) == 1 and "internal error (KeyError" in lines[0]


@pytest.mark.usefixtures("no_model_load")
@pytest.mark.parametrize("command", ["compile", "experiment"])
def test_an_impossible_thread_count_is_refused_before_the_worker_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    extra = ["--store", str(tmp_path)] if command == "compile" else ["--build", "reference"]
    line = one_line(capsys, command, *extra, "--threads", "99999999999999999999")
    assert "--threads: must be a whole number from 1 to 4096" in line
