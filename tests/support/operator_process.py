"""``polymorph operator`` as a child process, for the operator integration tests and the e2e harness.

Its JSON log lines go to a file; ``start`` waits for ``/healthz``, and a process that exits
while being waited for fails the wait with the log's tail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support import probes
from support.prometheus import free_port
from support.waiting import wait_for

__all__ = ["NS", "REPO", "OperatorProcess"]

REPO = Path(__file__).resolve().parents[2]
NS = "inference"


class OperatorProcess:
    """The real operator, as a child process, against a Kubernetes API and Prometheus.

    By default it watches ``NS`` with ``--standalone``; ``namespace=None`` watches every namespace,
    ``standalone=False`` runs kopf peering, and ``pod_id`` names the replica in the peering object
    (kopf reads ``POD_ID``, as the chart's pods would set it). ``env`` is added to this process's
    environment; other keyword flags become ``--flag value`` (``store_secret`` ->
    ``--store-secret``).
    """

    def __init__(
        self,
        kubeconfig: Path,
        prometheus_url: str,
        store: Path | str,
        log: Path,
        *,
        namespace: str | None = NS,
        standalone: bool = True,
        pod_id: str | None = None,
        env: Mapping[str, str] | None = None,
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
            "--drift-interval", flags.pop("drift_interval", "1s"),
            "--rollout-interval", flags.pop("rollout_interval", "500ms"),
        ]  # fmt: skip
        for key, value in flags.items():
            self.args += [f"--{key.replace('_', '-')}", value]
        self.env = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
        if pod_id is not None:
            self.env["POD_ID"] = pod_id
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> OperatorProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=out, env=self.env, cwd=REPO)
        wait_for("the operator's /healthz", self.healthy, timeout=timeout)
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator exited: {self.tail()}")
        answer = probes.get(self.health_port, "/healthz", timeout=1)
        return answer is not None and answer[0] == 200

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
        answer = probes.get(self.metrics_port, "/metrics", timeout=5)
        if answer is None:
            raise AssertionError(f"the operator's /metrics did not answer: {self.tail()}")
        return answer[1]

    def _samples(self, name: str) -> list[float]:
        return [
            float(line.rsplit(" ", 1)[1])
            for line in self.metrics().splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")
        ]

    def metric(self, name: str) -> float | None:
        """The first sample of a metric on /metrics (None when absent)."""
        samples = self._samples(name)
        return samples[0] if samples else None

    def metric_total(self, name: str) -> float:
        """The sum of a metric's samples over all its labels (0 when absent)."""
        return sum(self._samples(name))

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
