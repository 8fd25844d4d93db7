#!/usr/bin/env python
"""Fleet drift at scale: N ModelDeployments, one operator, a handful of PromQL queries per cycle.

Sets up, all on loopback: the real Kubernetes control plane (``support.control_plane``: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler as ``make control-plane`` built them,
with the CRDs; or the cluster ``--kubeconfig`` names, the CRDs created there when missing), the
real Prometheus (Debian's 2.42) scraping one metrics endpoint that exposes the engine's metric
families (``polymorph_prompt_tokens``, ``polymorph_generation_tokens``,
``polymorph_requests_in_flight``) for every deployment, and the real operator process
(``polymorph operator``, as the admin). Each deployment has an active build tuned for a
short-prompt profile; ``--drifted`` of them receive long prompts (drift 1) and open a
CompileJob, the others serve the profile they were tuned for (drift 0). No node joins the
control plane: the Deployments' pods stay Pending, as the CompileJobs' are.

Measured, from the operator's own /metrics and its JSON log: PromQL queries per drift cycle
(``polymorph_operator_drift_cycle_queries``; the acceptance is at most 6), each cycle's wall
time, status writes per cycle and CompileJobs opened; the operator's resident memory
(VmRSS and its peak VmHWM from /proc) once the fleet is reconciled.

The fleet lives in ``--namespace``, which must hold no ModelDeployment yet; on a cluster of
``--kubeconfig`` it is left there (kopf's finalizers hold it until an operator removes them).
The whole run is bounded by ``--timeout``; the servers it started stop on the way out.

Run: ``.venv/bin/python bench/fleet_drift.py --deployments 500 --out bench/results/fleet-500.json``
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import ssl
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

from polymorph.clients.kube import load_configuration  # noqa: E402
from polymorph_engine.serving.metrics import TOKEN_BUCKETS  # noqa: E402
from support import yamls  # noqa: E402
from support.control_plane import ControlPlane, ControlPlaneUnavailable  # noqa: E402
from support.prometheus import PrometheusServer, free_port  # noqa: E402

NS = "fleet"
GROUP = "/apis/polymorph.dev/v1alpha1"
WINDOW, MIN_REQUESTS = "1m", 10  # each deployment's recompile window and the requests it needs in it
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


def manifest(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": "tiny"},
            "hardware": {"accelerator": "cpu"},
            "replicas": 2,
            "recompile": {"window": WINDOW, "minRequests": MIN_REQUESTS, "cooldown": "6h"},
        },
    }


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def api_client(kubeconfig: Path) -> httpx.Client:
    """An httpx client as the kubeconfig's current context says (server, CA, certificate or token),
    read by the kubernetes package as the operator reads it."""
    config = load_configuration(str(kubeconfig))
    context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
    if not config.verify_ssl:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    token = config.api_key.get("authorization") or config.api_key.get("BearerToken")
    headers = {"Authorization": token if token.startswith("Bearer ") else f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=config.host, verify=context, headers=headers, timeout=30)


def prepare(api: httpx.Client, namespace: str) -> None:
    """The CRDs (created where missing, then Established) and ``namespace``, which must hold no fleet yet."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    names = []
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for document in yamls.load_all(path.read_text()):
            names.append(document["metadata"]["name"])
            created = api.post(crds, json=document)
            if created.status_code not in (201, 409):
                raise SystemExit(f"{path.name} was refused: {created.status_code} {created.text[:300]}")

    def established(name: str) -> bool:
        conditions = (api.get(f"{crds}/{name}").json().get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    for name in names:
        wait(f"CRD {name} to be Established", lambda n=name: established(n), timeout=60)
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    created = api.post("/api/v1/namespaces", json=body)
    if created.status_code not in (201, 409):
        raise SystemExit(f"namespace {namespace} was refused: {created.status_code} {created.text[:300]}")
    served: list[list[Any]] = []

    def listed() -> bool:  # a CRD just Established can still answer 404 for a moment
        answer = api.get(f"{GROUP}/namespaces/{namespace}/modeldeployments")
        if answer.status_code == 200:
            served.append(answer.json()["items"])
        return bool(served)

    wait("the API server to serve ModelDeployments", listed, timeout=60)
    if served[-1]:
        raise SystemExit(
            f"namespace {namespace} already holds ModelDeployments; name another with --namespace"
        )


def wait(what: str, ready: Any, timeout: float, every: float = 0.2) -> Any:
    """Poll ``ready`` until it returns something truthy; one line naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = ready()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {timeout:.0f} s waiting for {what} (see --timeout)")
        time.sleep(every)


def positive_seconds(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise SystemExit(f"{flag} must be a positive number of seconds; got {text!r}")
    return value


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
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="run on the cluster this kubeconfig names, as its identity (default: start a control plane)",
    )
    parser.add_argument("--namespace", default=NS, help=f"where the fleet is created (default: {NS})")
    parser.add_argument("--timeout", default="3600", help="seconds the whole run may take (default: 3600)")
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
    timeout = positive_seconds("--timeout", args.timeout)
    if args.kubeconfig is not None and not args.kubeconfig.is_file():
        raise SystemExit(f"--kubeconfig {args.kubeconfig}: no such file")
    # SIGTERM (a test's timeout, a Ctrl-C from a supervisor) still stops what this started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as stack:
        result = run(args, stack, time.monotonic() + timeout)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    assert result["max_queries_per_cycle"] <= 6, result["queries_per_cycle"]


def run(args: argparse.Namespace, stack: contextlib.ExitStack, deadline: float) -> dict[str, Any]:
    ns = args.namespace

    def remaining() -> float:
        return max(deadline - time.monotonic(), 0.0)

    load_before = os.getloadavg()[0]
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="polymorph-fleet-")))
    names = [f"md-{i:04d}" for i in range(args.deployments)]
    drifted = set(names[: args.drifted])
    t_cluster = time.perf_counter()
    if args.kubeconfig is None:
        try:
            cluster = ControlPlane(work / "control-plane", crds=sorted((REPO / "crds").glob("*.yaml")))
        except ControlPlaneUnavailable as error:
            raise SystemExit(str(error)) from None
        kubeconfig = stack.enter_context(cluster).kubeconfig
    else:
        kubeconfig = args.kubeconfig.resolve()
    api = stack.enter_context(api_client(kubeconfig))
    prepare(api, ns)
    cluster_s = time.perf_counter() - t_cluster
    server_version = api.get("/version").json()
    fleet = Fleet(names, drifted)
    server = serve_fleet(fleet)
    stack.callback(server.shutdown)
    prometheus = stack.enter_context(PrometheusServer(scrape_interval=args.scrape_interval))
    prometheus.add_target(f"127.0.0.1:{server.server_address[1]}", namespace=ns)
    prometheus_version = prometheus_build(prometheus.url)
    t0 = time.perf_counter()
    for name in names:
        created = api.post(f"{GROUP}/namespaces/{ns}/modeldeployments", json=manifest(name, ns))
        if created.status_code != 201:
            raise SystemExit(
                f"ModelDeployment {name} was refused: {created.status_code} {created.text[:300]}"
            )
        tuned = {"status": {"activeBuild": {"id": "reference", "name": "reference", "profile": SHORT}}}
        patched = api.patch(f"{GROUP}/namespaces/{ns}/modeldeployments/{name}/status", json=tuned,
                            headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
        if patched.status_code != 200:
            raise SystemExit(f"the status of {name} was refused: {patched.status_code} {patched.text[:300]}")
    created_s = time.perf_counter() - t0
    # The operator starts once Prometheus holds enough traffic of every deployment for a decision
    # (minRequests in the window), so that its first cycle decides for the whole fleet.
    t_data = time.perf_counter()
    enough = (
        f'count(sum by (model_deployment) (increase(polymorph_prompt_tokens_count{{namespace="{ns}"}}'
        f"[{WINDOW}])) >= {MIN_REQUESTS})"
    )

    def traffic() -> bool:
        result = prometheus.query(enough)
        return bool(result) and int(float(result[0]["value"][1])) >= len(names)

    wait("Prometheus to hold every deployment's traffic", traffic, timeout=remaining(), every=1)
    data_s = time.perf_counter() - t_data
    metrics_port, health_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "polymorph.cli", "operator", "--namespace", ns,
        "--prometheus-url", prometheus.url, "--store", str(work / "store"), "--standalone",
        "--metrics-port", str(metrics_port), "--health-port", str(health_port),
        "--drift-interval", f"{args.drift_interval}s", "--rollout-interval", "30s",
    ]  # fmt: skip
    log = work / "operator.log"
    t_start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests"), "KUBECONFIG": str(kubeconfig)}
    with log.open("wb") as out:
        operator = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    stack.callback(stop, operator)

    def alive() -> None:
        if operator.poll() is not None:
            raise SystemExit(f"the operator exited: {log.read_text(errors='replace')[-2000:]}")

    # Wait until every deployment has its Deployment (the fleet is reconciled).
    def reconciled() -> bool:
        alive()
        items = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments").json()["items"]
        return len(items) >= len(names)

    wait("the operator to make every Deployment", reconciled, timeout=remaining(), every=1)
    reconciled_s = time.perf_counter() - t_start
    memory_reconciled = rss_kib(operator.pid)

    def cycles() -> list[dict[str, Any]]:
        alive()
        out = []
        for line in log.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == "drift cycle" and doc.get("deployments") == len(names):
                out.append(doc)
        return out

    wait(f"{args.cycles + 1} drift cycles", lambda: len(cycles()) > args.cycles, timeout=remaining(), every=1)
    memory = rss_kib(operator.pid)
    done = cycles()
    scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    compilejobs = len(api.get(f"{GROUP}/namespaces/{ns}/compilejobs").json()["items"])
    drift_scores = [
        (api.get(f"{GROUP}/namespaces/{ns}/modeldeployments/{n}").json().get("status", {}).get("drift") or {}).get("score")
        for n in (names[0], names[-1])
    ]  # fmt: skip
    later = done[1:]
    return {
        "benchmark": "fleet_drift",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1m_before": round(load_before, 2),
        },
        "versions": {
            "polymorph_commit": git_commit(),
            "kubernetes": server_version.get("gitVersion"),
            "control_plane": "--kubeconfig" if args.kubeconfig else "started here (support.control_plane)",
            "prometheus": prometheus_version,
            "kopf": importlib.metadata.version("kopf"),
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
            "control_plane_s": round(cluster_s, 1),
            "create_s": round(created_s, 1),
            "traffic_wait_s": round(data_s, 1),
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


def stop(operator: subprocess.Popen[bytes]) -> None:
    if operator.poll() is None:
        operator.send_signal(signal.SIGTERM)
    try:
        operator.wait(timeout=30)
    except subprocess.TimeoutExpired:
        operator.kill()
        operator.wait()


def prometheus_build(url: str) -> str | None:
    try:
        return str(httpx.get(f"{url}/api/v1/status/buildinfo", timeout=5).json()["data"]["version"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def git_commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None


if __name__ == "__main__":
    main()
