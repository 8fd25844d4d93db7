"""``kubectl polymorph`` and a malformed kubeconfig (issue 32, class 2): one sentence naming the file
and what is wrong, exit 2, never a traceback and never a request, whichever way the file is named
(``--kubeconfig`` or ``$KUBECONFIG``); a file that is named but missing is refused, never replaced
by another cluster's credentials (the in-cluster service account is only for a missing
``~/.kube/config``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from polymorph.clients.kube import KubeClient, KubeError
from polymorph.kubectl_plugin.cli import main


def good() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://c.example:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "current-context": "ctx",
    }


def changed(change: Callable[[dict[str, Any]], object]) -> str:
    doc = good()
    change(doc)
    return yaml.safe_dump(doc)


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)

# fmt: off
# (id, the file's text or bytes, words of the sentence after "kubeconfig <path>")
FILES: list[tuple[str, str | bytes, str]] = [
    ("not-yaml", "not: [valid", ": invalid YAML at line 2, column 1: while parsing a flow sequence"),
    ("tab-indented", "clusters:\n\t- name: c\n", ": invalid YAML at line 2"),
    ("not-utf8", b"\xff\xfe\x00k\x00", ": not a UTF-8 text file"),
    ("empty", "", " is empty; it needs clusters, users, contexts and a current-context."),
    ("comment-only", "# nothing\n", " is empty"),
    ("a-list", "- a\n- b\n", " is not a kubeconfig: it holds a list"),
    ("a-string", "hello\n", " is not a kubeconfig: it holds a str"),
    ("two-documents", "a: 1\n---\nb: 2\n", ": holds 2 YAML documents; expected one"),
    ("duplicate-key", "current-context: a\ncurrent-context: b\n", "duplicate"),
    ("alias-bomb", LAUGHS, "aliases expand to more than"),
    ("contexts-a-number", changed(lambda d: d.update(contexts=5)), ": contexts: Input should be a valid list."),
    ("context-a-string", changed(lambda d: d.update(contexts=["ctx"])), ": contexts[0]: Input should be a valid dictionary"),
    ("context-no-name", changed(lambda d: d["contexts"][0].pop("name")), ": contexts[0].name: Field required."),
    ("context-no-body", changed(lambda d: d["contexts"][0].pop("context")), ": contexts[0].context: Field required."),
    ("namespace-a-number", changed(lambda d: d["contexts"][0]["context"].update(namespace=7)), ": contexts[0].context.namespace: Input should be a valid string."),
    ("cluster-a-list", changed(lambda d: d["clusters"][0].update(cluster=[1])), ": clusters[0].cluster: Input should be a valid dictionary"),
    ("server-a-number", changed(lambda d: d["clusters"][0]["cluster"].update(server=443)), ": clusters[0].cluster.server: Input should be a valid string."),
    ("token-a-list", changed(lambda d: d["users"][0]["user"].update(token=["t"])), ": users[0].user.token: Input should be a valid string."),
    ("current-context-a-map", changed(lambda d: d.update({"current-context": {"a": 1}})), ": current-context: Input should be a valid string."),
    ("no-current-context", changed(lambda d: d.pop("current-context")), " has no current-context; pass --context (one of 'ctx')."),
    ("no-contexts", changed(lambda d: d.update({"contexts": None, "current-context": ""})), " has no current-context; pass --context (it has no contexts)."),
    ("current-context-missing", changed(lambda d: d.update({"current-context": "gone"})), ": current-context 'gone' is not one of its contexts ('ctx')."),
    ("unknown-cluster", changed(lambda d: d["contexts"][0]["context"].update(cluster="gone")), ": context 'ctx' names cluster 'gone', which it does not define."),
    ("unknown-user", changed(lambda d: d["contexts"][0]["context"].update(user="gone")), ": context 'ctx' names user 'gone', which it does not define."),
    ("no-server", changed(lambda d: d["clusters"][0]["cluster"].pop("server")), ": cluster 'c' has no server."),
    ("hostile-namespace", changed(lambda d: d["contexts"][0]["context"].update(namespace="../../api/v1/namespaces/x/configmaps/victim")), " is not a namespace"),
    ("bad-ca-data", changed(lambda d: d["clusters"][0]["cluster"].update({"certificate-authority-data": "%%%not base64"})), ": context 'ctx' cannot be used:"),
    ("missing-ca-file", changed(lambda d: d["clusters"][0]["cluster"].update({"certificate-authority": "no-such-ca.crt"})), ": context 'ctx' cannot be used: File does not exist:"),
]
# fmt: on


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []

    def call(self: KubeClient, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        made.append(f"{method} {path}")
        if path.split("/")[-2] in ("modeldeployments", "compilejobs"):
            raise KubeError(404, "not found")
        return {"items": []}

    monkeypatch.setattr(KubeClient, "_call", call)
    monkeypatch.delenv("POLYMORPH_STORE", raising=False)
    return made


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("kubectl polymorph: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize(("text", "words"), [(t, w) for _, t, w in FILES], ids=[i for i, _, _ in FILES])
def test_a_malformed_kubeconfig_is_one_sentence_naming_the_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    requests: list[str],
    text: str | bytes,
    words: str,
    how: str,
) -> None:
    path = tmp_path / "config"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(path) if how == "env" else str(tmp_path / "other-not-used"))
    argv = ["get", "md", "chat"] + (["--kubeconfig", str(path)] if how == "flag" else [])
    err = refused(capsys, argv)
    assert f"kubeconfig {path}" in err and words in err, err
    assert requests == []


# fmt: off
SPECIAL: list[tuple[str, Callable[[Path], str], str]] = [
    ("dev-zero", lambda _: "/dev/zero", "kubeconfig /dev/zero: larger than 4 MiB"),
    ("a-directory", lambda d: str(d), "is a directory; give a file"),
    ("missing", lambda d: str(d / "nope"), "/nope: file not found"),
    ("huge", lambda d: (d / "big").write_text("a: " + "x" * (5 << 20)) and str(d / "big"), "larger than 4 MiB"),
    ("unreadable-symlink-loop", lambda d: os.symlink(d / "loop", d / "loop") or str(d / "loop"), "cannot be read"),
]
# fmt: on


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize(("make", "words"), [(m, w) for _, m, w in SPECIAL], ids=[i for i, _, _ in SPECIAL])
def test_a_file_that_cannot_be_read_is_one_sentence(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    requests: list[str],
    make: Callable[[Path], str],
    words: str,
    how: str,
) -> None:
    path = make(tmp_path)
    monkeypatch.setenv("KUBECONFIG", path if how == "env" else "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    argv = ["list"] + (["--kubeconfig", path] if how == "flag" else [])
    err = refused(capsys, argv)
    assert f"kubeconfig {path}" in err and words in err, err
    assert requests == []


def test_a_named_missing_kubeconfig_never_falls_back_to_the_pod_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], requests: list[str]
) -> None:
    """In a pod with a service account, a kubeconfig that was named but is missing is refused; the
    pod's own account is used only when nothing was named and ~/.kube/config is missing."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    (sa / "ca.crt").write_text("a CA")
    monkeypatch.setattr("kubernetes.config.incluster_config.SERVICE_TOKEN_FILENAME", str(sa / "token"))
    monkeypatch.setattr("kubernetes.config.incluster_config.SERVICE_CERT_FILENAME", str(sa / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "named"))
    assert "file not found" in refused(capsys, ["get", "md", "chat"])
    monkeypatch.delenv("KUBECONFIG")
    assert "file not found" in refused(capsys, ["--kubeconfig", str(tmp_path / "named"), "get", "md", "chat"])
    assert "there is no kubeconfig" in refused(capsys, ["--context", "prod", "get", "md", "chat"])
    assert requests == []
    assert main(["get", "md", "chat"]) == 2  # in the pod: its account, the default namespace, then not found
    assert requests == ["GET /apis/polymorph.dev/v1alpha1/namespaces/default/modeldeployments/chat"]


def test_relative_files_in_a_kubeconfig_are_read_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As kubectl does: a relative certificate or key file is found beside the kubeconfig, not in
    the working directory."""
    folder = tmp_path / "kube"
    folder.mkdir()
    for name in ("ca.crt", "client.crt", "client.key"):
        (folder / name).write_text(name)
    doc = good()
    doc["clusters"][0]["cluster"]["certificate-authority"] = "ca.crt"
    doc["users"][0]["user"] = {"client-certificate": "client.crt", "client-key": "client.key"}
    (folder / "config").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    seen: list[tuple[str, str, str]] = []

    def call(self: KubeClient, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        c = self._api.configuration
        seen.append((c.ssl_ca_cert, c.cert_file, c.key_file))
        return {"items": []}

    monkeypatch.setattr(KubeClient, "_call", call)
    assert main(["--kubeconfig", str(folder / "config"), "list"]) == 0, capsys.readouterr().err
    assert set(seen) == {(str(folder / "ca.crt"), str(folder / "client.crt"), str(folder / "client.key"))}
