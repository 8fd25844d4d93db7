"""The real kubectl (v1.35) against the emulator: apply CRDs and examples, get with printer columns, delete."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from support.k8s_binaries import kubectl
from support.k8s_emulator import EmulatorThread

REPO = Path(__file__).resolve().parents[2]
NAMESPACES = "apiVersion: v1\nkind: Namespace\nmetadata: {name: inference}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: polymorph-dev}\n"  # fmt: skip

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run(k8s_emulator: EmulatorThread, tmp_path: Path) -> Kubectl:
    config = k8s_emulator.kubeconfig(tmp_path / "kubeconfig")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(config)}

    def kubectl_run(
        *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(kubectl()), *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
        return done

    return kubectl_run


@pytest.fixture
def applied(run: Kubectl) -> Kubectl:
    run("apply", "-f", "-", stdin=NAMESPACES)
    assert "created" in run("apply", "-f", str(REPO / "crds")).stdout
    out = run("apply", "-f", str(REPO / "crds" / "examples")).stdout
    assert out.count("created") == len(list((REPO / "crds" / "examples").glob("*.yaml"))), out
    return run


def test_get_md_shows_the_printer_columns(applied: Kubectl) -> None:
    header, *rows = applied("get", "md", "-A").stdout.splitlines()
    assert header.split() == ["NAMESPACE", "NAME", "BUILD", "PHASE", "DRIFT", "BENCH-TOK/S", "AGE"]
    assert {r.split()[1] for r in rows} == {"llama-8b-chat", "qwen-0-5b"}
    wide = applied("get", "md", "-n", "inference", "-o", "wide").stdout.splitlines()[0]
    assert "REPLICAS" in wide and "BUILD ID" in wide


def test_get_yaml_and_reapply_is_unchanged(applied: Kubectl) -> None:
    obj = yaml.safe_load(applied("get", "md", "qwen-0-5b", "-n", "inference", "-o", "yaml").stdout)
    assert obj["kind"] == "ModelDeployment" and obj["metadata"]["uid"] and obj["metadata"]["generation"] == 1
    again = applied("apply", "-f", str(REPO / "crds" / "examples" / "modeldeployment-minimal.yaml")).stdout
    assert "unchanged" in again


def test_apply_of_a_change_patches_and_bumps_generation(applied: Kubectl, tmp_path: Path) -> None:
    manifest = yaml.safe_load((REPO / "crds" / "examples" / "modeldeployment-minimal.yaml").read_text())
    manifest["spec"]["replicas"] = 3
    (tmp_path / "md.yaml").write_text(yaml.safe_dump(manifest))
    assert "configured" in applied("apply", "-f", str(tmp_path / "md.yaml")).stdout
    got = applied(
        "get", "md", "qwen-0-5b", "-n", "inference", "-o", "jsonpath={.spec.replicas} {.metadata.generation}"
    )
    assert got.stdout == "3 2"


def test_a_typo_is_refused_by_strict_field_validation(applied: Kubectl, tmp_path: Path) -> None:
    manifest = yaml.safe_load((REPO / "crds" / "examples" / "modeldeployment-minimal.yaml").read_text())
    manifest["metadata"]["name"] = "typo"
    manifest["spec"]["replicaz"] = 3
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(manifest))
    done = applied("apply", "-f", str(tmp_path / "typo.yaml"), check=False)
    assert done.returncode != 0 and 'unknown field "spec.replicaz"' in done.stderr


def test_label_selector_and_delete(applied: Kubectl) -> None:
    applied("label", "md", "qwen-0-5b", "-n", "inference", "tier=small")
    selected = applied("get", "md", "-A", "-l", "tier=small", "-o", "name").stdout.split()
    assert selected == ["modeldeployment.polymorph.dev/qwen-0-5b"]
    assert applied("get", "md", "-A", "-l", "tier!=small", "-o", "name").stdout.split() == [
        "modeldeployment.polymorph.dev/llama-8b-chat"
    ]
    assert "deleted" in applied("delete", "md", "qwen-0-5b", "-n", "inference").stdout
    assert "qwen-0-5b" not in applied("get", "md", "-A").stdout


def test_get_namespaces_and_api_resources(run: Kubectl) -> None:
    assert "default" in run("get", "namespaces").stdout
    assert "deployments" in run("api-resources").stdout


def test_typed_commands_send_protobuf_and_are_understood(run: Kubectl) -> None:
    run("create", "namespace", "proto")
    run("create", "secret", "generic", "s", "--from-literal=key=value", "-n", "proto")
    run("create", "configmap", "c", "--from-literal=x=y", "-n", "proto")
    assert run("get", "secret", "s", "-n", "proto", "-o", "jsonpath={.data.key}").stdout == "dmFsdWU="
    assert run("get", "configmap", "c", "-n", "proto", "-o", "jsonpath={.data.x}").stdout == "y"
    assert 'namespace "proto" deleted' in run("delete", "namespace", "proto").stdout
    assert run("get", "secrets", "-n", "proto", "-o", "name").stdout == ""
