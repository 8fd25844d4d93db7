"""Running the emulator: a background thread, a separate process, a kubeconfig, a pytest fixture.

``EmulatorThread`` serves one emulator on 127.0.0.1 from its own event loop, so synchronous tests,
kopf's ``KopfRunner`` and subprocesses (kubectl, the operator) can all reach it. ``main`` is the
``python -m support.k8s_emulator`` entry point: it writes a ready file (``{url, port, pid}``) once
serving, optionally a kubeconfig, and preloads YAML manifests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from support import yamls

from .resources import ResourceType
from .server import ConformantKubernetesEmulator

__all__ = ["EmulatorThread", "k8s_emulator", "main", "write_kubeconfig"]


def write_kubeconfig(path: Path, url: str, *, namespace: str = "default") -> Path:
    """Write a kubeconfig whose current context talks plain http to ``url``; returns ``path``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


class EmulatorThread:
    """Serves a ``ConformantKubernetesEmulator`` on 127.0.0.1 from its own event loop in a thread.

    Use it as a context manager; ``url`` is known once entered. ``call(fn)`` runs ``fn(emulator)`` on
    the server's loop, for assertions that must not race with requests.
    """

    def __init__(self, port: int = 0, **options: Any) -> None:
        self.port = port
        self._options = options
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)
        self.emulator = ConformantKubernetesEmulator(**options)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(timeout=30) or self._error is not None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._error!r}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def call(self, fn: Callable[[ConformantKubernetesEmulator], Any]) -> Any:
        """Run ``fn(emulator)`` on the server's event loop and return its result."""
        assert self._loop is not None

        async def run() -> Any:
            return fn(self.emulator)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace=namespace)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to the thread that waits in __enter__
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with (
            self.emulator,
            kmock.Server(self.emulator, port=self.port or None, user_agent="") as server,
        ):
            self.port = server.port
            self._ready.set()
            await self._stop.wait()


@pytest.fixture
def k8s_emulator() -> Iterator[EmulatorThread]:
    """A fresh emulator on a loopback port for one test (``.url``, ``.emulator``, ``.kubeconfig(path)``)."""
    with EmulatorThread() as running:
        yield running


def _preload(running: EmulatorThread, paths: Iterable[Path]) -> None:
    """Create every object of the YAML files (CRDs first), as ``kubectl create -f`` would."""
    documents = [
        d
        for p in paths
        for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])
        for d in yamls.load_all(f.read_text())
        if d
    ]
    documents.sort(key=lambda d: d.get("kind") != "CustomResourceDefinition")
    for document in documents:
        group, _, version = document["apiVersion"].rpartition("/")
        api_version, kind = document["apiVersion"], document["kind"]

        def lookup(emulator: ConformantKubernetesEmulator) -> ResourceType | None:
            return emulator.type_for_kind(api_version, kind)  # noqa: B023 (called right away)

        rtype: ResourceType | None = running.call(lookup)
        if rtype is None:
            raise SystemExit(f"cannot preload {document['kind']} {document['apiVersion']}: unknown kind")
        prefix = f"/apis/{group}/{version}" if group else "/api/v1"
        namespace = (document.get("metadata") or {}).get("namespace") or "default"
        url = (
            f"{running.url}{prefix}/namespaces/{namespace}/{rtype.plural}"
            if rtype.namespaced
            else f"{running.url}{prefix}/{rtype.plural}"
        )
        request = urllib.request.Request(
            url, json.dumps(document).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10):
            pass


def main(argv: list[str] | None = None) -> None:
    """``python -m support.k8s_emulator --port N --ready-file F``: serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m support.k8s_emulator", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--ready-file", type=Path, help="written with {url, port, pid} once serving")
    parser.add_argument("--kubeconfig", type=Path, help="also write a kubeconfig for the server here")
    parser.add_argument(
        "--preload", type=Path, action="append", default=[], help="YAML file or folder to create"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with EmulatorThread(port=args.port) as running:
        _preload(running, args.preload)
        if args.kubeconfig:
            running.kubeconfig(args.kubeconfig)
        if args.ready_file:
            partial = args.ready_file.with_suffix(".partial")
            partial.write_text(json.dumps({"url": running.url, "port": running.port, "pid": os.getpid()}))
            os.replace(partial, args.ready_file)  # readers never see a half-written file
        stop.wait()


if __name__ == "__main__":
    main()
