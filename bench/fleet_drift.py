#!/usr/bin/env python
"""Fleet drift at scale: N ModelDeployments, one operator, a handful of PromQL queries per cycle.

Sets up, all on loopback: the Kubernetes emulator (``python -m support.k8s_emulator``, its own
process, with the CRDs), the real Prometheus (Debian's 2.42) scraping one metrics endpoint
that exposes the engine's metric families (``polymorph_prompt_tokens``,
``polymorph_generation_tokens``, ``polymorph_requests_in_flight``) for every deployment, and
the real operator process (``polymorph operator``). Each deployment has an
active build tuned for a short-prompt profile; ``--drifted`` of them receive long prompts
(drift 1) and open a CompileJob, the others serve the profile they were tuned for (drift 0).

Measured, from the operator's own /metrics and its JSON log: PromQL queries per drift cycle
(``polymorph_operator_drift_cycle_queries``; the acceptance is at most 6), each cycle's wall
time, status writes per cycle and CompileJobs opened; the operator's resident memory
(VmRSS and its peak VmHWM from /proc) once the fleet is reconciled.

Run: ``.venv/bin/python bench/fleet_drift.py --deployments 500 --out bench/results/fleet-500.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from polymorph_engine.serving.metrics import TOKEN_BUCKETS  # noqa: E402
from support.prometheus import PrometheusServer, free_port  # noqa: E402

NS = "fleet"
GROUP = "/apis/polymorph.dev/v1alpha1"
SHORT = {"inputTokens": {"bounds": [64], "counts": [100]}, "outputTokens": {"bounds": [32], "counts": [100]},
         "concurrency": 2}  # fmt: skip


class Fleet:
    """The engine metric families of N deployments in one exposition, counters growing with time."""

    def __init__(self, names: list[str], drifted: set[str], per_second: float = 2.0) -> None:
        self.names, self.drifted, self.rate = names, drifted, per_second
        self.start = time.monotonic()

    def _hist(self, lines: list[str], family: str, labels: str, value: int, count: float) -> None:
        for bound in TOKEN_BUCKETS:
            lines.append(
                f'{family}_bucket{{{labels},le="{float(bound)!r}"}} {count if value <= bound else 0.0}'
            )
        lines.append(f'{family}_bucket{{{labels},le="+Inf"}} {count}')
        lines.append(f"{family}_sum{{{labels}}} {count * value}")
        lines.append(f"{family}_count{{{labels}}} {count}")

    def render(self) -> bytes:
        count = round((time.monotonic() - self.start) * self.rate, 1)
        lines = ["# TYPE polymorph_prompt_tokens histogram"]
        prompt = {n: 4096 if n in self.drifted else 64 for n in self.names}
        for n in self.names:
            self._hist(
                lines,
                "polymorph_prompt_tokens",
                f'build="reference",model_deployment="{n}",track="stable"',
                prompt[n],
                count,
            )
        lines.append("# TYPE polymorph_generation_tokens histogram")
        for n in self.names:
            self._hist(
                lines,
                "polymorph_generation_tokens",
                f'build="reference",model_deployment="{n}",track="stable"',
                32,
                count,
            )
        lines.append("# TYPE polymorph_requests_in_flight gauge")
        for n in self.names:
            lines.append(
                f'polymorph_requests_in_flight{{build="reference",model_deployment="{n}",track="stable"}} 2'
            )
        return ("\n".join(lines) + "\n").encode()


def serve_fleet(fleet: Fleet) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = fleet.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"uri": "tiny"},
            "hardware": {"accelerator": "cpu"},
            "replicas": 2,
            "recompile": {"window": "1m", "minRequests": 10, "cooldown": "6h"},
        },
    }


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deployments", type=int, default=500)
    parser.add_argument(
        "--drifted", type=int, default=25, help="deployments whose traffic drifts (open a CompileJob)"
    )
    parser.add_argument(
        "--cycles", type=int, default=5, help="drift cycles to measure once the fleet is reconciled"
    )
    parser.add_argument("--drift-interval", default="5")
    parser.add_argument("--scrape-interval", default="5s")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.deployments < 1 or not 0 <= args.drifted <= args.deployments or args.cycles < 1:
        raise SystemExit(
            "--deployments and --cycles must be positive and --drifted between 0 and --deployments; "
            f"got {args.deployments}, {args.cycles} and {args.drifted}"
        )
    if not args.drift_interval.isdigit() or int(args.drift_interval) < 1:
        raise SystemExit(
            f"--drift-interval must be a positive whole number of seconds; got {args.drift_interval!r}"
        )
    seconds = args.scrape_interval.removesuffix("s")
    if not args.scrape_interval.endswith("s") or not seconds.isdigit() or int(seconds) < 1:
        raise SystemExit(f"--scrape-interval must be whole seconds such as 5s; got {args.scrape_interval!r}")
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="polymorph-fleet-"))
    names = [f"md-{i:04d}" for i in range(args.deployments)]
    drifted = set(names[: args.drifted])
    (work / "ns.yaml").write_text(
        json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    emulator = subprocess.Popen(
        [sys.executable, "-m", "support.k8s_emulator", "--ready-file", str(work / "ready.json"),
         "--kubeconfig", str(work / "kubeconfig"), "--preload", str(REPO / "crds"), "--preload", str(work / "ns.yaml")],
        env=env, cwd=REPO / "tests", stdout=subprocess.DEVNULL, stderr=(work / "emulator.log").open("wb"),
    )  # fmt: skip
    operator: subprocess.Popen[bytes] | None = None
    fleet = Fleet(names, drifted)
    server = serve_fleet(fleet)
    prometheus = PrometheusServer(scrape_interval=args.scrape_interval)
    try:
        while not (work / "ready.json").exists():
            time.sleep(0.1)
        url = json.loads((work / "ready.json").read_text())["url"]
        api = httpx.Client(base_url=url, timeout=30)
        prometheus.start()
        prometheus.add_target(f"127.0.0.1:{server.server_address[1]}", namespace=NS)
        t0 = time.perf_counter()
        for name in names:
            assert (
                api.post(f"{GROUP}/namespaces/{NS}/modeldeployments", json=manifest(name)).status_code == 201
            )
            tuned = {"status": {"activeBuild": {"id": "reference", "name": "reference", "profile": SHORT}}}
            api.patch(f"{GROUP}/namespaces/{NS}/modeldeployments/{name}/status", json=tuned,
                      headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
        created_s = time.perf_counter() - t0
        metrics_port, health_port = free_port(), free_port()
        command = [
            sys.executable, "-m", "polymorph.cli", "operator", "--namespace", NS,
            "--prometheus-url", prometheus.url, "--store", str(work / "store"), "--standalone",
            "--metrics-port", str(metrics_port), "--health-port", str(health_port),
            "--drift-interval", args.drift_interval, "--rollout-interval", "30",
        ]  # fmt: skip
        log = work / "operator.log"
        t_start = time.perf_counter()
        operator = subprocess.Popen(command, env={**env, "KUBECONFIG": str(work / "kubeconfig")}, cwd=REPO,
                                    stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
        # Wait until every deployment has its Deployment (the fleet is reconciled).
        while True:
            items = api.get(f"/apis/apps/v1/namespaces/{NS}/deployments").json()["items"]
            if len(items) >= len(names):
                break
            if operator.poll() is not None:
                raise SystemExit(f"the operator exited: {log.read_text()[-2000:]}")
            time.sleep(1)
        reconciled_s = time.perf_counter() - t_start
        memory_reconciled = rss_kib(operator.pid)

        def cycles() -> list[dict[str, Any]]:
            out = []
            for line in log.read_text(errors="replace").splitlines():
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("event") == "drift cycle" and doc.get("deployments") == len(names):
                    out.append(doc)
            return out

        while len(cycles()) < args.cycles + 1:
            time.sleep(1)
        memory = rss_kib(operator.pid)
        done = cycles()
        scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        compilejobs = len(api.get(f"{GROUP}/namespaces/{NS}/compilejobs").json()["items"])
        drift_scores = [
            (api.get(f"{GROUP}/namespaces/{NS}/modeldeployments/{n}").json().get("status", {}).get("drift") or {}).get("score")
            for n in (names[0], names[-1])
        ]  # fmt: skip
    finally:
        if operator is not None:
            operator.send_signal(signal.SIGTERM)
            operator.wait(timeout=30)
        prometheus.close()
        server.shutdown()
        emulator.terminate()
        emulator.wait(timeout=30)
    later = done[1:]
    result = {
        "benchmark": "fleet_drift",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1m_before": round(load_before, 2),
        },
        "deployments": len(names),
        "drifted": len(drifted),
        "queries_per_cycle": sorted({c["queries"] for c in done}),
        "max_queries_per_cycle": max(c["queries"] for c in done),
        "acceptance_max_queries": 6,
        "first_cycle_s": done[0]["seconds"],
        "first_cycle_status_writes": done[0]["written"],
        "first_cycle_compilejobs_opened": done[0]["opened"],
        "steady_cycle_s": {
            "median": statistics.median(c["seconds"] for c in later),
            "max": max(c["seconds"] for c in later),
            "n": len(later),
        },
        "steady_cycle_status_writes": [c["written"] for c in later],
        "compilejobs": compilejobs,
        "drift_score_of_a_drifted_and_a_steady_deployment": drift_scores,
        "operator_memory_mib": {
            "rss_reconciled": round(memory_reconciled["VmRSS"] / 1024, 1),
            "rss_after_cycles": round(memory["VmRSS"] / 1024, 1),
            "peak": round(memory["VmHWM"] / 1024, 1),
        },
        "setup": {
            "create_s": round(created_s, 1),
            "reconcile_all_s": round(reconciled_s, 1),
            "drift_interval_s": float(args.drift_interval),
            "scrape_interval": args.scrape_interval,
        },
        "operator_prometheus_errors": next(
            (
                float(line.split()[-1])
                for line in scrape.splitlines()
                if line.startswith("polymorph_operator_prometheus_errors_total")
            ),
            None,
        ),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    assert result["max_queries_per_cycle"] <= 6, result["queries_per_cycle"]


if __name__ == "__main__":
    main()
