"""``kubectl polymorph``'s input (issue 32, classes 1 and 9): which cluster, namespace and object a
command acts on, and the one argument shape of every command.

- Global flags (``-n``, ``--kubeconfig``, ``--context``, ``-o``, ``--request-timeout``) are read
  wherever they stand, as kubectl reads them: before the command, after it, between its words; a
  subcommand's default never overwrites one given before it; a later one wins.
- Every name, type, namespace and context is checked before any request: a bad one is one
  sentence naming the argument or flag and what is allowed, exit 2, and no request at all.
- Every command names its object the same way: ``[TYPE] NAME`` or ``TYPE/NAME`` (the old
  ``approve NAME`` and ``get md NAME`` both still work).
- Help shows every default one way, ``(default: X)``.
- ``Kind.path``: every request path is built segment by segment, each checked and quoted.

The requests are recorded by replacing ``KubeClient._call`` (the one place a request is made): the
real cluster, its audit log and hostile input against it are in
tests/control_plane/test_kubectl_plugin_security.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from polymorph.clients.kube import COMPILEJOBS, CONFIGMAPS, DEPLOYMENTS, MODELDEPLOYMENTS, Kind, KubeClient
from polymorph.contract import timeouts
from polymorph.kubectl_plugin.cli import build_parser, main

CANDIDATE = "sha256:" + "a" * 64
GROUP = "/apis/polymorph.dev/v1alpha1"


def kubeconfig(path: Path) -> Path:
    """Two contexts on two clusters: the current one (``cur``, namespace ``decoy``) and ``prod``."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "cur", "cluster": {"server": "https://cur.example:6443"}},
                    {"name": "prod", "cluster": {"server": "https://prod.example:6443"}},
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "cur", "context": {"cluster": "cur", "user": "u", "namespace": "decoy"}},
                    {"name": "prod", "context": {"cluster": "prod", "user": "u", "namespace": "prodns"}},
                ],
                "current-context": "cur",
            }
        )
    )
    return path


Request = tuple[str, str, str, float]  # (host, method, path, timeout)


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Request]:
    """Every request the plugin makes, answered from canned objects; $KUBECONFIG is ``kubeconfig``."""
    made: list[Request] = []

    def call(self: KubeClient, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        made.append((self.host, method, path, self._timeout))
        parts = path.split("/")
        if method == "GET" and parts[-2] in ("modeldeployments", "compilejobs"):
            ns, name = parts[-3], parts[-1]
            kind = "ModelDeployment" if parts[-2] == "modeldeployments" else "CompileJob"
            return {
                "apiVersion": "polymorph.dev/v1alpha1", "kind": kind,
                "metadata": {"name": name, "namespace": ns, "uid": "u-1", "generation": 1},
                "spec": {}, "status": {"candidateBuild": {"id": CANDIDATE}},
            }  # fmt: skip
        if method == "GET":
            return {"items": []}
        return {}

    monkeypatch.setattr(KubeClient, "_call", call)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config")))
    monkeypatch.delenv("POLYMORPH_STORE", raising=False)
    return made


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


CUR, PROD = "https://cur.example:6443", "https://prod.example:6443"

# (argv, the cluster, the first request's path): global flags before, after and between the words.
# fmt: off
PLACEMENT: list[tuple[tuple[str, ...], str, str]] = [
    (("--context", "prod", "-n", "other", "approve", "chat", "--dry-run"), PROD, f"{GROUP}/namespaces/other/modeldeployments/chat"),
    (("approve", "chat", "--dry-run", "--context", "prod", "-n", "other"), PROD, f"{GROUP}/namespaces/other/modeldeployments/chat"),
    (("-n", "other", "approve", "--context", "prod", "chat", "--dry-run"), PROD, f"{GROUP}/namespaces/other/modeldeployments/chat"),
    (("--context=prod", "abort", "chat", "--dry-run", "--force"), PROD, f"{GROUP}/namespaces/prodns/modeldeployments/chat"),
    (("--context", "prod", "get", "md", "chat"), PROD, f"{GROUP}/namespaces/prodns/modeldeployments/chat"),
    (("-nother", "get", "md", "chat"), CUR, f"{GROUP}/namespaces/other/modeldeployments/chat"),
    (("--namespace=other", "get", "cj", "chat-1"), CUR, f"{GROUP}/namespaces/other/compilejobs/chat-1"),
    (("get", "md", "chat"), CUR, f"{GROUP}/namespaces/decoy/modeldeployments/chat"),
    (("-n", "a", "get", "md", "chat", "-n", "b"), CUR, f"{GROUP}/namespaces/b/modeldeployments/chat"),  # the later wins
    (("--context", "prod", "list", "-A"), PROD, f"{GROUP}/compilejobs"),
    (("-n", "other", "list", "cj"), CUR, f"{GROUP}/namespaces/other/compilejobs"),
    (("--context", "prod", "pin", "md/chat", "--build", "reference", "--dry-run"), PROD, f"{GROUP}/namespaces/prodns/modeldeployments/chat"),
    (("--context", "prod", "-n", "other", "retry", "md", "chat", "--dry-run"), PROD, f"{GROUP}/namespaces/other/modeldeployments/chat"),
]
# fmt: on


@pytest.mark.parametrize(("argv", "host", "path"), PLACEMENT, ids=[" ".join(a) for a, _, _ in PLACEMENT])
def test_global_flags_are_read_wherever_they_stand(
    requests: list[Request], capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], host: str, path: str
) -> None:
    rc, out, err = run(capsys, *argv)
    assert requests, (rc, out, err)
    assert requests[0][:3] == (host, "GET", path), requests
    assert {r[0] for r in requests} == {host}  # every request to the one cluster named


# (argv, the flag's value as the command sees it) for the flags whose default a subcommand had.
KEPT: list[tuple[tuple[str, ...], str, object]] = [
    (("-o", "json", "get", "md", "x"), "output", "json"),
    (("get", "md", "x", "-o", "json"), "output", "json"),
    (("-o", "text", "approve", "x"), "output", "text"),
    (("--request-timeout", "5s", "get", "md", "x"), "request_timeout", 5.0),
    (("get", "md", "x", "--request-timeout", "5s"), "request_timeout", 5.0),
    (("get", "md", "x"), "request_timeout", 30.0),
    (("--kubeconfig", "/k", "list"), "kubeconfig", "/k"),
    (("--context", "prod", "unpin", "x"), "context", "prod"),
    (("-n", "other", "retry", "x"), "namespace", "other"),
    (("retry", "x"), "namespace", None),
]


@pytest.mark.parametrize(("argv", "dest", "value"), KEPT, ids=[" ".join(a) for a, _, _ in KEPT])
def test_a_subcommand_default_never_overwrites_a_global_flag(argv: tuple[str, ...], dest: str, value: object) -> None:  # fmt: skip
    assert getattr(build_parser().parse_args(list(argv)), dest) == value


@pytest.mark.parametrize("argv", [("-o", "json", "get", "md", "x"), ("get", "md/x", "-o", "json"), ("-o", "json", "list")])  # fmt: skip
def test_json_output_is_json_wherever_the_flag_stands(
    requests: list[Request], capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    json.loads(out)


def test_the_request_timeout_reaches_the_client(requests: list[Request], capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run(capsys, "--request-timeout", "7s", "get", "md", "x")
    assert requests[0][3] == (timeouts.KUBE.connect_s, 7.0)  # the read timeout; connect from the table


# (argv, words of the one sentence): refused before any request.
LONG = "a" * 254
# fmt: off
REFUSED: list[tuple[tuple[str, ...], str]] = [
    (("pin", "../../../../../../api/v1/namespaces/inference/configmaps/victim", "-n", "inference", "--build", "reference"), "unknown TYPE '..' before the '/'"),
    (("get", "md", "../../../../namespaces/inference"), "ModelDeployment NAME '../../../../namespaces/inference' is not an object name"),
    (("get", "md", ".."), "ModelDeployment NAME '..' is not an object name"),
    (("get", "md", "."), "ModelDeployment NAME '.' is not an object name"),
    (("approve", "md", "a/b"), "ModelDeployment NAME 'a/b' is not an object name"),
    (("approve", "md/a/b"), "ModelDeployment NAME 'a/b' is not an object name"),
    (("get", "cj", "chat%2Fx"), "CompileJob NAME 'chat%2Fx' is not an object name"),
    (("get", "md", "chat%2e%2e"), "is not an object name"),
    (("get", "md", "Chat"), "ModelDeployment NAME 'Chat' is not an object name"),
    (("abort", "chat-"), "ModelDeployment NAME 'chat-' is not an object name"),
    (("unpin", "-chat"), "the following arguments are required"),  # argparse: a flag, not a name
    (("unpin", "--", "-chat"), "ModelDeployment NAME '-chat' is not an object name"),
    (("get", "md", LONG), "is not an object name; a Kubernetes object name is a DNS-1123 subdomain: at most 253"),
    (("get", "md", ""), "ModelDeployment NAME '' is not an object name"),
    (("get", "md", "chat\n"), "ModelDeployment NAME 'chat\\n' is not an object name"),
    (("get", "md", "chat?x=1"), "is not an object name"),
    (("get", "md", "chat#x"), "is not an object name"),
    (("get", "md", "ｃhat"), "is not an object name"),
    (("get", "pods", "chat"), "get: unknown TYPE 'pods'; use md (ModelDeployment) or cj (CompileJob)."),
    (("get", "configmaps/victim"), "unknown TYPE 'configmaps' before the '/'"),
    (("approve", "cj", "chat-1"), "approve: unknown TYPE 'cj'; use md (ModelDeployment)."),
    (("get", "md"), "get 'md': that is a TYPE; name the object too"),
    (("retry", "cj"), "retry 'cj': that is a TYPE; name the object too"),
    (("get", "md", "a", "b"), "get takes one object (get [TYPE] NAME or get TYPE/NAME); got 3 words."),
    (("list", "pods"), "list: unknown TYPE 'pods'"),
    (("-n", "../kube-system", "get", "md", "chat"), "-n/--namespace '../kube-system' is not a namespace"),
    (("-n", "kube-system/configmaps", "get", "md", "chat"), "-n/--namespace 'kube-system/configmaps' is not a namespace"),
    (("-n", "Other", "get", "md", "chat"), "-n/--namespace 'Other' is not a namespace; a namespace is a DNS-1123 label"),
    (("-n", "a.b", "get", "md", "chat"), "-n/--namespace 'a.b' is not a namespace"),
    (("-n", "a" * 64, "get", "md", "chat"), "is not a namespace; a namespace is a DNS-1123 label: at most 63"),
    (("get", "md", "chat", "--namespace="), "-n/--namespace '' is not a namespace"),
    (("-n", "%2e%2e", "get", "md", "chat"), "-n/--namespace '%2e%2e' is not a namespace"),
    (("--context", "nosuch", "get", "md", "chat"), "--context 'nosuch' is not a context of kubeconfig"),
    (("--context", "../prod", "approve", "chat"), "--context '../prod' is not a context of kubeconfig"),
    (("--context", "", "approve", "chat"), "--context '' is not a context of kubeconfig"),
    (("pin", "chat", "--build", "latest"), "--build: 'latest' is not a build id"),
    (("approve", "chat", "--build", "../x"), "--build: '../x' is not a build id"),
    (("-o", "yaml", "get", "md", "chat"), "argument -o/--output: invalid choice: 'yaml'"),
    (("get", "md", "chat", "--request-timeout", "soon"), "--request-timeout"),
    (("--kubeconfig", "", "get", "md", "chat"), "--kubeconfig is empty"),
]
# fmt: on


@pytest.mark.parametrize(("argv", "words"), REFUSED, ids=[" ".join(a)[:60] for a, _ in REFUSED])
def test_bad_input_is_one_sentence_and_no_request(
    requests: list[Request], capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], words: str
) -> None:
    try:
        rc, out, err = run(capsys, *argv)
    except SystemExit as exc:  # argparse's own refusals
        rc, (out, err) = int(exc.code or 0), capsys.readouterr()
    assert rc == 2 and words in err, (rc, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert requests == [] and out == ""
    assert err.startswith("kubectl polymorph: "), err


def test_a_hostile_namespace_in_the_context_is_refused(
    requests: list[Request], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = kubeconfig(tmp_path / "hostile")
    doc = yaml.safe_load(path.read_text())
    doc["contexts"][0]["context"]["namespace"] = "../../api/v1/namespaces/kube-system"
    path.write_text(yaml.safe_dump(doc))
    rc, _, err = run(capsys, "--kubeconfig", str(path), "get", "md", "chat")
    assert rc == 2 and "the namespace of context 'cur' in kubeconfig" in err and "is not a namespace" in err
    assert requests == []
    rc, _, err = run(capsys, "--kubeconfig", str(path), "-n", "ok", "get", "md", "chat")  # -n wins
    assert rc == 0 and requests[0][2] == f"{GROUP}/namespaces/ok/modeldeployments/chat", err


# (argv, (type, name)): every command takes [TYPE] NAME or TYPE/NAME; the type defaults to md.
SHAPES: list[tuple[tuple[str, ...], tuple[str, str]]] = [
    (("get", "md", "chat"), ("md", "chat")),
    (("get", "md/chat"), ("md", "chat")),
    (("get", "chat"), ("md", "chat")),
    (("get", "modeldeployment", "chat"), ("md", "chat")),
    (("get", "ModelDeployments/chat"), ("md", "chat")),
    (("get", "cj", "chat-1"), ("cj", "chat-1")),
    (("get", "compilejob/chat-1"), ("cj", "chat-1")),
    (("get", "md", "md"), ("md", "md")),  # an object named like a type, with its type
    (("approve", "chat"), ("md", "chat")),
    (("approve", "md", "chat"), ("md", "chat")),
    (("approve", "md/chat"), ("md", "chat")),
    (("abort", "md", "chat.v2"), ("md", "chat.v2")),
    (("retry", "md/chat"), ("md", "chat")),
    (("pin", "chat"), ("md", "chat")),
    (("unpin", "modeldeployment/chat"), ("md", "chat")),
    (("get", "md", "a" * 253), ("md", "a" * 253)),
]


@pytest.mark.parametrize(("argv", "target"), SHAPES, ids=[" ".join(a)[:60] for a, _ in SHAPES])
def test_every_command_takes_the_same_object_shape(
    requests: list[Request],
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    target: tuple[str, str],
) -> None:
    _, _, err = run(capsys, *argv, "--dry-run") if argv[0] != "get" else run(capsys, *argv)
    kind, name = target
    plural = "modeldeployments" if kind == "md" else "compilejobs"
    assert requests, err
    assert requests[0][1:3] == ("GET", f"{GROUP}/namespaces/decoy/{plural}/{name}"), (requests, err)


COMMANDS = ["get", "list", "approve", "abort", "retry", "pin", "unpin"]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    return " ".join(capsys.readouterr().out.split())  # one line: argparse wraps at the terminal's width


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_shows_every_default_one_way(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    text = _help([command, "--help"] if command else ["--help"], capsys)
    assert "SUPPRESS" not in text
    said = re.findall(r"\(default[^)]*\)", text)
    assert said, text
    assert all(re.fullmatch(r"\(default: [^)]+\)", d) for d in said), said
    assert "(default)" not in text and not re.search(r"default \w", text.replace("else default", "")), text
    for flag in ("--namespace", "--kubeconfig", "--context", "--output", "--request-timeout"):
        assert flag in text, (command, flag)  # every global flag on every command
    for flag in ("--dry-run", "--timeout", "--watch", "--all-namespaces", "--force", "--interval"):
        if flag in text:
            assert re.search(re.escape(flag) + r"[^(]*\(default: ", text), (command, flag)
    if command not in (None, "list"):
        assert "NAME" in text and "/NAME" in text  # the one object shape


# --------------------------------------------------------------------------------------------
# The request path: each segment checked and quoted on its own.

PATHS: list[tuple[Callable[[], str], str]] = [
    (
        lambda: MODELDEPLOYMENTS.path("inference", "chat"),
        f"{GROUP}/namespaces/inference/modeldeployments/chat",
    ),
    (lambda: COMPILEJOBS.path(None), f"{GROUP}/compilejobs"),
    (lambda: CONFIGMAPS.path("ns", "a.b"), "/api/v1/namespaces/ns/configmaps/a.b"),
    (lambda: DEPLOYMENTS.path("ns", "d", "status"), "/apis/apps/v1/namespaces/ns/deployments/d/status"),
    (lambda: MODELDEPLOYMENTS.path("ns", "a%2Fb"), f"{GROUP}/namespaces/ns/modeldeployments/a%252Fb"),
    (lambda: MODELDEPLOYMENTS.path("ns", "a?b#c"), f"{GROUP}/namespaces/ns/modeldeployments/a%3Fb%23c"),
    (lambda: MODELDEPLOYMENTS.path("ns", "a b"), f"{GROUP}/namespaces/ns/modeldeployments/a%20b"),
]


@pytest.mark.parametrize(("build", "path"), PATHS, ids=[p for _, p in PATHS])
def test_a_request_path_is_built_segment_by_segment(build: Callable[[], str], path: str) -> None:
    assert build() == path


UNSAFE: list[tuple[Callable[[], str], str]] = [
    (lambda: MODELDEPLOYMENTS.path("ns", "../../../../api/v1/namespaces/x/configmaps/victim"), "name"),
    (lambda: MODELDEPLOYMENTS.path("ns", ".."), "name"),
    (lambda: MODELDEPLOYMENTS.path("ns", "."), "name"),
    (lambda: MODELDEPLOYMENTS.path("ns", "a/b"), "name"),
    (lambda: MODELDEPLOYMENTS.path("../kube-system", "chat"), "namespace"),
    (lambda: MODELDEPLOYMENTS.path("..", "chat"), "namespace"),
    (lambda: MODELDEPLOYMENTS.path("ns", "chat", "../status"), "subresource"),
    (lambda: Kind("polymorph.dev/../v1", "x").path("ns"), "group"),
    (lambda: Kind("v1", "../secrets").path("ns"), "resource"),
]


@pytest.mark.parametrize(("build", "what"), UNSAFE, ids=[f"{w}-{i}" for i, (_, w) in enumerate(UNSAFE)])
def test_a_segment_that_could_name_another_path_is_refused(build: Callable[[], str], what: str) -> None:
    with pytest.raises(ValueError, match=f"^{what} .* cannot be a segment of an API request path"):
        build()
