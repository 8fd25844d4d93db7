"""The analysis queries (``promql.analysis_queries``) on a real Prometheus (Debian's 2.42) scraping
two engines' real ``/metrics`` (``ServerMetrics``): a pod that has just appeared gives no latency
sample until it has been scraped for two whole intervals (its warm-up, then the window), then it
does; its requests count at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from polymorph.core.promql import analysis_queries, parse_analysis
from polymorph_engine.serving.metrics import RequestObservation, ServerMetrics
from support.metrics_endpoint import MetricsEndpoint
from support.prometheus import PrometheusServer, prometheus

__all__ = ["prometheus"]

INTERVAL_S = 4


class Engine:
    """One engine's /metrics, finishing a request of 8 tokens at ``itl_s`` every 50 ms."""

    def __init__(self, track: str, itl_s: float) -> None:
        self.metrics = ServerMetrics("b", "chat", track)
        self._endpoint = MetricsEndpoint(self.metrics)
        self.address = self._endpoint.address
        self._stop = threading.Event()
        threading.Thread(target=self._traffic, args=(itl_s,), daemon=True).start()

    def _traffic(self, itl_s: float) -> None:
        while not self._stop.wait(0.05):
            self.metrics.request_started()
            self.metrics.request_finished(RequestObservation(16, 8, 0.01, [itl_s] * 7, "ok", "length"))

    def close(self) -> None:
        self._stop.set()
        self._endpoint.close()


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.close()


def samples(prom: PrometheusServer) -> dict[str, Any]:
    results = {}
    for name, query in analysis_queries(f"{INTERVAL_S}s").items():
        rows = prom.query(query)
        results[name] = [(row["metric"], float(row["value"][1])) for row in rows]
    return parse_analysis(results).get(("ns", "chat"), {})


def test_a_new_pod_is_judged_once_it_has_warmed_up_for_an_interval(
    prometheus: PrometheusServer, engines: list[Engine]
) -> None:
    stable = Engine("stable", 0.02)
    engines.append(stable)
    prometheus.add_target(stable.address, namespace="ns")
    prometheus.wait_for_series('polymorph_requests_in_flight{track="stable"}')
    time.sleep(2 * INTERVAL_S + 1.5)  # the stable pod has warmed up and served a whole interval
    canary = Engine("canary", 0.01)
    engines.append(canary)
    prometheus.add_target(canary.address, namespace="ns")
    prometheus.wait_for_series('rate(polymorph_requests_total{track="canary",status="ok"}[4s]) > 0')

    young = samples(prometheus)
    assert young["stable"].itl_mean_s == [pytest.approx(0.02)] and young["stable"].itl_p95_s
    assert "canary" in young and young["canary"].requests > 0  # its requests count already
    assert young["canary"].itl_mean_s == [] and young["canary"].itl_p95_s == []
    assert young["canary"].ttft_p95_s == []

    time.sleep(INTERVAL_S)
    warming = samples(prometheus)  # scraped for about 1.5 intervals: still its warm-up
    assert warming["canary"].itl_mean_s == [] and warming["canary"].requests > 0
    time.sleep(INTERVAL_S)
    grown = samples(prometheus)
    assert grown["canary"].itl_mean_s == [pytest.approx(0.01)] and len(grown["canary"].itl_p95_s) == 1
    assert len(grown["canary"].ttft_p95_s) == 1 and grown["stable"].itl_mean_s == [pytest.approx(0.02)]
