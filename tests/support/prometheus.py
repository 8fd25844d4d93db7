"""A real Prometheus server for tests: the Debian ``prometheus`` binary (2.42) on a loopback port.

``PrometheusServer`` writes a temporary config whose one scrape job reads its targets from a
``file_sd`` JSON file, so a test adds and removes scrape targets (each with labels such as
``namespace``) while the server runs. It scrapes every ``scrape_interval`` (1 s by default),
keeps its TSDB in a temporary folder, and can be stopped and started again on the same port
and data (a test's "Prometheus goes down, then comes back"). ``start`` waits for ``/-/ready``.

- ``prometheus`` fixture (function): a started server, stopped at the end of the test.
- ``python -m support.prometheus --port N [--targets FILE] [--ready-file F]``: the same as a
  process (for the e2e), until SIGTERM. ``--targets`` is the file_sd file to watch.

It knows nothing about Polymorph; it only runs Prometheus.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["BINARY", "PrometheusServer", "free_port", "main", "prometheus"]

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """One Prometheus process with a file_sd scrape job; targets are ``host:port`` plus labels."""

    def __init__(
        self,
        port: int | None = None,
        scrape_interval: str = "1s",
        workdir: Path | None = None,
        targets_file: Path | None = None,
    ) -> None:
        if not Path(BINARY).exists():
            raise RuntimeError(f"no prometheus binary at {BINARY}; install Debian's prometheus package")
        self.port = port or free_port()
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="polymorph-prometheus-"))
        self.targets_file = targets_file or self.workdir / "targets.json"
        self.scrape_interval = scrape_interval
        self._targets: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = self.workdir / "prometheus.log"
        if not self.targets_file.exists():
            self._write_targets()
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [
                {
                    "job_name": "engines",
                    "scrape_interval": scrape_interval,
                    "scrape_timeout": scrape_interval,
                    "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}],
                }
            ],
        }
        (self.workdir / "prometheus.yml").write_text(json.dumps(config, indent=1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- targets -----------------------------------------------------------------------------

    def _write_targets(self) -> None:
        groups = [{"targets": [t], "labels": labels} for t, labels in sorted(self._targets.items())]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets_file)  # atomic, so Prometheus never reads half a file

    def add_target(self, address: str, **labels: str) -> None:
        """Scrape ``address`` (``host:port``), attaching ``labels`` (e.g. namespace) to its series."""
        with self._lock:
            self._targets[address] = dict(labels)
            self._write_targets()

    def remove_target(self, address: str) -> None:
        with self._lock:
            self._targets.pop(address, None)
            self._write_targets()

    # --- process -----------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        if self._proc is not None and self._proc.poll() is None:
            return self
        args = [
            BINARY,
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]
        log = self._log.open("ab")
        self._proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus did not become ready in {timeout:g} s: {self.log_tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- reading -----------------------------------------------------------------------------

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's ``data.result`` (for test assertions)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            result: list[dict[str, Any]] = json.loads(response.read())["data"]["result"]
            return result

    def wait_for_series(self, promql: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Poll ``promql`` until it returns at least one series (scrapes take an interval or two)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(0.2)
        raise TimeoutError(f"no series for {promql} after {timeout:g} s")

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


@pytest.fixture
def prometheus() -> Iterator[PrometheusServer]:
    """A started Prometheus scraping the targets the test adds; stopped and removed afterwards."""
    with PrometheusServer() as server:
        yield server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m support.prometheus", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="listen port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--targets", type=Path, help="the file_sd JSON file to watch (default: in the workdir)"
    )
    parser.add_argument("--workdir", type=Path, help="config and TSDB folder (default: a temporary one)")
    parser.add_argument("--scrape-interval", default="1s")
    parser.add_argument("--ready-file", type=Path, help="written with the URL once Prometheus is ready")
    args = parser.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    server = PrometheusServer(args.port or None, args.scrape_interval, args.workdir, args.targets)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    try:
        if args.ready_file is not None:
            args.ready_file.write_text(server.url + "\n")
        print(server.url, flush=True)
        while not stop.wait(0.5):
            if not server.running:
                raise SystemExit(f"prometheus exited: {server.log_tail()}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
