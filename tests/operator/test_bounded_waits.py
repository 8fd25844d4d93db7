"""Every call out of the process is bounded (issue 32, class 3): connect and read timeouts and a
bounded number of tries, all read from ``polymorph.contract.timeouts``.

The hostile server is the worst kind: it accepts TCP connections and never answers (a hung
proxy, a half-dead load balancer, a firewall that holds the handshake open). It counts the
connections it accepted, so each row checks the tries as well as the time.

- Clients: the S3 store, Prometheus, the Kubernetes API and Anthropic, each given small limits,
  fail within ``Limits.worst_s`` (plus slack) after exactly ``attempts`` connections, with their
  own error naming the server; each client's default limits are the table's.
- Commands: ``polymorph compile`` and ``polymorph operator`` with an ``s3://`` store, the API
  server or Prometheus at such an endpoint exit 2 in seconds, with one ``error:`` line naming it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import NS, REPO

from polymorph.clients.kube import CONFIGMAPS, KubeClient, KubeError
from polymorph.clients.prometheus import PrometheusQuery, PrometheusUnavailable
from polymorph.compile.agents.claude import ClaudeAgent
from polymorph.contract import timeouts
from polymorph.contract.errors import StoreError
from polymorph.contract.store import S3Store
from support.control_plane import ControlPlane
from support.prometheus import PrometheusServer

SMALL = timeouts.Limits(connect_s=1.0, read_s=0.5, attempts=2)
"""Limits small enough that a test waits a second or two per row."""

SLACK_S = 3.0
"""Back-off between tries, thread start-up and a busy machine, on top of ``Limits.worst_s``."""

COMMAND_S = 20.0
"""How long a command may take to refuse a silent endpoint (imports, then one PROBE try)."""

FAKE_AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


class SilentServer:
    """A loopback TCP server that accepts every connection, reads nothing and never answers."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._held.append(conn)  # held open, never read, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for conn in self._held:
            conn.close()
        self._sock.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


# --- clients ------------------------------------------------------------------------------------


def _s3(server: SilentServer, monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[[], Any], type[Exception]]:
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    store = S3Store("bucket", "pre", endpoint_url=server.url, limits=SMALL)
    return lambda: store.get_bytes("x.json"), StoreError


def _prometheus(server: SilentServer, _: pytest.MonkeyPatch) -> tuple[Callable[[], Any], type[Exception]]:
    query = PrometheusQuery(server.url, limits=SMALL)
    return lambda: query("up"), PrometheusUnavailable


def _kube(server: SilentServer, _: pytest.MonkeyPatch) -> tuple[Callable[[], Any], type[Exception]]:
    import kubernetes

    config = kubernetes.client.Configuration()
    config.host = server.url
    client = KubeClient(config, limits=SMALL)
    return lambda: client.get(CONFIGMAPS, "default", "x"), KubeError


def _anthropic(
    server: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> tuple[Callable[[], Any], type[Exception]]:
    anthropic = pytest.importorskip("anthropic")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    client = ClaudeAgent(api_key="sk-ant-test", limits=SMALL).client()

    def call() -> Any:
        return client.messages.create(
            model="claude-sonnet-4-5", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
        )

    return call, anthropic.APITimeoutError


@pytest.mark.parametrize(
    ("client", "names"),
    [
        (_s3, ["S3 endpoint", "did not answer within 0.5 s (2 tries)", "s3://bucket/pre/x.json"]),
        (_prometheus, ["Prometheus at", "is unreachable"]),
        (_kube, ["Kubernetes API", "unreachable"]),
        (_anthropic, []),
    ],
    ids=["s3", "prometheus", "kube", "anthropic"],
)
def test_a_client_gives_up_on_a_silent_server_after_its_tries(
    client: Callable[[SilentServer, pytest.MonkeyPatch], tuple[Callable[[], Any], type[Exception]]],
    names: list[str],
    silent: SilentServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    call, error = client(silent, monkeypatch)
    began = time.monotonic()
    with pytest.raises(error) as raised:
        call()
    took = time.monotonic() - began
    assert took < SMALL.worst_s + SLACK_S, f"{took:.1f} s against a silent server"
    assert silent.accepted == SMALL.attempts, f"{silent.accepted} connections, {SMALL.attempts} tries allowed"
    message = str(raised.value)
    assert all(part in message for part in names), message
    if names:
        assert silent.url.split("//")[1] in message or "s3://" in message, message
        assert "\n" not in message.strip(), message


def test_every_client_reads_its_limits_from_the_one_table() -> None:
    import kubernetes

    config = kubernetes.client.Configuration()
    config.host = "http://127.0.0.1:1"
    kube = KubeClient(config)
    assert kube._timeout == (timeouts.KUBE.connect_s, timeouts.KUBE.read_s)
    assert config.retries.total == timeouts.KUBE.retries
    assert KubeClient(config, timeout=7)._timeout == (timeouts.KUBE.connect_s, 7)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    store = S3Store("bucket", endpoint_url="http://127.0.0.1:1")
    assert store.limits is timeouts.S3
    assert store._client.meta.config.retries["total_max_attempts"] == timeouts.S3.attempts
    assert store._client.meta.config.read_timeout == timeouts.S3.read_s
    assert ClaudeAgent(api_key="k").limits is timeouts.ANTHROPIC
    prometheus = PrometheusQuery("http://127.0.0.1:1")
    assert prometheus._client._timeout == (timeouts.PROMETHEUS.connect_s, timeouts.PROMETHEUS.read_s)
    for limits in (timeouts.PROBE, timeouts.S3, timeouts.PROMETHEUS, timeouts.KUBE, timeouts.KUBE_WATCH):
        assert limits.worst_s <= 6 * 65, limits  # minutes at most, never unbounded
    assert timeouts.PROBE.worst_s <= 10 and timeouts.PROBE.attempts == 1


def test_kopf_reads_its_limits_from_the_table() -> None:
    from polymorph.handlers.registry import kopf_settings

    class _Config:
        standalone = True
        peering = "polymorph"
        peering_priority = 0
        all_namespaces = False

    class _Ctx:
        config = _Config()

    settings = kopf_settings(_Ctx())  # type: ignore[arg-type]
    assert settings.networking.connect_timeout == timeouts.KUBE_WATCH.connect_s
    assert settings.networking.request_timeout == timeouts.KUBE_WATCH.read_s
    assert len(settings.networking.error_backoffs) == timeouts.KUBE_WATCH.retries
    assert settings.watching.connect_timeout == timeouts.KUBE_WATCH.connect_s
    assert settings.watching.server_timeout == timeouts.WATCH_SERVER_S


# --- commands -----------------------------------------------------------------------------------


def _one_error_line(args: list[str], env: dict[str, str]) -> tuple[str, float]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "polymorph.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=REPO,
        timeout=120,
    )
    took = time.monotonic() - began
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
        done.returncode,
        lines,
    )
    return lines[0], took


def test_compile_with_a_silent_s3_store_fails_in_seconds(silent: SilentServer, tmp_path: Path) -> None:
    line, took = _one_error_line(
        ["compile", "--store", "s3://polymorph-builds/campaigns"],
        {**FAKE_AWS, "POLYMORPH_S3_ENDPOINT": silent.url, "HOME": str(tmp_path)},
    )
    assert took < COMMAND_S, f"{took:.1f} s: {line}"
    assert "--store s3://polymorph-builds/campaigns is not usable" in line and silent.url in line, line
    assert "did not answer within 5 s" in line, line


def _kubeconfig_at(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return path


@pytest.mark.parametrize("silent_one", ["store", "api-server", "prometheus"])
def test_operator_with_a_silent_endpoint_fails_in_seconds(
    silent_one: str,
    silent: SilentServer,
    tmp_path: Path,
    control_plane: ControlPlane,
    prometheus: PrometheusServer,
) -> None:
    kubeconfig, prometheus_url, store = control_plane.kubeconfig, prometheus.url, str(tmp_path)
    env = {**FAKE_AWS, "POLYMORPH_S3_ENDPOINT": silent.url}
    expected = [silent.url]
    if silent_one == "store":
        store = "s3://polymorph-builds/operator"
        expected += [f"--store {store} is not usable", "did not answer within 5 s"]
    elif silent_one == "api-server":
        kubeconfig = _kubeconfig_at(tmp_path / "kubeconfig", silent.url)
        expected += ["the Kubernetes API server"]
    else:
        prometheus_url = silent.url
        expected += ["Prometheus at", "--prometheus-url"]
    args = [
        "operator",
        "--namespace",
        NS,
        "--standalone",
        "--prometheus-url",
        prometheus_url,
        "--store",
        store,
    ]
    line, took = _one_error_line(args, {**env, "KUBECONFIG": str(kubeconfig)})
    assert took < COMMAND_S, f"{took:.1f} s: {line}"
    assert all(part in line for part in expected), (expected, line)
