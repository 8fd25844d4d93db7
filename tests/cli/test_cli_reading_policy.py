"""One reading policy for every input format and every command (issue 32, class 7).

- A key set twice in one object is refused in a JSON-lines trace as in YAML (a profile, a
  manifest), one sentence naming the file, the line and the key.
- A leading byte-order mark is dropped whatever the format (YAML, JSON, JSON lines, a manifest):
  the same file with and without one reads the same.
- No flag is taken by a prefix of its name (``allow_abbrev=False`` on every parser, the
  ``polymorph`` commands', their roles' and the kubectl plugin's): ``--max-exp`` is refused as
  unknown, one line.
- ``--store`` is checked as a store URI by the command that takes it, whether or not that command
  ends up opening the store.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from polymorph.cli import build_parser, main
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import BOM, read_text
from polymorph.contract.store import check_store_uri, open_store
from polymorph.contract.workload import read_workload
from polymorph.kubectl_plugin.cli import build_parser as kubectl_plugin_parser
from support.cli import error_line

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "crds" / "examples" / "modeldeployment-minimal.yaml"

TRACE = '{"inputTokens": 4, "outputTokens": 2, "arrivalS": 0}\n{"inputTokens": 8, "outputTokens": 3, "arrivalS": 1}\n'
PROFILE_YAML = (
    "inputTokens: {bounds: [16, 64], counts: [1, 1]}\n"
    "outputTokens: {bounds: [8, 32], counts: [1, 1]}\n"
    "concurrency: 2\n"
)
PROFILE_JSON = json.dumps(
    {
        "inputTokens": {"bounds": [16, 64], "counts": [1, 1]},
        "outputTokens": {"bounds": [8, 32], "counts": [1, 1]},
        "concurrency": 2,
    }
)


# --- duplicate keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "t.jsonl",
            '{"inputTokens": 4, "outputTokens": 2}\n{"inputTokens": 4, "inputTokens": 9, "outputTokens": 2}\n',
            "line 2: duplicate key 'inputTokens'",
        ),
        (
            "t.jsonl",
            '{"inputTokens": 4, "outputTokens": 2, "outputTokens": 2}\n',
            "line 1: duplicate key 'outputTokens'",
        ),
        (
            "t.json",
            '{"inputTokens": 4, "outputTokens": 2}\n{"inputTokens": 4, "outputTokens": 2, "arrivalS": 0, "arrivalS": 1}\n',
            "line 2: duplicate key 'arrivalS'",
        ),
        ("p.yaml", PROFILE_YAML + "concurrency: 3\n", "line 4, column 1: duplicate key 'concurrency'"),
        ("p.json", PROFILE_JSON[:-1] + ', "concurrency": 3}', "duplicate key 'concurrency'"),
    ],
)
def test_a_key_set_twice_is_refused_in_every_format(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as raised:
        read_workload(path)
    message = str(raised.value)
    assert str(path) in message and expected in message and "\n" not in message, message


def test_a_duplicate_key_in_a_trace_is_one_line_from_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"inputTokens": 4, "inputTokens": 400000, "outputTokens": 2}\n')
    line = error_line(capsys, ["compile", "--workload", str(path), "--store", str(tmp_path / "store")])
    assert "duplicate key 'inputTokens'" in line and str(path) in line, line


# --- byte-order marks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [("t.jsonl", TRACE), ("t.json", TRACE), ("p.yaml", PROFILE_YAML), ("p.json", PROFILE_JSON)],
)
def test_a_leading_bom_reads_the_same_in_every_format(tmp_path: Path, name: str, text: str) -> None:
    plain, marked = tmp_path / "plain" / name, tmp_path / "marked" / name
    plain.parent.mkdir()
    marked.parent.mkdir()
    plain.write_text(text)
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_workload(marked) == read_workload(plain)


def test_a_leading_bom_is_dropped_for_a_manifest_and_by_read_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marked = tmp_path / "md.yaml"
    marked.write_bytes(b"\xef\xbb\xbf" + MANIFEST.read_bytes())
    assert read_text(marked) == MANIFEST.read_text()
    assert main(["validate", str(marked)]) == 0, capsys.readouterr()
    capsys.readouterr()


def test_a_bom_inside_a_trace_is_refused_as_json_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE + BOM + TRACE.splitlines()[0] + "\n")
    with pytest.raises(UsageError) as raised:
        read_workload(path)
    assert "line 3 is not JSON" in str(raised.value), raised.value


# --- abbreviations -------------------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_parser_takes_an_abbreviated_flag() -> None:
    parsers = _parsers(build_parser()) + _parsers(kubectl_plugin_parser())
    for command in ("compile", "experiment", "validate", "operator", "engine", "sandbox"):
        parsers += _parsers(build_parser(command))
    parsers += _parsers(build_parser("sandbox", "agent")) + _parsers(build_parser("engine", "serve"))
    assert len(parsers) > 10
    abbreviating = [p.prog for p in parsers if p.allow_abbrev]
    assert not abbreviating, abbreviating


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["compile", "--max-exp", "1"], "--max-exp"),
        (["compile", "--dead", "1m"], "--dead"),
        (["experiment", "--build", "reference", "--rep", "3"], "--rep"),
        (["validate", "--ver", "x.yaml"], "--ver"),
        (
            ["operator", "--namespace", "a", "--prometheus-url", "http://p:9090", "--store", "/s", "--stand"],
            "--stand",
        ),
        (["engine", "serve", "--model", "tiny", "--max-b", "4"], "--max-b"),
    ],
)
def test_an_abbreviated_flag_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    line = error_line(capsys, argv)
    assert "unrecognized arguments" in line and flag in line, line


# --- store URIs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://", "names the bucket ''"),
        ("s3:///prefix", "names the bucket ''"),
        ("s3://Bad_Bucket/x", "names the bucket 'Bad_Bucket'"),
        ("gs://bucket/x", "unsupported scheme gs://"),
        ("file://relative", "must be file:///absolute/path"),
        ("   ", "the store URI is empty"),
    ],
)
def test_a_store_uri_is_checked_as_text_by_every_command(
    capsys: pytest.CaptureFixture[str], uri: str, expected: str
) -> None:
    with pytest.raises(UsageError) as raised:
        check_store_uri(uri)
    assert expected in str(raised.value)
    with pytest.raises(UsageError):
        open_store(uri)
    for command in (["compile"], ["experiment", "--build", "reference"]):
        line = error_line(capsys, [*command, "--store", uri])
        assert line.startswith("error: --store: ") and expected in line, (command, line)
