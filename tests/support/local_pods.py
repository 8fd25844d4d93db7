"""How one pod runs as local processes, for the node agent (``support.node_agent``); never part of the product.

``LocalPod`` runs one pod's containers in its own folder, as subprocesses of the real
entrypoints of this checkout (``polymorph`` resolves to the venv's, whatever the image says):

- **Containers**: ``command + args``; init containers run to completion first; an init
  container with ``restartPolicy: Always`` is a native sidecar, started before the main
  containers and stopped once they exit; with ``restartPolicy: Always`` an exited container
  is started again.
- **Translation to a local process**: ``emptyDir`` volumes become temporary folders shared by
  the pod's containers, ``configMap``/``secret`` volumes become folders of files read from the
  API; any argument or env value under a ``mountPath`` is rewritten to the folder. Every port
  the pod names (``containerPort``, ``--port N``) gets a free loopback port, rewritten in
  ``--port N``, ``127.0.0.1:N``/``localhost:N`` and ``--host 0.0.0.0``. Env ``value``,
  ``secretKeyRef``/``configMapKeyRef`` (read from the API when the pod starts, ``optional``
  honoured) and ``fieldRef`` (namespace, name, podIP) are resolved; an Indexed Job's pod gets
  ``JOB_COMPLETION_INDEX``. Nothing of this process's own environment leaks in beyond ``PATH``
  and ``LANG``: credentials reach a pod only through its spec. ``OMP_NUM_THREADS=1`` stands in
  for a CPU limit of one core per container (the machine is small and shared); ``PYTHONPATH``,
  when set, passes through as part of the "image" (where this checkout's packages are).
- **Readiness** is the container's ``readinessProbe.httpGet``, polled every second on the
  mapped port.

The host of a ``LocalPod`` (``PodHost``: the node agent) gives it a work folder, where the
entrypoints are, the ConfigMaps and Secrets it reads, and is told of every change of phase or
readiness. ``FileSD`` is the Prometheus file_sd file of the pods' metrics endpoints;
``Endpoint`` a ready pod a Service routes to.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from support import probes

__all__ = ["Endpoint", "FileSD", "LocalPod", "PodHost", "UnsupportedPod", "free_port"]

GRACE_S = 5.0
PROBE_S = 1.0
"""Seconds between readiness probes of a container (a kubelet's periodSeconds, shortened)."""
_LOOPBACK = re.compile(r"(127\.0\.0\.1|localhost|0\.0\.0\.0):(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PodHost(Protocol):
    """What a ``LocalPod`` needs of the node that runs it."""

    workdir: Path
    bin_dir: Path

    def read(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    def pod_changed(self, pod: LocalPod) -> None: ...


class UnsupportedPod(RuntimeError):
    """The pod uses something that cannot run locally (a PVC, a port that cannot be mapped...)."""


class FileSD:
    """A Prometheus file_sd JSON file: ``host:port`` targets with labels, rewritten atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._targets: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._write()

    def _write(self) -> None:
        groups = [{"targets": [t], "labels": labels} for t, labels in sorted(self._targets.items())]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.path)

    def add(self, address: str, **labels: str) -> None:
        with self._lock:
            self._targets[address] = labels
            self._write()

    def remove(self, address: str) -> None:
        with self._lock:
            if self._targets.pop(address, None) is not None:
                self._write()

    def targets(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return dict(self._targets)


@dataclass(frozen=True)
class Endpoint:
    """A ready pod a Service routes to: its base URL and labels."""

    pod: str
    url: str
    labels: dict[str, str]


@dataclass
class _Container:
    name: str
    argv: list[str]
    env: dict[str, str]
    probe: tuple[str, int] | None
    sidecar: bool = False
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    restarts: int = 0


class LocalPod:
    """One pod of a template, run as local processes in its own folder (see the module docstring)."""

    def __init__(
        self,
        host: PodHost,
        namespace: str,
        name: str,
        template: dict[str, Any],
        owner: dict[str, Any],
        index: int | None = None,
    ) -> None:
        self.host = host
        self.namespace, self.name = namespace, name
        self.template = template
        self.owner = owner
        self.index = index
        self.labels: dict[str, str] = dict(template.get("metadata", {}).get("labels") or {})
        self.annotations: dict[str, str] = dict(template.get("metadata", {}).get("annotations") or {})
        self.spec: dict[str, Any] = template.get("spec") or {}
        self.restart_always = self.spec.get("restartPolicy", "Always") == "Always"
        self.dir = host.workdir / "pods" / f"{namespace}.{name}"
        self.phase = "Pending"
        self.message = ""
        self.ready = False
        self.ports: dict[int, int] = {}
        self.metrics_target: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-{name}", daemon=True)
        self._containers: list[_Container] = []

    # --- translation ---------------------------------------------------------------------

    def _volumes(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for vol in self.spec.get("volumes") or []:
            path = self.dir / "volumes" / vol["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in vol:
                pass
            elif "configMap" in vol:
                cm = self.host.read("configmaps", self.namespace, vol["configMap"]["name"])
                if cm is None and not vol["configMap"].get("optional"):
                    raise UnsupportedPod(f"configMap {vol['configMap']['name']} not found")
                for key, value in ((cm or {}).get("data") or {}).items():
                    (path / key).write_text(value)
            elif "secret" in vol:
                sec = self.host.read("secrets", self.namespace, vol["secret"]["secretName"])
                if sec is None and not vol["secret"].get("optional"):
                    raise UnsupportedPod(f"secret {vol['secret']['secretName']} not found")
                for key, value in ((sec or {}).get("data") or {}).items():
                    (path / key).write_bytes(base64.b64decode(value))
            else:
                kind = next((k for k in vol if k != "name"), "?")
                raise UnsupportedPod(f"volume {vol['name']}: {kind} volumes cannot run locally")
            out[vol["name"]] = path
        return out

    def _map_ports(self, containers: list[dict[str, Any]]) -> None:
        for c in containers:
            for p in c.get("ports") or []:
                self.ports.setdefault(int(p["containerPort"]), free_port())
            words = [*(c.get("command") or []), *(c.get("args") or [])]
            for flag, value in itertools.pairwise(words):
                if flag == "--port" and value.isdigit():
                    self.ports.setdefault(int(value), free_port())

    def _rewrite(self, value: str, mounts: list[tuple[str, Path]]) -> str:
        head, sep, tail = value.partition("=") if value.startswith("--") else ("", "", value)
        for mount_path, host in mounts:
            if tail == mount_path or tail.startswith(mount_path.rstrip("/") + "/"):
                tail = str(host) + tail[len(mount_path.rstrip("/")) :]
                break

        def port(match: re.Match[str]) -> str:
            mapped = self.ports.get(int(match.group(2)))
            return f"127.0.0.1:{mapped}" if mapped else match.group(0)

        return head + sep + _LOOPBACK.sub(port, tail)

    def _env(self, c: dict[str, Any], mounts: list[tuple[str, Path]]) -> dict[str, str]:
        env = {
            "PATH": f"{self.host.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOSTNAME": self.name,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        if os.environ.get("PYTHONPATH"):  # the image is this checkout: where its packages are
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if self.index is not None:
            env["JOB_COMPLETION_INDEX"] = str(self.index)
        for item in c.get("env") or []:
            name = item["name"]
            if "value" in item:
                env[name] = self._rewrite(str(item["value"]), mounts)
                continue
            source = item.get("valueFrom") or {}
            if "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                env[name] = {
                    "metadata.namespace": self.namespace,
                    "metadata.name": self.name,
                    "status.podIP": "127.0.0.1",
                }.get(path, "")
            elif "secretKeyRef" in source or "configMapKeyRef" in source:
                secret = "secretKeyRef" in source
                ref = source["secretKeyRef" if secret else "configMapKeyRef"]
                obj = self.host.read("secrets" if secret else "configmaps", self.namespace, ref["name"])
                data = (obj or {}).get("data") or {}
                if ref["key"] in data:
                    raw = data[ref["key"]]
                    env[name] = base64.b64decode(raw).decode() if secret else raw
                elif not ref.get("optional"):
                    raise UnsupportedPod(f"env {name}: {ref['name']}/{ref['key']} not found")
        return env

    def _container(self, c: dict[str, Any], volumes: dict[str, Path], sidecar: bool) -> _Container:
        mounts = sorted(
            ((m["mountPath"], volumes[m["name"]]) for m in c.get("volumeMounts") or []),
            key=lambda m: -len(m[0]),
        )
        words = [*(c.get("command") or []), *(c.get("args") or [])]
        if not words:
            raise UnsupportedPod(f"container {c['name']} has no command (the image's entrypoint is unknown)")
        argv: list[str] = []
        for i, word in enumerate(words):
            if i > 0 and words[i - 1] == "--port" and word.isdigit() and int(word) in self.ports:
                argv.append(str(self.ports[int(word)]))
            elif i > 0 and words[i - 1] == "--host" and word == "0.0.0.0":
                argv.append("127.0.0.1")
            else:
                argv.append(self._rewrite(word, mounts))
        argv[0] = shutil.which(argv[0], path=str(self.host.bin_dir)) or shutil.which(argv[0]) or argv[0]
        probe = None
        get = (c.get("readinessProbe") or {}).get("httpGet")
        if get:
            port = get["port"]
            if isinstance(port, str):
                port = next(int(p["containerPort"]) for p in c.get("ports") or [] if p.get("name") == port)
            probe = (get.get("path", "/"), self.ports.get(int(port), int(port)))
        return _Container(c["name"], argv, self._env(c, mounts), probe, sidecar)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> LocalPod:
        self._thread.start()
        return self

    def _spawn(self, c: _Container) -> None:
        log = (self.dir / f"{c.name}.log").open("ab")
        c.proc = subprocess.Popen(
            c.argv, env=c.env, cwd=self.dir, stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()

    def _probe(self, c: _Container) -> bool:
        if c.proc is None or c.proc.poll() is not None:
            return False
        if c.probe is None:
            return True
        answer = probes.get(c.probe[1], c.probe[0], timeout=0.5)
        return answer is not None and answer[0] < 400

    def _run(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            volumes = self._volumes()
            inits = list(self.spec.get("initContainers") or [])
            mains = list(self.spec.get("containers") or [])
            self._map_ports(inits + mains)
            for c in inits:
                sidecar = c.get("restartPolicy") == "Always"
                container = self._container(c, volumes, sidecar)
                self._containers.append(container)
                self._spawn(container)
                if not sidecar:
                    assert container.proc is not None
                    while container.proc.poll() is None and not self._stop.wait(0.2):
                        pass
                    if container.proc.poll() != 0:
                        self._finish("Failed", f"init container {c['name']} exited {container.proc.poll()}")
                        return
            main = [self._container(c, volumes, False) for c in mains]
            self._containers += main
            for c in main:
                self._spawn(c)
            self.phase = "Running"
            self.host.pod_changed(self)
            self._watch(main)
        except UnsupportedPod as exc:
            self._finish("Failed", str(exc))
        except Exception as exc:  # a broken translation must show, not hang the rollout
            self._finish("Failed", f"{type(exc).__name__}: {exc}")
        finally:
            self._terminate()

    def _watch(self, main: list[_Container]) -> None:
        next_probe = 0.0
        while not self._stop.is_set():
            for c in self._containers:
                if c.proc is None or c.exit_code is not None:
                    continue
                rc = c.proc.poll()
                if rc is None:
                    continue
                if c.sidecar or self.restart_always:
                    c.restarts += 1  # restartPolicy Always: the kubelet restarts it
                    self._spawn(c)
                else:
                    c.exit_code = rc
            if not self.restart_always and all(c.exit_code is not None for c in main):
                failed = [c for c in main if c.exit_code != 0]
                self._finish(
                    "Failed" if failed else "Succeeded",
                    ", ".join(f"{c.name} exited {c.exit_code}" for c in failed),
                )
                return
            if time.monotonic() >= next_probe:  # a probe's period, at most PROBE_S (tests want speed)
                next_probe = time.monotonic() + PROBE_S
                ready = all(self._probe(c) for c in self._containers if c.sidecar or c in main)
                if ready != self.ready:
                    self.ready = ready
                    self.host.pod_changed(self)
            self._stop.wait(0.25)

    def _finish(self, phase: str, message: str) -> None:
        self.phase, self.message, self.ready = phase, message, False
        self.host.pod_changed(self)

    def _terminate(self) -> None:
        self.ready = False
        running = [c.proc for c in self._containers if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float = GRACE_S + 5) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def log(self, container: str) -> str:
        try:
            return (self.dir / f"{container}.log").read_text(errors="replace")
        except OSError:
            return ""

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{self.ports.get(port, port)}"
