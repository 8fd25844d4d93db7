"""`polymorph operator` at start-up (issue 17): whatever it cannot use is one line naming it, at once.

Each case runs the real operator process against the real control plane (``support.control_plane``,
the admin's kubeconfig) and a real Prometheus, with one thing broken: the API server, Prometheus
or the store. The process must exit 2 within a few seconds (kopf alone retries for about a
minute) with exactly one ``error:`` line on stderr that names what is wrong, and no traceback.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from operator_harness import NS, REPO

from support.control_plane import ControlPlane
from support.prometheus import PrometheusServer

FAST_S = 15.0
"""How long a refused start-up may take (the process imports kopf and the kubernetes client first)."""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed once the with block ends: nothing listens there


def _kubeconfig_at(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return path


def _start(kubeconfig: Path, prometheus_url: str, store: str, *extra: str) -> tuple[int, list[str], float]:
    args = [sys.executable, "-m", "polymorph.cli", "operator", "--namespace", NS, "--standalone",
            "--prometheus-url", prometheus_url, "--store", store, *extra]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    began = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    took = time.monotonic() - began
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, done.stderr.strip().splitlines(), took


Case = Callable[[Path, ControlPlane, PrometheusServer], tuple[Path, str, str, list[str]]]


def _api_closed(tmp: Path, _: ControlPlane, prom: PrometheusServer) -> tuple[Path, str, str, list[str]]:
    server = f"http://127.0.0.1:{_closed_port()}"
    kubeconfig = _kubeconfig_at(tmp / "kubeconfig", server)
    return kubeconfig, prom.url, str(tmp), ["the Kubernetes API server", server, "is unreachable"]


def _api_not_resolvable(
    tmp: Path, _: ControlPlane, prom: PrometheusServer
) -> tuple[Path, str, str, list[str]]:
    server = "http://no-such-host.invalid:6443"
    kubeconfig = _kubeconfig_at(tmp / "kubeconfig", server)
    return kubeconfig, prom.url, str(tmp), ["the Kubernetes API server", server, "is unreachable"]


def _prometheus_closed(tmp: Path, api: ControlPlane, _: PrometheusServer) -> tuple[Path, str, str, list[str]]:
    url = f"http://127.0.0.1:{_closed_port()}"
    return api.kubeconfig, url, str(tmp), [f"Prometheus at {url} is unreachable"]


def _not_prometheus(tmp: Path, api: ControlPlane, _: PrometheusServer) -> tuple[Path, str, str, list[str]]:
    # A plain file server answers HTTP, but not as Prometheus does.
    url = _file_server(tmp)
    return api.kubeconfig, url, str(tmp), [url, "does not answer as Prometheus does"]


def _file_server(folder: Path) -> str:
    """An HTTP server of ``folder`` on a loopback port, for the rest of the test process."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def _store_read_only(
    tmp: Path, api: ControlPlane, prom: PrometheusServer
) -> tuple[Path, str, str, list[str]]:
    if os.geteuid() == 0:  # root writes through file modes; /proc refuses everyone
        store = Path("/proc/polymorph-store")
    else:
        store = tmp / "read-only"
        store.mkdir()
        store.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return api.kubeconfig, prom.url, str(store), [f"--store {store} is not writable"]


def _store_is_a_file(
    tmp: Path, api: ControlPlane, prom: PrometheusServer
) -> tuple[Path, str, str, list[str]]:
    store = tmp / "a-file"
    store.write_text("not a folder")
    return api.kubeconfig, prom.url, str(store), [f"--store {store} is not writable"]


def _store_relative(tmp: Path, api: ControlPlane, prom: PrometheusServer) -> tuple[Path, str, str, list[str]]:
    return api.kubeconfig, prom.url, "builds", ["--store 'builds' is a relative path"]


@pytest.mark.parametrize(
    "case",
    [
        _api_closed,
        _api_not_resolvable,
        _prometheus_closed,
        _not_prometheus,
        _store_read_only,
        _store_is_a_file,
        _store_relative,
    ],
)
def test_start_up_refuses_what_it_cannot_use_in_one_line(
    case: Case, tmp_path: Path, prometheus: PrometheusServer, control_plane: ControlPlane
) -> None:
    _check(case, tmp_path, control_plane, prometheus)


def _check(case: Case, tmp: Path, api: ControlPlane, prom: PrometheusServer) -> None:
    kubeconfig, prometheus_url, store, expected = case(tmp, api, prom)
    code, lines, took = _start(kubeconfig, prometheus_url, store)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, lines)
    assert all(part in lines[0] for part in expected), (expected, lines[0])
    assert took < FAST_S, f"start-up took {took:.1f} s to refuse: {lines[0]}"


def test_a_taken_metrics_port_is_named_by_its_flag(
    tmp_path: Path, prometheus: PrometheusServer, control_plane: ControlPlane
) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines, _ = _start(
            control_plane.kubeconfig, prometheus.url, str(tmp_path), "--metrics-port", str(port)
        )
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: --metrics-port {port}: cannot serve /metrics there"), lines[0]
