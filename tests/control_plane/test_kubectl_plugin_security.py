"""``kubectl polymorph`` against hostile names, namespaces and contexts, on the real control plane
(issue 32): the API server's audit log shows that no request reached anything but the object
named, in the namespace and on the context named, and that refused input made no request at all.

The kubeconfig has two contexts, each its own identity (an admin, ``system:masters``: RBAC would
refuse nothing, so only the plugin stands between a typed value and another object): ``decoy``,
the current one, whose namespace holds a ModelDeployment of the same name, and ``target``. Each
case runs with new identities, so ``audit(user)`` holds that case's requests alone; a ``/version``
request of each identity afterwards marks where the case's requests end in the log. The victim,
a ConfigMap beside the deployment, and both namespaces are unchanged at the end.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from polymorph.clients.kube import KubeClient, load_configuration
from polymorph.kubectl_plugin.cli import main
from support.control_plane import ControlPlane

GROUP = "/apis/polymorph.dev/v1alpha1"
CANDIDATE = "sha256:" + "c" * 64


def deployment(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": namespace},
        "spec": {"model": {"uri": "tiny"}, "hardware": {"accelerator": "cpu"}, "build": {"policy": "Manual"}},
    }


@pytest.fixture
def world(control_plane: ControlPlane, crds: None, namespace: str, kubectl: Callable[..., Any]) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The target namespace with ``chat`` (a candidate to approve) and the victim ConfigMap; a decoy
    namespace with its own ``chat``."""
    decoy = f"d-{uuid.uuid4().hex[:10]}"
    kubectl("create", "namespace", decoy)
    with control_plane.api() as api:
        for ns in (namespace, decoy):
            api.post(f"{GROUP}/namespaces/{ns}/modeldeployments", json=deployment(ns)).raise_for_status()
            api.patch(
                f"{GROUP}/namespaces/{ns}/modeldeployments/chat/status",
                json={"status": {"candidateBuild": {"id": CANDIDATE, "uri": f"file:///store/{CANDIDATE}"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()
        victim = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "victim", "namespace": namespace}, "data": {"k": "v"}}  # fmt: skip
        api.post(f"/api/v1/namespaces/{namespace}/configmaps", json=victim).raise_for_status()

        def state() -> dict[str, str]:
            paths = [f"/api/v1/namespaces/{namespace}/configmaps/victim", f"/api/v1/namespaces/{namespace}",
                     f"/api/v1/namespaces/{decoy}", f"{GROUP}/namespaces/{decoy}/modeldeployments/chat"]  # fmt: skip
            return {p: api.get(p).json()["metadata"]["resourceVersion"] for p in paths}

        before = state()
        yield {"ns": namespace, "decoy": decoy}
        assert state() == before, "the victim, a namespace or the decoy deployment changed"
    kubectl("delete", "namespace", decoy, "--wait=false")


def kubeconfig(
    control_plane: ControlPlane, folder: Path, target_ns: str, decoy_ns: str
) -> tuple[Path, str, str]:
    """A kubeconfig with the contexts ``decoy`` (current) and ``target``, each a new identity."""
    tag = uuid.uuid4().hex[:8]
    target, decoy = f"plugin-target-{tag}", f"plugin-decoy-{tag}"
    docs = {u: yaml.safe_load(control_plane.user_kubeconfig(u).read_text()) for u in (target, decoy)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": docs[target]["clusters"],
        "users": [docs[target]["users"][0], docs[decoy]["users"][0]],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": docs[user]["clusters"][0]["name"], "user": user, "namespace": ns},
            }
            for name, user, ns in (("decoy", decoy, decoy_ns), ("target", target, target_ns))
        ],
        "current-context": "decoy",
    }
    path = folder / f"config-{tag}"
    path.write_text(yaml.safe_dump(config))
    return path, target, decoy


def requests_of(control_plane: ControlPlane, path: Path, context: str, user: str) -> list[dict[str, Any]]:
    """The audit events of ``user`` before a ``/version`` request it makes now (which marks the end)."""
    loader_config = yaml.safe_load(path.read_text())
    loader_config["current-context"] = context
    path.with_suffix(".mark").write_text(yaml.safe_dump(loader_config))
    config = load_configuration(str(path.with_suffix(".mark")))
    KubeClient(config).probe()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        events = [e for e in control_plane.audit(user) if e.get("stage") == "ResponseComplete"]
        if any(e["requestURI"] == "/version" for e in events):
            return [e for e in events if e["requestURI"] != "/version"]
        time.sleep(0.1)
    raise AssertionError(f"the audit log never showed {user}'s /version request")


def run(path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, str]:  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("POLYMORPH_STORE", raising=False)
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


VICTIM = "../../../../../../api/v1/namespaces/{ns}/configmaps/victim"

# argv (``{ns}`` is the target namespace) and words of the sentence: refused, no request at all.
# fmt: off
REFUSED: list[tuple[tuple[str, ...], str]] = [
    (("pin", VICTIM, "-n", "{ns}", "--build", "reference"), "unknown TYPE '..' before the '/'"),
    (("--context", "target", "-n", "{ns}", "pin", "md", VICTIM, "--build", "reference"), "is not an object name"),
    (("--context", "target", "pin", "md/" + VICTIM, "--build", "reference"), "is not an object name"),
    (("--context", "target", "get", "md", "../../../../namespaces/{ns}"), "is not an object name"),
    (("--context", "target", "get", "md", "chat/../../../../../api/v1/namespaces/{ns}/configmaps/victim"), "is not an object name"),
    (("--context", "target", "get", "cj", "..%2F..%2F..%2Fconfigmaps%2Fvictim"), "is not an object name"),
    (("--context", "target", "approve", "chat%2F.."), "is not an object name"),
    (("--context", "target", "abort", "..", "--force"), "is not an object name"),
    (("--context", "target", "retry", "."), "is not an object name"),
    (("--context", "target", "approve", "Chat"), "is not an object name"),
    (("--context", "target", "get", "md", "c" * 254), "at most 253"),
    (("--context", "target", "get", "configmaps", "victim"), "unknown TYPE 'configmaps'"),
    (("--context", "target", "get", "configmaps/victim"), "unknown TYPE 'configmaps'"),
    (("--context", "target", "-n", "../{ns}", "approve", "chat"), "is not a namespace"),
    (("--context", "target", "-n", "{ns}/configmaps/victim", "approve", "chat"), "is not a namespace"),
    (("--context", "target", "-n", "{ns}%2Fconfigmaps", "get", "md", "chat"), "is not a namespace"),
    (("--context", "target", "-n", "..", "get", "md", "chat"), "is not a namespace"),
    (("--context", "target", "-n", "KUBE-SYSTEM", "get", "md", "chat"), "is not a namespace"),
    (("--context", "target", "-n", "n" * 64, "get", "md", "chat"), "at most 63"),
    (("--context", "nosuch", "-n", "{ns}", "approve", "chat"), "--context 'nosuch' is not a context of kubeconfig"),
    (("--context", "../target", "-n", "{ns}", "approve", "chat"), "is not a context of kubeconfig"),
    (("--context", "target/..", "-n", "{ns}", "get", "md", "chat"), "is not a context of kubeconfig"),
    (("--context", "target", "-n", "{ns}", "pin", "chat", "--build", "../../victim"), "--build: '../../victim' is not a build id"),
]
# fmt: on


@pytest.mark.parametrize(("argv", "words"), REFUSED, ids=[" ".join(a)[:70] for a, _ in REFUSED])
def test_hostile_input_makes_no_request(
    control_plane: ControlPlane,
    world: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    words: str,
) -> None:
    path, target, decoy = kubeconfig(control_plane, tmp_path, "default", world["decoy"])
    rc, out, err = run(path, capsys, monkeypatch, *(a.format(ns=world["ns"]) for a in argv))
    assert rc == 2 and words in err and out == "", (rc, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert requests_of(control_plane, path, "target", target) == []
    assert requests_of(control_plane, path, "decoy", decoy) == []


def test_a_hostile_namespace_in_the_kubeconfig_makes_no_request(
    control_plane: ControlPlane,
    world: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, target, decoy = kubeconfig(control_plane, tmp_path, f"../../api/v1/namespaces/{world['ns']}", world["decoy"])  # fmt: skip
    rc, _, err = run(path, capsys, monkeypatch, "--context", "target", "get", "md", "chat")
    assert rc == 2 and "the namespace of context 'target'" in err and "is not a namespace" in err, err
    doc = yaml.safe_load(path.read_text())
    doc["contexts"][1]["context"]["namespace"] = "default"
    path.write_text(yaml.safe_dump(doc))  # the marks below need a usable context
    assert requests_of(control_plane, path, "target", target) == []
    assert requests_of(control_plane, path, "decoy", decoy) == []


def named_only(
    events: list[dict[str, Any]], namespace: str, name: str, kind: str = "modeldeployments"
) -> None:
    """Every event is a request on ``kind`` ``namespace/name``, or a list of the CompileJobs of that
    namespace (``get md`` finds the deployment's last one), built from the resource's own path."""
    assert events, "no request reached the API server"
    for e in events:
        ref = e.get("objectRef") or {}
        assert ref.get("apiGroup") == "polymorph.dev" and ref.get("namespace") == namespace, e["requestURI"]
        if e["verb"] == "list":
            assert ref["resource"] == "compilejobs" and "name" not in ref, e["requestURI"]
            assert e["requestURI"].split("?")[0] == f"{GROUP}/namespaces/{namespace}/compilejobs"
        else:
            assert (ref["resource"], ref.get("name")) == (kind, name), e["requestURI"]
            assert e["requestURI"].split("?")[0] == f"{GROUP}/namespaces/{namespace}/{kind}/{name}"


# (argv, exit status, the object named: (resource, name)): each reaches that object and no other.
# fmt: off
NAMED: list[tuple[tuple[str, ...], int, tuple[str, str]]] = [
    (("--context", "target", "-n", "{ns}", "approve", "chat"), 0, ("modeldeployments", "chat")),
    (("-o", "json", "--context", "target", "-n", "{ns}", "get", "md", "chat"), 0, ("modeldeployments", "chat")),
    (("get", "md/chat", "-n", "{ns}", "--context", "target", "-o", "json"), 0, ("modeldeployments", "chat")),
    (("--context=target", "-n{ns}", "pin", "md", "chat", "--build", "reference"), 0, ("modeldeployments", "chat")),
    (("--context", "target", "-n", "{ns}", "get", "md", "c" * 253), 2, ("modeldeployments", "c" * 253)),
    (("--context", "target", "-n", "{ns}", "get", "cj", "victim"), 2, ("compilejobs", "victim")),
    (("--context", "target", "-n", "{ns}", "get", "md", "victim.v2"), 2, ("modeldeployments", "victim.v2")),
]
# fmt: on


@pytest.mark.parametrize(("argv", "rc", "named"), NAMED, ids=[" ".join(a)[:70] for a, _, _ in NAMED])
def test_a_command_reaches_the_named_object_and_no_other(
    control_plane: ControlPlane,
    world: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    rc: int,
    named: tuple[str, str],
) -> None:
    path, target, decoy = kubeconfig(control_plane, tmp_path, "default", world["decoy"])
    done, out, err = run(path, capsys, monkeypatch, *(a.format(ns=world["ns"]) for a in argv))
    assert done == rc, (out, err)
    assert "Traceback" not in err
    if rc == 2:
        assert err.strip().endswith("not found.") and len(err.strip().splitlines()) == 1, err
    if "json" in argv:
        assert json.loads(out)["namespace"] == world["ns"]
    named_only(requests_of(control_plane, path, "target", target), world["ns"], named[1], named[0])
    assert requests_of(control_plane, path, "decoy", decoy) == []  # never the current context


def test_approve_changes_the_named_deployment_only(
    control_plane: ControlPlane,
    world: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """issue 32's first example: flags before the command; the approval lands in the namespace and on
    the context named, not on the kubeconfig's current ones (the decoy has the same name)."""
    path, target, decoy = kubeconfig(control_plane, tmp_path, "default", world["decoy"])
    rc, out, err = run(path, capsys, monkeypatch, "--context", "target", "-n", world["ns"], "approve", "chat")
    assert rc == 0 and "applied" in out, err
    with control_plane.api() as api:
        md = api.get(f"{GROUP}/namespaces/{world['ns']}/modeldeployments/chat").json()
        other = api.get(f"{GROUP}/namespaces/{world['decoy']}/modeldeployments/chat").json()
    assert md["metadata"]["annotations"]["polymorph.dev/approve"] == CANDIDATE
    assert "polymorph.dev/approve" not in (other["metadata"].get("annotations") or {})
    events = requests_of(control_plane, path, "target", target)
    named_only(events, world["ns"], "chat")
    assert [e["verb"] for e in events] == ["get", "patch"]
    assert requests_of(control_plane, path, "decoy", decoy) == []
