"""``polymorph validate`` reads YAML as ``kubectl apply`` and the API server do (issue 32, class 6),
checked against the real ones.

Each row is a YAML ``spec`` applied with ``kubectl apply --dry-run=server -o json`` to a custom
resource that keeps any fields (``x-kubernetes-preserve-unknown-fields``), and read by
``polymorph.contract.yaml_input.load_yaml``: where the server takes the document, both give the
same JSON; where it does not, so does ``load_yaml``. Merge keys (``<<``) with overrides, the
earlier of a list of anchors winning; plain scalars as go-yaml v2 resolves them (``y`` and ``n``
are booleans, ``1e3`` a number, ``2001-12-14`` and ``1:20`` strings); a whole-number or boolean
key becomes a string key. The rows where ``load_yaml`` refuses what kubectl takes are marked: a
key set twice (kubectl keeps the last silently), and a key set before a ``<<`` that sets it too
(YAML 1.1 keeps the key; kubectl lets the merge replace it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polymorph.contract.errors import UsageError
from polymorph.contract.yaml_input import load_yaml
from support.waiting import wait_for

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
"""The ``kubectl`` fixture of ``tests/control_plane/conftest.py``."""

GROUP = "yaml-probe.polymorph.dev"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"probes.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"kind": "Probe", "plural": "probes", "singular": "probe"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                        },
                    }
                },
            }
        ],
    },
}

ANCHORS = "  a: &a {x: '1', w: '1'}\n  b: &b {x: '2', z: '2'}\n"

ROWS = [
    # merge keys
    ("override", "  c: {<<: *a, x: '5'}\n"),
    ("block", "  c:\n    <<: *a\n    w: '3'\n"),
    ("list", "  c: {<<: [*a, *b]}\n"),
    ("list-own", "  c: {<<: [*a, *b], z: '3'}\n"),
    ("nested", "  d: &d {<<: *a, v: '2'}\n  c: {<<: *d, x: '3'}\n"),
    ("unrelated-before", "  c: {v: '5', <<: *a}\n"),
    # plain scalars
    ("y", "  c: {k: y, l: Y, m: n, o: N}\n"),
    ("yes-on", "  c: {k: yes, l: on, m: off, o: No}\n"),
    ("numbers", "  c: {k: 1e3, l: 1.5e3, m: 0o17, o: 010, p: 0x1F, q: 1_000, r: .5, s: 08}\n"),
    ("strings", "  c: {k: 2001-12-14, l: '1:20', m: 1:20, o: 1.2.3, p: 12e}\n"),
    ("keys", "  c: {y: 1, 2: b, n: c}\n"),
]

REFUSED = [
    ("duplicate", "  c: {<<: *a, v: '1', v: '2'}\n", "duplicate key 'v'"),
    ("before-merge", "  c: {x: '5', <<: *a}\n", "key 'x' is set before a merge key (<<)"),
    ("two-merges", "  c: {<<: *a, <<: *b}\n", "duplicate merge key (<<)"),
]


def _doc(name: str, spec: str) -> str:
    return f"apiVersion: {GROUP}/v1\nkind: Probe\nmetadata: {{name: probe-{name}, namespace: default}}\nspec:\n{ANCHORS}{spec}"


@pytest.fixture(scope="module")
def probes_served(kubectl: Kubectl) -> Kubectl:
    kubectl("apply", "-f", "-", stdin=json.dumps(CRD))
    wait_for(
        "the Probe CRD served",
        lambda: kubectl("get", f"probes.{GROUP}", "-n", "default", check=False).returncode == 0,
        timeout=30,
    )
    return kubectl


def _server(kubectl: Kubectl, tmp: Path, text: str) -> Any:
    path = tmp / "doc.yaml"
    path.write_text(text)
    done = kubectl("apply", "--dry-run=server", "-o", "json", "-f", str(path))
    return json.loads(done.stdout)["spec"]


@pytest.mark.parametrize(("name", "spec"), ROWS, ids=[r[0] for r in ROWS])
def test_load_yaml_reads_a_document_as_the_api_server_does(
    probes_served: Kubectl, tmp_path: Path, name: str, spec: str
) -> None:
    text = _doc(name, spec)
    ours = json.loads(json.dumps(load_yaml(text, "doc.yaml")["spec"]))
    assert ours == _server(probes_served, tmp_path, text)


@pytest.mark.parametrize(("name", "spec", "expected"), REFUSED, ids=[r[0] for r in REFUSED])
def test_load_yaml_refuses_where_kubectl_guesses(
    probes_served: Kubectl, tmp_path: Path, name: str, spec: str, expected: str
) -> None:
    text = _doc(name, spec)
    with pytest.raises(UsageError) as raised:
        load_yaml(text, "doc.yaml")
    assert expected in str(raised.value)
    _server(probes_served, tmp_path, text)  # kubectl takes it, keeping one of the readings
