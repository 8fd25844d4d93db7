"""One input policy at the CLI boundary (issue 17), every command.

- Numbers, names and URLs: a bad value is one ``error: --flag: ...`` line saying what is allowed,
  exit 2, never a traceback, before anything loads.
- Files: read at most 16 MiB, so ``/dev/zero`` or a huge file is one sentence at once; numbers
  in them are bounded before they are converted.
- Durations: one syntax (``polymorph.contract.api.parse_duration``) for every flag, manifests and the
  chart's values: the same text means the same seconds everywhere, and a bad one gets the same
  sentence everywhere.
- Help: every flag says its default; compile and experiment share their measurement flags, and
  the report's "run again" line measures a build as its campaign did, paired with the baseline.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from polymorph.cli import build_parser, main
from polymorph.compile.cli import _rerun
from polymorph.contract import measurement
from polymorph.contract.api import ModelDeployment
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import Parser
from polymorph.handlers.settings import from_args
from polymorph.kubectl_plugin.cli import build_parser as kubectl_plugin_parser
from support.cli import error_line

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "crds" / "examples"
SPEC = str(EXAMPLES / "compilejob-standalone.yaml")
MD_EXAMPLE = EXAMPLES / "modeldeployment-minimal.yaml"


@pytest.fixture
def nothing_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model or starting a worker fails the test: bad input is refused before."""

    def loaded(*_: object, **__: object) -> None:
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr("polymorph_engine.experiment.supervisor.Supervisor.__enter__", loaded)
    monkeypatch.setattr("polymorph_engine.serving.cli.load_model", loaded)
    monkeypatch.setattr("polymorph_engine.sandbox.cli.Supervisor", loaded, raising=False)


# --- numbers, names and URLs ------------------------------------------------------------------

SERVE = ["engine", "serve", "--model", "tiny"]
OPERATOR = ["operator", "--namespace", "a", "--prometheus-url", "http://p:9090", "--store", "/s"]


@pytest.mark.usefixtures("nothing_loads")
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*SERVE, "--seed", "99999999999999999999999"], "--seed: must be a whole number from 0 to 9223372036854775807"),
        ([*SERVE, "--seed", "-1"], "--seed: must be a whole number from 0"),
        ([*SERVE, "--max-batch", "1e3"], "--max-batch: must be a whole number from 1 to 4096"),
        ([*SERVE, "--max-queue", "9" * 5000], "--max-queue: must be a whole number from 0"),
        ([*SERVE, "--port", "99999"], "--port: must be a whole number from 0 to 65535"),
        ([*SERVE, "--trace-sample-rate", "nan"], "--trace-sample-rate: must be a number >= 0 and <= 1"),
        ([*SERVE, "--trace-sample-rate", "1e999"], "--trace-sample-rate: must be a number >= 0 and <= 1"),
        ([*SERVE, "--model-deployment", "Bad Name!"], "--model-deployment: must be a ModelDeployment name"),
        ([*SERVE, "--model-deployment", "a" * 64], "--model-deployment: must be a ModelDeployment name"),
        ([*SERVE, "--namespace", "Prod"], "--namespace: must be a namespace name"),
        ([*SERVE, "--track", "blue"], "--track must be stable or canary"),
        (["compile", "--max-experiments", "-1"], "--max-experiments: must be a whole number from 1"),
        (["compile", "--max-experiments", "0x10"], "--max-experiments: must be a whole number"),
        (["compile", "--repeats", "99999999999999999999999"], "--repeats: must be a whole number from 2 to 1000"),
        (["compile", "--min-speedup", "1e999"], "--min-speedup: must be a number >= 1"),
        (["compile", "--min-speedup", "0.9"], "--min-speedup: must be a number >= 1"),
        (["compile", "--max-tokens", "0"], "--max-tokens: must be a whole number from 1"),
        (["compile", "--campaign", "a" * 100], "--campaign must be at most 63 lowercase letters"),
        (["experiment", "--build", "reference", "--seed", "-3"], "--seed: must be a whole number from 0"),
        (["experiment", "--build", "reference", "--warmup", "101"], "--warmup: must be a whole number from 0 to 100"),
        (["experiment", "--build", "reference", "--threads", "1.5"], "--threads: must be a whole number from 1"),
        (["sandbox", "engine", "--spec", SPEC, "--port", "-1"], "--port: must be a whole number from 1 to 65535"),
        (["sandbox", "engine", "--spec", SPEC, "--repeats", "1"], "--repeats: must be a whole number from 2"),
        (["sandbox", "agent", "--spec", SPEC, "--index", "64"], "--index: must be a whole number from 0 to 63"),
        (["sandbox", "agent", "--spec", SPEC, "--engine-url", "http://[::1"], "--engine-url: must be an http(s):// URL"),
        (["sandbox", "agent", "--spec", SPEC, "--ready-timeout", "900"], "--ready-timeout: '900' is not a duration"),
        ([*OPERATOR, "--prometheus-url", "http://[::1"], "--prometheus-url must be an http(s):// URL (Invalid IPv6"),
        ([*OPERATOR, "--prometheus-url", "http://127.0.0.1:99999"], "--prometheus-url must be an http(s):// URL (Port"),
        ([*OPERATOR, "--store", "relative/dir"], "--store 'relative/dir' is a relative path"),
        ([*OPERATOR, "--metrics-port", "9" * 5000], "--metrics-port must be a port number from 1 to 65535"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    line = error_line(capsys, argv)
    assert line.startswith(f"error: {expected}") or expected in line, line
    assert len(line) < 400  # the input is never echoed whole


# --- files -------------------------------------------------------------------------------------


def _huge_int_yaml(tmp: Path) -> str:
    path = tmp / "w.yaml"
    path.write_text(
        f"inputTokens: {{bounds: [{'9' * 5000}], counts: [1]}}\noutputTokens: {{bounds: [8], counts: [1]}}\n"
    )
    return str(path)


def _huge_int_trace(tmp: Path) -> str:
    path = tmp / "t.jsonl"
    path.write_text(
        f'{{"inputTokens": {"9" * 5000}, "outputTokens": 1}}\n{{"inputTokens": 1, "outputTokens": 1}}\n'
    )
    return str(path)


def _long_request(tmp: Path) -> str:
    path = tmp / "long.yaml"
    path.write_text(
        "inputTokens: {bounds: [1000000000000], counts: [1]}\noutputTokens: {bounds: [8], counts: [1]}\n"
    )
    return str(path)


def _huge_manifest(tmp: Path) -> str:
    doc = yaml.safe_load(MD_EXAMPLE.read_text())
    path = tmp / "md.yaml"
    path.write_text(yaml.safe_dump(doc).replace("spec:\n", f"spec:\n  replicas: {'9' * 5000}\n", 1))
    return str(path)


@pytest.mark.parametrize(
    ("argv", "expected", "code"),
    [
        (["compile", "--workload", "/dev/zero"], "workload file /dev/zero: larger than 16 MiB", 2),
        (["experiment", "--build", "reference", "--workload", "/dev/zero"], "workload file /dev/zero: larger than 16 MiB", 2),
        (["compile", "--workload", "{huge_int_yaml}"], "a number with more than 18 digits is too large", 2),
        (["compile", "--workload", "{huge_int_trace}"], "line 1 holds a number with more than 18 digits", 2),
        (["compile", "--workload", "{long_request}"], "a request holds at most 1048576 tokens", 2),
        (["compile", "--api-key-file", "/dev/zero", "--agent", "claude"], "--api-key-file /dev/zero: larger than 0 MiB", 2),
        (["sandbox", "engine", "--spec", "/dev/zero"], "the CompileJob spec file /dev/zero: larger than 16 MiB", 2),
        (["sandbox", "agent", "--spec", "/dev/zero"], "the CompileJob spec file /dev/zero: larger than 16 MiB", 2),
        (["validate", "/dev/zero"], "/dev/zero: larger than 16 MiB", 1),
        (["validate", "{huge_manifest}"], "a number with more than 18 digits is too large", 1),
    ],
)  # fmt: skip
def test_a_file_is_read_bounded_and_its_numbers_checked(
    tmp_path: Path, argv: list[str], expected: str, code: int
) -> None:
    makers = {"huge_int_yaml": _huge_int_yaml, "huge_int_trace": _huge_int_trace,
              "long_request": _long_request, "huge_manifest": _huge_manifest}  # fmt: skip
    argv = [a.format(**{k: m(tmp_path) for k, m in makers.items()}) if "{" in a else a for a in argv]
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "polymorph.cli", *argv, *(["--store", str(tmp_path / "s")] if argv[0] == "compile" else [])],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    took = time.monotonic() - began
    out = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == code and len(out) == 1, (done.returncode, out)
    assert expected in out[0] and "Traceback" not in out[0] and len(out[0]) < 400, out[0]
    assert took < 30, f"{took:.0f} s to refuse"


# --- durations --------------------------------------------------------------------------------

DURATION_FLAGS = [
    (["compile"], "--deadline", "deadline"),
    (["compile"], "--experiment-timeout", "experiment_timeout"),
    (["experiment", "--build", "reference"], "--experiment-timeout", "experiment_timeout"),
    (["engine", "serve", "--model", "tiny"], "--shutdown-grace", "shutdown_grace"),
    (["engine", "serve", "--model", "tiny"], "--trace-flush-interval", "trace_flush_interval"),
    (["sandbox", "agent"], "--ready-timeout", "ready_timeout"),
]
OPERATOR_FLAGS = [("--drift-interval", "drift_interval_s"), ("--rollout-interval", "rollout_interval_s")]
GOOD = [
    ("500ms", 0.5),
    ("1s", 1.0),
    ("30s", 30.0),
    ("10m", 600.0),
    ("6h", 21600.0),
    ("1d", 86400.0),
    ("366d", 366 * 86400.0),
]
BAD = ["30", "0.5", "1.5s", "-5m", "0s", "soon", "400d", "1w", "10 m", "", "9" * 40 + "s"]
OUT_OF_RANGE = {"400d", "9" * 40 + "s"}
"""Durations of the right syntax but longer than 366d: the chart's schema checks the syntax only,
and the operator refuses these at start-up with the same sentence."""


def _flag_seconds(prefix: list[str], flag: str, dest: str, value: str) -> float:
    argv = [*prefix, f"{flag}={value}"]
    args = build_parser(argv[0]).parse_args(argv)
    return float(getattr(args, dest))


def _operator_seconds(flag: str, dest: str, value: str) -> float:
    parser = Parser()
    from polymorph.handlers.settings import configure

    configure(parser)
    args = parser.parse_args([*OPERATOR[1:], f"{flag}={value}"])
    return float(getattr(from_args(args, {}), dest))


def _kubectl_plugin(value: str) -> float:
    args = kubectl_plugin_parser().parse_args(["get", "md", "chat", f"--interval={value}"])
    return float(args.interval)


def _manifest_seconds(value: str) -> float:
    doc = yaml.safe_load(MD_EXAMPLE.read_text())
    doc["spec"]["recompile"] = {"window": value}
    from polymorph.contract.api import parse_duration

    return parse_duration(ModelDeployment.model_validate(doc).spec.recompile.window)


def _chart_accepts(value: str) -> bool:
    schema = json.loads((REPO / "charts" / "polymorph" / "values.schema.json").read_text())
    pattern = schema["properties"]["settings"]["properties"]["driftInterval"]
    try:
        jsonschema.validate(value, pattern)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.mark.parametrize(("text", "seconds"), GOOD)
def test_a_duration_means_the_same_everywhere(text: str, seconds: float) -> None:
    for prefix, flag, dest in DURATION_FLAGS:
        assert _flag_seconds(prefix, flag, dest, text) == seconds, flag
    for flag, dest in OPERATOR_FLAGS:
        assert _operator_seconds(flag, dest, text) == seconds, flag
    assert _kubectl_plugin(text) == seconds
    assert _manifest_seconds(text) == seconds
    assert _chart_accepts(text)


@pytest.mark.usefixtures("nothing_loads")
@pytest.mark.parametrize("text", BAD)
def test_a_bad_duration_gets_the_same_sentence_everywhere(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    reasons = set()
    for prefix, flag, _ in DURATION_FLAGS:
        extra = ["--spec", SPEC] if prefix[0] == "sandbox" else []
        line = error_line(capsys, [*prefix, *extra, f"{flag}={text}"])
        assert line.startswith(f"error: {flag}: "), line
        reasons.add(line.removeprefix(f"error: {flag}: ").removesuffix(" (or 0s)"))
    for flag, dest in OPERATOR_FLAGS:
        with pytest.raises(UsageError) as err:
            _operator_seconds(flag, dest, text)
        reasons.add(str(err.value).removeprefix(f"{flag}: "))
    with pytest.raises(SystemExit):
        _kubectl_plugin(text)
    said = capsys.readouterr().err
    assert said.startswith("kubectl polymorph: argument --interval: "), said
    reasons.add(said.removeprefix("kubectl polymorph: argument --interval: ").split(". See kubectl")[0])
    assert len(reasons) == 1, reasons
    with pytest.raises(ValueError):
        _manifest_seconds(text)
    assert _chart_accepts(text) == (text in OUT_OF_RANGE)


def test_every_duration_flag_refuses_zero_alike(capsys: pytest.CaptureFixture[str]) -> None:
    # --shutdown-grace took 0s where every other duration flag refused it (issue 32, class 7).
    line = error_line(capsys, ["engine", "serve", "--model", "tiny", "--shutdown-grace=0s"])
    assert line.startswith("error: --shutdown-grace: ") and "0s" in line, line


# --- help and defaults -------------------------------------------------------------------------

COMMANDS = [
    ["compile"],
    ["experiment"],
    ["engine", "serve"],
    ["sandbox", "engine"],
    ["sandbox", "agent"],
    ["operator"],
    ["crds"],
]


def _help(capsys: pytest.CaptureFixture[str], command: list[str]) -> str:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def _options(command: list[str]) -> list[Any]:
    parser = build_parser(command[0])
    for part in command:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[part]  # type: ignore[attr-defined]
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_flag_names_its_default(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    parser_options = _options(command)
    assert parser_options
    formatter = Parser().formatter_class("x")
    for action in parser_options:
        text = formatter._get_help_string(action)  # type: ignore[attr-defined]
        assert "default" in text or action.required or "required" in text, (
            command,
            action.option_strings,
            text,
        )
    assert "(default" in _help(capsys, command)


def test_compile_and_experiment_measure_alike() -> None:
    shared = {
        "--model",
        "--workload",
        "--device",
        "--dtype",
        "--repeats",
        "--threads",
    }
    compile_opts = {a.option_strings[0]: a for a in _options(["compile"])}
    experiment_opts = {a.option_strings[0]: a for a in _options(["experiment"])}
    for flag in shared:
        c, e = compile_opts[flag], experiment_opts[flag]
        assert (c.default, c.help, c.type is None) == (e.default, e.help, e.type is None), flag
    # One difference, with its reason in the help: a campaign on an accelerator screens many
    # short experiments, so a candidate still compiling after 30 s is "not ready yet" there;
    # on a CPU, compile's timeout is experiment's.
    c, e = compile_opts["--experiment-timeout"], experiment_opts["--experiment-timeout"]
    assert c.type is not None and e.type is not None and c.default is None
    assert f"(default: {e.default}; 30s with --device cuda)" in " ".join(c.help.split())


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--threads", "2", "--repeats", "7"],
        ["--model", "qwen2-tiny", "--dtype", "bfloat16", "--store", "/tmp/st"],
        ["--workload", "{workload}", "--device", "cpu", "--base-build", "sha256:" + "1" * 64],
    ],
)
def test_the_run_again_line_measures_as_the_campaign_did(tmp_path: Path, argv: list[str]) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "inputTokens: {bounds: [64, 256], counts: [3, 1]}\noutputTokens: {bounds: [32], counts: [1]}\n"
    )
    argv = [a.replace("{workload}", str(workload)) for a in argv]
    compiled = build_parser("compile").parse_args(["compile", *argv])
    line = _rerun(compiled, compiled.base_build)("sha256:" + "2" * 64)
    words = shlex.split(line)
    assert words[:2] == ["polymorph", "experiment"]
    rerun = build_parser("experiment").parse_args(words[1:])
    assert rerun.build == ["sha256:" + "2" * 64] and rerun.against == compiled.base_build
    for dest in ("model", "device", "dtype", "workload", "repeats", "threads", "store"):
        assert getattr(rerun, dest) == getattr(compiled, dest), dest
    a = measurement.campaign_workload(compiled.workload, compiled.device)
    b = measurement.campaign_workload(rerun.workload, rerun.device, seed=rerun.seed)
    assert a.workload == b.workload  # the same requests, fitted the same way
    assert measurement.worker_threads(compiled.threads, compiled.device) == measurement.worker_threads(
        rerun.threads, rerun.device
    )


def test_experiment_against_a_baseline_prints_the_pair(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "polymorph.cli", "experiment", "--build", "reference", "--against", "reference",
         "--repeats", "2", "--store", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[1:3]  # after the workload note
    assert "baseline" in header.split() and "speedup" in header.split()
    assert "pairs)" in row and "x [" in row, row


def test_every_help_shows_its_defaults_one_way(capsys: pytest.CaptureFixture[str]) -> None:
    """``(default: X)``, never ``(default X)`` nor ``(default off)`` beside it (issue 32, class 9).

    In process (``polymorph.cli.main``, as the console script calls it): each command's help is
    argparse's, so a subprocess per command would only add its imports."""
    import re

    from polymorph.cli import main

    for command in (
        ["compile"],
        ["experiment"],
        ["engine", "serve"],
        ["sandbox", "agent"],
        ["sandbox", "engine"],
        ["operator"],
    ):
        with pytest.raises(SystemExit) as done:
            main([*command, "--help"])
        captured = capsys.readouterr()
        text = " ".join(captured.out.split())
        assert done.value.code == 0 and "(default: " in text, (command, captured.err[-500:])
        assert not re.search(r"\(default [^:]", text), (command, re.findall(r"\(default [^)]*\)", text))
