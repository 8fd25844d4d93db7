"""The Prometheus seam: one method, a PromQL instant query in, ``(labels, value)`` pairs out.

Owns: ``Query`` (the protocol every caller uses; a test injects a plain function), the real
implementation over ``prometheus_api_client``, ``PrometheusUnavailable`` (Prometheus down,
timing out or refusing the query: the caller makes no decision on it) and a counting
wrapper for the operator's own metrics and the fleet benchmark. Range vectors and other
result types are refused: every query the operator sends returns an instant vector.

It knows nothing about what the queries mean (``polymorph.core.promql`` does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from polymorph.contract import timeouts
from polymorph.core.promql import Series

__all__ = ["CountingQuery", "PrometheusQuery", "PrometheusUnavailable", "Query"]


class PrometheusUnavailable(Exception):
    """Prometheus could not answer: it is down, slow, or refused the query. No data, no decision."""


Query = Callable[[str], list[Series]]
"""Run one PromQL instant query; raise ``PrometheusUnavailable`` when there is no answer.

A plain function is a ``Query``: that is the test double of this seam."""


def _parse(result: Any) -> list[Series]:
    if not isinstance(result, list):
        raise PrometheusUnavailable(f"Prometheus answered a {type(result).__name__}, not an instant vector")
    out: list[Series] = []
    for item in result:
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
        value = item.get("value")
        if not isinstance(value, list) or len(value) != 2:
            raise PrometheusUnavailable(
                "Prometheus answered a range vector; the operator's queries need instant vectors"
            )
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            number = math.nan
        out.append((labels, number))
    return out


class PrometheusQuery:
    """Instant queries against a Prometheus server's HTTP API."""

    def __init__(self, url: str, limits: timeouts.Limits = timeouts.PROMETHEUS) -> None:
        self.url = url.rstrip("/")
        # A quick retry at most: a cycle that gets no answer makes no decision, and the next cycle asks again.
        retry = Retry(total=limits.retries, backoff_factor=0.1, status_forcelist=(502, 503, 504))
        # requests takes (connect, read); prometheus_api_client passes its timeout through as it is.
        timeout: Any = (limits.connect_s, limits.read_s)
        self._client = PrometheusConnect(url=self.url, disable_ssl=False, timeout=timeout, retry=retry)

    def probe(self, limits: timeouts.Limits = timeouts.PROBE) -> None:
        """Ask Prometheus for its build info once, without retries; ``PrometheusUnavailable``
        naming the server when it does not answer as Prometheus does (checked at start-up)."""
        url = f"{self.url}/api/v1/status/buildinfo"
        try:
            response = requests.get(url, timeout=(limits.connect_s, limits.read_s))
            ok = response.status_code == 200 and response.json().get("status") == "success"
        except requests.RequestException as exc:
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} is unreachable: {type(exc).__name__}"
            ) from None
        except ValueError:
            ok = False
        if not ok:
            raise PrometheusUnavailable(
                f"{self.url} does not answer as Prometheus does (GET /api/v1/status/buildinfo: "
                f"{response.status_code}); check --prometheus-url"
            )

    def __call__(self, promql: str) -> list[Series]:
        try:
            return _parse(self._client.custom_query(promql))
        except PrometheusApiClientException as exc:
            raise PrometheusUnavailable(f"Prometheus at {self.url} refused a query: {exc}") from None
        except requests.RequestException as exc:
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} is unreachable: {type(exc).__name__}"
            ) from None
        except ValueError as exc:  # a body that is not JSON
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} answered something that is not JSON: {exc}"
            ) from None


class CountingQuery:
    """Wraps a ``Query`` and counts queries and failures (the operator's /metrics and benchmarks read them)."""

    def __init__(self, inner: Query, on_query: Callable[[bool], None] | None = None) -> None:
        self.inner = inner
        self.queries = 0
        self.errors = 0
        self._on_query = on_query

    def __call__(self, promql: str) -> list[Series]:
        self.queries += 1
        try:
            result = self.inner(promql)
        except PrometheusUnavailable:
            self.errors += 1
            if self._on_query is not None:
                self._on_query(False)
            raise
        if self._on_query is not None:
            self._on_query(True)
        return result
