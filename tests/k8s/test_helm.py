"""The real helm (v4) installs, lists and uninstalls the project's chart against the emulator.

helm stores its releases as protobuf-encoded Secrets and applies the chart server-side; this shows
both paths of the emulator work with a real client.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx

from support.k8s_binaries import helm
from support.k8s_emulator import EmulatorThread

CHART = Path(__file__).resolve().parents[2] / "charts" / "polymorph"


def test_helm_install_and_uninstall_the_chart(k8s_emulator: EmulatorThread, tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "KUBECONFIG": str(k8s_emulator.kubeconfig(tmp_path / "kc")),
    }

    def run(*args: str) -> str:
        done = subprocess.run([str(helm()), *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("install", "pm", str(CHART), "--namespace", "default")
    assert "deployed" in run("list", "--namespace", "default")
    with httpx.Client(base_url=k8s_emulator.url) as api:
        deployments = api.get("/apis/apps/v1/namespaces/default/deployments").json()["items"]
        assert [d["metadata"]["labels"]["app.kubernetes.io/managed-by"] for d in deployments] == ["Helm"]
        releases = api.get(
            "/api/v1/namespaces/default/secrets", params={"labelSelector": "owner=helm"}
        ).json()
        assert [s["metadata"]["labels"]["status"] for s in releases["items"]] == ["deployed"]
        assert "uninstalled" in run("uninstall", "pm", "--namespace", "default")
        assert api.get("/apis/apps/v1/namespaces/default/deployments").json()["items"] == []
        assert api.get("/api/v1/namespaces/default/secrets").json()["items"] == []
