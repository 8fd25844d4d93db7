"""What the operator's integration tests stand on: the real operator process, an API client, fake engines,
and a stand-in for the controllers that do not run here.

- ``Api``: plain HTTP on the emulator (the wire protocol, nothing in between).
- ``OperatorProcess``: ``polymorph operator`` (``python -m polymorph.cli operator``) with short intervals; ``kill()``
  sends SIGKILL, ``start()`` starts it again; its JSON log lines are kept in a file.
- ``FakeEngine``: an HTTP /metrics endpoint rendered by the engine's own ``ServerMetrics``,
  fed with requests of the shape and speed the test chooses, scraped by the real Prometheus.
- ``Kubelet``: makes Deployments' status say their replicas are ready and rolled out, as the
  Deployment controller and kubelets would (the emulator runs no controllers).
- ``trace_agents`` / ``operator_access``: the emulator's access log, only the operator's calls;
  ``audit_against_chart`` checks them against the Helm chart's rendered RBAC.
"""

from __future__ import annotations

import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from charts.chart_rbac import Call, Use, audit, effective_permissions
from charts.chart_render import FULLNAME, NAMESPACE, render
from polymorph_engine.serving.metrics import CONTENT_TYPE_LATEST, RequestObservation, ServerMetrics
from support.prometheus import free_port
from support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
NS = "inference"
GROUP = "/apis/polymorph.dev/v1alpha1"


class Api:
    """A few verbs over the emulator's REST API."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=10)

    def get(self, path: str) -> dict[str, Any] | None:
        r = self.client.get(path)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result

    def items(self, path: str) -> list[dict[str, Any]]:
        got = self.get(path)
        return list(got["items"]) if got else []

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.client.post(path, json=body)
        assert r.status_code == 201, r.text
        result: dict[str, Any] = r.json()
        return result

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.client.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()
        return result

    def delete(self, path: str) -> None:
        r = self.client.delete(path)
        assert r.status_code in (200, 202, 404), r.text

    def md(self, name: str) -> dict[str, Any] | None:
        return self.get(f"{GROUP}/namespaces/{NS}/modeldeployments/{name}")

    def deployment(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        items = self.items(f"/api/v1/namespaces/{NS}/events")
        return [e for e in items if reason is None or e.get("reason") == reason]

    def compilejobs(self) -> list[dict[str, Any]]:
        return self.items(f"{GROUP}/namespaces/{NS}/compilejobs")


class OperatorProcess:
    """The real operator, as a child process, against the emulator and Prometheus.

    By default it watches ``NS`` with ``--standalone``; ``namespace=None`` watches every namespace,
    ``standalone=False`` runs kopf peering, and ``pod_id`` names the replica in the peering object
    (kopf reads ``POD_ID``, as the chart's pods would set it).
    """

    def __init__(
        self,
        kubeconfig: Path,
        prometheus_url: str,
        store: Path,
        log: Path,
        *,
        namespace: str | None = NS,
        standalone: bool = True,
        pod_id: str | None = None,
        **flags: str,
    ) -> None:
        self.metrics_port, self.health_port = free_port(), free_port()
        self.args = [
            sys.executable, "-m", "polymorph.cli", "operator",
            *(["--namespace", namespace] if namespace else ["--all-namespaces"]),
            "--prometheus-url", prometheus_url,
            "--store", str(store),
            *(["--standalone"] if standalone else []),
            "--metrics-port", str(self.metrics_port),
            "--health-port", str(self.health_port),
            "--drift-interval", flags.pop("drift_interval", "1"),
            "--rollout-interval", flags.pop("rollout_interval", "0.5"),
        ]  # fmt: skip
        for key, value in flags.items():
            self.args += [f"--{key.replace('_', '-')}", value]
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(REPO / "tests")}
        if pod_id is not None:
            self.env["POD_ID"] = pod_id
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=out, stderr=out, env=self.env, cwd=REPO)
        out.close()
        wait_for("the operator's /healthz", self.healthy, timeout=30)
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator exited: {self.tail()}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as a node failure or OOM kill would."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def metric(self, name: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": line, "unparsed": True})
        return out

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


class _MetricsHandler(BaseHTTPRequestHandler):
    server: _MetricsServer

    def do_GET(self) -> None:
        body = self.server.engine.metrics.render()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class _MetricsServer(ThreadingHTTPServer):
    engine: FakeEngine


class FakeEngine:
    """One serving pod's /metrics, fed with the traffic the test sets (``serve``), scraped by Prometheus."""

    def __init__(self, model_deployment: str, track: str, build: str) -> None:
        self.metrics = ServerMetrics(build, model_deployment, track)
        self.server = _MetricsServer(("127.0.0.1", 0), _MetricsHandler)
        self.server.engine = self
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._stop = threading.Event()
        self._shape = (64, 32, 0.01, 20.0, 2)
        self._threads = [
            threading.Thread(target=self.server.serve_forever, daemon=True),
            threading.Thread(target=self._traffic, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def serve(
        self, prompt: int, generated: int, itl_s: float, per_second: float = 20.0, in_flight: int = 2
    ) -> None:
        """From now on: ``per_second`` requests of this shape and speed, with ``in_flight`` running."""
        self._shape = (prompt, generated, itl_s, per_second, in_flight)

    def _traffic(self) -> None:
        running = 0
        while not self._stop.wait(0.1):
            prompt, generated, itl, rate, in_flight = self._shape
            while running < in_flight:
                self.metrics.request_started()
                running += 1
            for _ in range(max(1, round(rate / 10))):
                obs = RequestObservation(prompt, generated, itl * 2, [itl] * max(0, generated - 1), "ok")
                self.metrics.request_finished(obs)
                self.metrics.request_started()

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


class Kubelet:
    """Marks every Deployment in the namespace as rolled out and ready, like the controllers would."""

    def __init__(self, api: Api, every: float = 0.2) -> None:
        self.api = api
        self.every = every
        self.paused: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                for d in self.api.items(f"/apis/apps/v1/namespaces/{NS}/deployments"):
                    name = d["metadata"]["name"]
                    if name in self.paused:
                        continue
                    replicas = int(d["spec"].get("replicas") or 0)
                    gen = d["metadata"].get("generation", 1)
                    want = {
                        "observedGeneration": gen, "replicas": replicas, "readyReplicas": replicas,
                        "updatedReplicas": replicas, "availableReplicas": replicas,
                    }  # fmt: skip
                    status = d.get("status") or {}
                    if any(status.get(k) != v for k, v in want.items()):
                        self.api.client.patch(
                            f"/apis/apps/v1/namespaces/{NS}/deployments/{name}/status",
                            json={"status": want},
                            headers={"Content-Type": "application/merge-patch+json"},
                        )
            except httpx.HTTPError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


_agent: contextvars.ContextVar[str] = contextvars.ContextVar("polymorph_test_user_agent", default="")


class _AgentLog(list):  # type: ignore[type-arg]
    """The emulator's access log, each entry tagged with the User-Agent of the request that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.agents: list[str] = []

    def append(self, item: Any) -> None:
        super().append(item)
        self.agents.append(_agent.get())


def trace_agents(emulator: Any) -> _AgentLog:
    """Tag the emulator's access log with User-Agents, so a test can tell the operator's requests from its own."""
    log = _AgentLog()
    emulator.access_log = log
    base = type(emulator)

    class Traced(base):  # type: ignore[valid-type, misc]
        __slots__ = ()

        async def _route(self, request: Any) -> Any:
            _agent.set(request.headers.get("User-Agent", ""))
            return await super()._route(request)

    emulator.__class__ = Traced  # the emulator is a slotted attrs class: swap the class, not a method
    return log


def operator_access(log: _AgentLog) -> set[Call]:
    """Every request not made by the test's httpx client, as RBAC sees it (namespace None: cluster-wide)."""
    out = set()
    for access, agent in zip(log, log.agents, strict=True):
        if agent.startswith("python-httpx"):
            continue
        resource = f"{access.resource}/{access.subresource}" if access.subresource else access.resource
        out.add(Call(access.verb, access.api_group, resource, access.namespace or None))
    return out


def audit_against_chart(calls: set[Call], values: dict[str, Any]) -> set[Use]:
    """Check recorded calls against the chart rendered with ``values`` (its bindings resolved for the
    operator's ServiceAccount): every call must be granted. Returns the grants no call used."""
    granted = effective_permissions(render(values), FULLNAME, NAMESPACE)
    refused, unused = audit(granted, calls)
    assert refused == [], f"the chart ({values}) does not grant: {refused}"
    return unused
