"""What the operator's integration tests stand on: the real operator process, an API client and fake
engines.

- ``Api``: the admin's client of the real control plane (plain HTTP verbs, nothing in between);
  its shortcuts (``md``, ``deployment``, ``events``, ``compilejobs``) read the test's namespace.
- ``NS``: the namespace that the tests without a control plane put in their objects and flags;
  each test on the control plane has a fresh namespace of its own instead (the ``ns`` fixture).
- ``OperatorProcess`` (``support.operator_process``, shared with the e2e harness): ``polymorph
  operator`` with short intervals; ``kill()`` sends SIGKILL, ``start()`` starts it again; its
  JSON log lines are kept in a file.
- ``FakeEngine``: an HTTP /metrics endpoint rendered by the engine's own ``ServerMetrics``,
  fed with requests of the shape and speed the test chooses, scraped by the real Prometheus.
- ``audit_against_chart``: recorded API calls (the API server's audit log, through
  ``charts.chart_rbac.audited_calls``) checked against the Helm chart's rendered RBAC.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from charts.chart_rbac import Call, Use, audit, effective_permissions
from charts.chart_render import FULLNAME, NAMESPACE, render
from polymorph_engine.serving.metrics import RequestObservation, ServerMetrics
from support.metrics_endpoint import MetricsEndpoint
from support.operator_process import NS, REPO, OperatorProcess
from support.waiting import wait_for

__all__ = [
    "GROUP",
    "NS",
    "REPO",
    "Api",
    "FakeEngine",
    "OperatorProcess",
    "audit_against_chart",
    "wait_for",
]

GROUP = "/apis/polymorph.dev/v1alpha1"


class Api:
    """A few verbs over the API server's REST API, through ``client`` (or a plain one for ``url``);
    the shortcuts read namespace ``ns``."""

    def __init__(self, url: str, client: httpx.Client | None = None, *, ns: str) -> None:
        self.client = client or httpx.Client(base_url=url, timeout=10)
        self.ns = ns

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
        return self.get(f"{GROUP}/namespaces/{self.ns}/modeldeployments/{name}")

    def deployment(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/apps/v1/namespaces/{self.ns}/deployments/{name}")

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        items = self.items(f"/api/v1/namespaces/{self.ns}/events")
        return [e for e in items if reason is None or e.get("reason") == reason]

    def compilejobs(self) -> list[dict[str, Any]]:
        return self.items(f"{GROUP}/namespaces/{self.ns}/compilejobs")


class FakeEngine:
    """One serving pod's /metrics, fed with the traffic the test sets (``serve``), scraped by Prometheus."""

    def __init__(self, model_deployment: str, track: str, build: str) -> None:
        self.metrics = ServerMetrics(build, model_deployment, track)
        self._endpoint = MetricsEndpoint(self.metrics)
        self.address = self._endpoint.address
        self._stop = threading.Event()
        self._shape = (64, 32, 0.01, 20.0, 2)
        threading.Thread(target=self._traffic, daemon=True).start()

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
        self._endpoint.close()


def audit_against_chart(calls: set[Call], values: dict[str, Any]) -> set[Use]:
    """Check recorded calls against the chart rendered with ``values`` (its bindings resolved for the
    operator's ServiceAccount): every call must be granted. Returns the grants no call used."""
    granted = effective_permissions(render(values), FULLNAME, NAMESPACE)
    refused, unused = audit(granted, calls)
    assert refused == [], f"the chart ({values}) does not grant: {refused}"
    return unused
