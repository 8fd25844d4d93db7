"""The real control plane serves: its version, RBAC enforced, the controllers at work, the CRDs.

The CRDs of ``crds/`` and every manifest of ``crds/examples`` go through the real kubectl into
the upstream kube-apiserver: the CRDs are Established (structural schemas, CEL rules within
the cost budget) and every example is accepted, with the printer columns shown (and the wide
ones); an unknown field is refused (kubectl's strict field validation, the CRD's schema).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from support import yamls
from support.control_plane import ControlPlane, ControlPlaneUnavailable
from support.control_plane_build import VERSION, binaries
from support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
Kubectl = Callable[..., subprocess.CompletedProcess[str]]
EXAMPLES = sorted((REPO / "crds" / "examples").glob("*.yaml"))


def test_the_server_is_the_release_built(control_plane: ControlPlane) -> None:
    with control_plane.api() as api:
        assert api.get("/version").json()["gitVersion"] == VERSION
        assert api.get("/readyz").status_code == 200
    assert set(control_plane.timings) >= {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    }


def test_the_crds_are_established_and_every_example_is_accepted(
    crds: None, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    for path in EXAMPLES:
        documents = [d for d in yamls.load_all(path.read_text()) if d]
        for document in documents:
            document["metadata"]["namespace"] = namespace
        (tmp_path / path.name).write_text(yaml.safe_dump_all(documents))
    out = kubectl("apply", "--server-side", "-f", str(tmp_path)).stdout
    assert out.count("serverside-applied") == len(EXAMPLES), out
    header, *rows = kubectl("get", "md", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "BUILD", "PHASE", "DRIFT", "BENCH-TOK/S", "AGE"]
    assert {r.split()[0] for r in rows} == {"llama-8b-chat", "qwen-0-5b"}
    wide = kubectl("get", "md", "-n", namespace, "-o", "wide").stdout.splitlines()[0]
    assert "REPLICAS" in wide and "BUILD ID" in wide
    typo = yamls.load((REPO / "crds" / "examples" / "modeldeployment-minimal.yaml").read_text())
    typo["metadata"] |= {"name": "typo", "namespace": namespace}
    typo["spec"]["replicaz"] = 3
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(typo))
    refused = kubectl("apply", "-f", str(tmp_path / "typo.yaml"), check=False)
    assert refused.returncode != 0 and 'unknown field "spec.replicaz"' in refused.stderr
    names = kubectl("get", "compilejobs", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == [
        "compilejob.polymorph.dev/llama-8b-chat-7f3a",
        "compilejob.polymorph.dev/tiny-llama-cpu-search",
    ]


def test_rbac_decides_for_a_service_account(
    control_plane: ControlPlane, kubectl: Kubectl, namespace: str
) -> None:
    kubectl("create", "serviceaccount", "reader", "-n", namespace)
    token = kubectl("create", "token", "reader", "-n", namespace).stdout.strip()  # the TokenRequest API
    config = control_plane.kubeconfig_with_token(
        control_plane.workdir / f"{namespace}-reader.kubeconfig", token, user="reader", namespace=namespace
    )
    denied = kubectl("--kubeconfig", str(config), "get", "pods", check=False)
    assert denied.returncode != 0
    assert f'"system:serviceaccount:{namespace}:reader" cannot list resource "pods"' in denied.stderr
    kubectl("create", "rolebinding", "reader", "--clusterrole=view", f"--serviceaccount={namespace}:reader",
            "-n", namespace)  # fmt: skip
    allowed = wait_for(
        "the view role to apply",
        lambda: kubectl("--kubeconfig", str(config), "get", "pods", check=False).returncode == 0,
        timeout=30,
    )
    assert allowed
    denied = kubectl("--kubeconfig", str(config), "create", "configmap", "written", check=False)
    assert 'cannot create resource "configmaps"' in denied.stderr


def test_the_controllers_run_a_deployment_down_to_a_pending_pod(kubectl: Kubectl, namespace: str) -> None:
    kubectl("create", "deployment", "web", "--image=example.invalid/web", "--replicas=2", "-n", namespace)

    def pending_pods() -> list[str]:
        got = kubectl("get", "pods", "-n", namespace, "-o", "jsonpath={.items[*].status.phase}").stdout
        return got.split()

    assert wait_for("the deployment's two pods", lambda: pending_pods() == ["Pending", "Pending"], timeout=60)
    kubectl("delete", "deployment", "web", "-n", namespace)
    wait_for("the garbage collector to remove the pods", lambda: pending_pods() == [], timeout=60)


def test_missing_binaries_are_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYMORPH_TEST_CACHE", str(tmp_path))
    with pytest.raises(
        ControlPlaneUnavailable,
        match=r"^the Kubernetes v\S+ control plane is not built in .*make control-plane",
    ):
        binaries()
    with pytest.raises(ControlPlaneUnavailable, match=r"has no etcd; run `make control-plane`\.$"):
        ControlPlane(tmp_path, binaries_dir=tmp_path)
