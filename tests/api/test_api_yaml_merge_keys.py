"""YAML 1.1 merge keys are followed as the API server's reader follows them (issue 32, class 6).

``kubectl apply`` turns YAML into JSON with go-yaml v2 before the API server sees it: ``<<: *anchor``
supplies the keys a mapping does not set itself, the mapping's own keys override them, and of a
list of anchors the earlier wins. ``polymorph validate`` (and every reader of
``polymorph.contract.yaml_input``) reads them the same way. What stays refused, one sentence with
its line: a key a mapping sets twice, a second ``<<`` in one mapping, a ``<<`` whose value is not
a mapping, and a key set *before* a ``<<`` that sets it too (go-yaml v2 lets the later merge
replace it where YAML 1.1 keeps it: the two readers disagree, so neither reading is taken).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polymorph.cli import main
from polymorph.contract.errors import UsageError
from polymorph.contract.yaml_input import load_yaml

REPO = Path(__file__).resolve().parents[2]
FULL = REPO / "crds" / "examples" / "modeldeployment-full.yaml"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{k: y, l: Y, m: n, o: N, p: yes, q: off}", {"k": True, "l": True, "m": False, "o": False, "p": True, "q": False}),
        ("{k: 1e3, l: 1.5e3, m: 0o17, o: 010, p: 0x1F, q: 1_000, r: .5, s: 08}", {"k": 1000.0, "l": 1500.0, "m": 15, "o": 8, "p": 31, "q": 1000, "r": 0.5, "s": 8.0}),
        ("{k: 2001-12-14, l: 1:20, m: 1.2.3, o: 12e}", {"k": "2001-12-14", "l": "1:20", "m": "1.2.3", "o": "12e"}),
        ("{y: 1, 2: b}", {"true": 1, "2": "b"}),
    ],
)  # fmt: skip
def test_plain_scalars_resolve_as_go_yaml_resolves_them(text: str, expected: dict[str, Any]) -> None:
    """kubectl turns YAML into JSON with go-yaml v2 (checked against the real server in
    tests/control_plane/test_yaml_like_the_api_server.py)."""
    assert load_yaml(text, "f.yaml") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the example: a flow mapping overriding one merged key
        (
            "s: &s {weight: 25, pause: 10m}\nl:\n- {<<: *s, weight: 50}\n",
            {"s": {"weight": 25, "pause": "10m"}, "l": [{"weight": 50, "pause": "10m"}]},
        ),
        # block style, the override after the merge
        ("b: &b\n  x: 1\n  w: 2\nd:\n  <<: *b\n  w: 3\n", {"b": {"x": 1, "w": 2}, "d": {"x": 1, "w": 3}}),
        # a merge and no override
        ("b: &b {x: 1}\nd: {<<: *b}\n", {"b": {"x": 1}, "d": {"x": 1}}),
        # a key set before the merge that the merge does not set
        ("b: &b {x: 1}\nd: {w: 2, <<: *b}\n", {"b": {"x": 1}, "d": {"w": 2, "x": 1}}),
        # a list of anchors: the earlier wins, the mapping's own key over both
        (
            "a: &a {x: 1, w: 1}\nb: &b {x: 2, z: 2}\nc: {<<: [*a, *b], z: 3}\n",
            {"a": {"x": 1, "w": 1}, "b": {"x": 2, "z": 2}, "c": {"x": 1, "w": 1, "z": 3}},
        ),
        # an inline mapping as the merge source
        ("c: {<<: {x: 1}, w: 2}\n", {"c": {"x": 1, "w": 2}}),
        # a merge of a mapping that itself merges
        (
            "a: &a {x: 1}\nb: &b {<<: *a, w: 2}\nc: {<<: *b, x: 3}\n",
            {"a": {"x": 1}, "b": {"x": 1, "w": 2}, "c": {"x": 3, "w": 2}},
        ),
        # refused: the mapping sets a key twice, beside a merge
        ("a: &a {x: 1}\nc: {<<: *a, w: 1, w: 2}\n", "line 2, column 19: duplicate key 'w'"),
        # refused: the merge source sets a key twice
        ("c: {<<: {x: 1, x: 2}}\n", "duplicate key 'x'"),
        # refused: two merge keys in one mapping
        ("a: &a {x: 1}\nb: &b {x: 2}\nc: {<<: *a, <<: *b}\n", "duplicate merge key (<<)"),
        # refused: a merge of a scalar or of a list holding a scalar
        ("a: &a 1\nc: {<<: *a}\n", "a merge key (<<) takes a mapping or a list of mappings"),
        ("a: &a {x: 1}\nc: {<<: [*a, 2]}\n", "a merge key (<<) takes a mapping or a list of mappings"),
        # refused: the readers disagree on a key set before the merge that sets it
        (
            "a: &a {x: 1}\nc: {x: 5, <<: *a}\n",
            "key 'x' is set before a merge key (<<) that sets it too; put << first",
        ),
        # unchanged: duplicates without any merge
        ("x: 1\nx: 2\n", "line 2, column 1: duplicate key 'x'"),
    ],
)
def test_merge_keys_read_as_the_api_server_reads_them(text: str, expected: dict[str, Any] | str) -> None:
    if isinstance(expected, dict):
        assert load_yaml(text, "f.yaml") == expected
        return
    with pytest.raises(UsageError) as raised:
        load_yaml(text, "f.yaml")
    message = str(raised.value)
    assert message.startswith("f.yaml: invalid YAML at line") and expected in message, message
    assert "\n" not in message


def test_validate_takes_a_manifest_whose_steps_merge_an_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = FULL.read_text()
    old = "      - {weight: 25, pause: 10m}\n      - {weight: 50, pause: 10m}\n"
    assert old in text
    path = tmp_path / "md.yaml"
    path.write_text(
        text.replace(old, "      - &step {weight: 25, pause: 10m}\n      - {<<: *step, weight: 50}\n")
    )
    code = main(["validate", str(path)])
    out = capsys.readouterr()
    assert code == 0, out
    path.write_text(
        text.replace(old, "      - &step {weight: 25, pause: 10m}\n      - {<<: *step, weight: 150}\n")
    )
    code = main(["validate", str(path)])
    out = capsys.readouterr()
    assert code == 1 and "spec.rollout.steps[1].weight: must be <= 100 (got 150)" in out.out + out.err, out
