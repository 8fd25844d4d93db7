"""The node agent is the kubelet of the real control plane: the upstream controllers do the rest.

A Deployment, a ReplicaSet and an Indexed Job are run by kube-controller-manager's own
controllers and placed by kube-scheduler; the agent (``support.node_agent.NodeAgent``, as the kubelet
identity ``system:node:<name>`` under the Node authorizer) runs what is bound to its node as
local processes and reports back. The containers are small Python programs, so each test takes
seconds.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from support.control_plane import ControlPlane
from support.node_agent import NodeAgent
from support.waiting import wait_for

# What the container sees, written as JSON to its log, then an HTTP server that its readiness
# probe reads: env, args, and the files of its volumes.
SHOW = """
import http.server, json, os, pathlib, sys
seen = {"args": sys.argv[1:], "env": {k: os.environ.get(k) for k in ("FROM_SECRET", "FROM_CONFIG", "PLAIN")},
        "files": {str(p): p.read_text() for d in sys.argv[1:] for p in pathlib.Path(d).rglob("*")
                  if p.is_file() and not p.name.startswith("..")}}
print(json.dumps(seen), flush=True)
host, port = os.environ["LISTEN"].rsplit(":", 1)
http.server.HTTPServer((host, int(port)), http.server.SimpleHTTPRequestHandler).serve_forever()
"""
# Ignores SIGTERM: only the SIGKILL at the end of the grace period stops it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    name = f"node-{uuid.uuid4().hex[:6]}"
    agent = NodeAgent(control_plane.node_kubeconfig(name), name, tmp_path_factory.mktemp("node")).start()
    yield agent
    agent.close()
    control_plane.remove_node(name)


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[httpx.Client]:
    with control_plane.api() as client:
        yield client


@pytest.fixture
def namespace(api: httpx.Client) -> Iterator[str]:
    name = f"n-{uuid.uuid4().hex[:8]}"
    assert api.post("/api/v1/namespaces", json={"metadata": {"name": name}}).status_code == 201
    # The ServiceAccount admission plugin refuses pods until the controller has made "default".
    wait_for("the default service account", lambda: api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
             .status_code == 200, timeout=30)  # fmt: skip
    yield name
    api.delete(f"/api/v1/namespaces/{name}")


def create(api: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.post(path, json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def pods(api: httpx.Client, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(
        f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}
    ).json()["items"]
    return items


def seen_by(api: httpx.Client, node: NodeAgent, namespace: str) -> str:
    """What the API and the agent hold, for a failed wait's message."""
    listed = pods(api, namespace, "")
    shown = [(p["metadata"]["name"], p["spec"].get("nodeName"), p.get("status")) for p in listed]
    logs = {p.name: {c["name"]: p.log(c["name"])[-300:] for c in p.spec["containers"]} for p in node.pods()}
    return f"pods {shown}; agent errors {node.errors}; logs {logs}"


def condition(pod: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions") or [] if c["type"] == kind), None)


def test_a_deployment_runs_ready_with_env_args_and_volumes(
    api: httpx.Client, node: NodeAgent, namespace: str
) -> None:
    create(api, f"/api/v1/namespaces/{namespace}/secrets", {"metadata": {"name": "creds"},
           "stringData": {"token": "s3cr3t", "file.txt": "from a secret"}})  # fmt: skip
    create(api, f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "conf"},
           "data": {"mode": "fast", "settings.ini": "[a]\nb = 1\n"}})  # fmt: skip
    container = {
        "name": "show",
        "image": "example.invalid/show",
        "command": ["python", "-c", SHOW],
        "args": ["/etc/conf", "/etc/creds", "/scratch"],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "env": [
            {"name": "LISTEN", "value": "127.0.0.1:8080"},  # the agent maps the port, as for every pod
            {"name": "PLAIN", "value": "plain"},
            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "FROM_CONFIG", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "mode"}}},
        ],
        "volumeMounts": [
            {"name": "conf", "mountPath": "/etc/conf"},
            {"name": "creds", "mountPath": "/etc/creds"},
            {"name": "scratch", "mountPath": "/scratch"},
        ],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    labels = {"app": "show"}
    create(api, f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "metadata": {"name": "show"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 2, "volumes": [
                {"name": "conf", "configMap": {"name": "conf"}},
                {"name": "creds", "secret": {"secretName": "creds"}},
                {"name": "scratch", "emptyDir": {}},
            ]},
        }},
    })  # fmt: skip

    def ready() -> bool:
        got = api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/show").json()
        return (got.get("status") or {}).get("readyReplicas") == 2

    try:
        wait_for("the deployment's 2 ready replicas", ready, timeout=90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {seen_by(api, node, namespace)}") from None
    running = pods(api, namespace, "app=show")
    assert len(running) == 2
    for pod in running:
        assert pod["spec"]["nodeName"] == node.name  # placed by kube-scheduler
        assert pod["status"]["phase"] == "Running"
        assert condition(pod, "Ready") == condition(pod, "ContainersReady") == "True"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and "running" in status["state"]
    local = next(p for p in node.pods() if p.name == running[0]["metadata"]["name"])
    seen = json.loads(local.log("show").splitlines()[0])
    assert seen["env"] == {"FROM_SECRET": "s3cr3t", "FROM_CONFIG": "fast", "PLAIN": "plain"}
    volumes = local.dir / "volumes"
    assert seen["args"] == [str(volumes / "conf"), str(volumes / "creds"), str(volumes / "scratch")]
    assert seen["files"] == {
        str(volumes / "conf" / "mode"): "fast",
        str(volumes / "conf" / "settings.ini"): "[a]\nb = 1\n",
        str(volumes / "creds" / "token"): "s3cr3t",
        str(volumes / "creds" / "file.txt"): "from a secret",
    }
    account = next(p for p in (volumes).iterdir() if p.name.startswith("kube-api-access-"))
    assert (account / "namespace").read_text() == namespace
    assert (account / "token").read_text().count(".") == 2  # a JWT from the TokenRequest API
    assert "BEGIN CERTIFICATE" in (account / "ca.crt").read_text()
    assert node.errors == []


def test_a_deletion_waits_for_the_grace_period_then_kills(
    api: httpx.Client, node: NodeAgent, namespace: str
) -> None:
    container = {
        "name": "stubborn",
        "image": "example.invalid/stubborn",
        "command": ["python", "-c", STUBBORN],
    }
    create(api, f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": "stubborn"},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 30, "restartPolicy": "Never"},
    })  # fmt: skip
    wait_for("the pod to run", lambda: api.get(f"/api/v1/namespaces/{namespace}/pods/stubborn").json()
             ["status"].get("phase") == "Running", timeout=60)  # fmt: skip
    local = next(p for p in node.pods() if p.name == "stubborn")
    wait_for("the container's output", lambda: "up" in local.log("stubborn"), timeout=30)
    (proc,) = [c.proc for c in local._containers if c.proc is not None]
    deleted = api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/stubborn",
                          json={"gracePeriodSeconds": 2})  # fmt: skip
    assert deleted.status_code == 200
    assert api.get(f"/api/v1/namespaces/{namespace}/pods/stubborn").json()["metadata"]["deletionTimestamp"]
    wait_for("the pod object to go", lambda: api.get(f"/api/v1/namespaces/{namespace}/pods/stubborn")
             .status_code == 404, timeout=30)  # fmt: skip
    assert proc.returncode == -9  # SIGTERM was ignored; SIGKILL ended it after the 2 s grace


def test_an_indexed_job_completes_through_the_job_controller(
    api: httpx.Client, node: NodeAgent, namespace: str
) -> None:
    script = "import os, sys; print('index', os.environ['JOB_COMPLETION_INDEX']); sys.exit(0)"
    container = {"name": "work", "image": "example.invalid/work", "command": ["python", "-c", script]}
    create(api, f"/apis/batch/v1/namespaces/{namespace}/jobs", {
        "metadata": {"name": "work"},
        "spec": {"completions": 2, "parallelism": 2, "completionMode": "Indexed", "backoffLimit": 0,
                 "template": {"spec": {"containers": [container], "restartPolicy": "Never"}}},
    })  # fmt: skip

    def complete() -> dict[str, Any] | None:
        status = api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/work").json().get("status") or {}
        done = any(c["type"] == "Complete" and c["status"] == "True" for c in status.get("conditions") or [])
        return status if done else None

    status = wait_for("the job's Complete condition", complete, timeout=90)
    assert status["succeeded"] == 2 and status["completedIndexes"] == "0,1"
    logs = sorted(p.log("work").strip() for p in node.pods() if p.namespace == namespace)
    assert logs == ["index 0", "index 1"]
