"""A pod executor for the e2e: the emulator's kubelet and workload controllers, as local processes.

Never part of the product. It stands in for what the Kubernetes emulator does not run: the
Deployment and Job controllers and the kubelet. Every ``interval`` it lists the Deployments and
Jobs of the watched namespaces (through the kubernetes client, as a controller's sync loop would)
and makes local processes match them:

- **Pods** run the containers' ``command + args`` as subprocesses of the real entrypoints of
  this checkout (``polymorph`` resolves to the venv's, whatever the image says). Init containers
  run to completion first; an init container with ``restartPolicy: Always`` is a native sidecar,
  started before the main containers and stopped once they exit.
- **Translation to a local process**, per pod: ``emptyDir`` volumes become temporary folders shared
  by the pod's containers, ``configMap``/``secret`` volumes become folders of files read from the
  API; any argument or env value under a ``mountPath`` is rewritten to the folder. Every port
  the pod names (``containerPort``, ``--port N``) gets a free loopback port, rewritten in
  ``--port N``, ``127.0.0.1:N``/``localhost:N`` and ``--host 0.0.0.0``. Env ``value``,
  ``secretKeyRef``/``configMapKeyRef`` (read from the API when the pod starts, ``optional``
  honoured) and ``fieldRef`` (namespace, name, podIP) are resolved; Indexed Job pods get
  ``JOB_COMPLETION_INDEX``. Nothing of this process's own environment leaks in beyond ``PATH``
  and ``LANG``: credentials reach a pod only through its spec. ``OMP_NUM_THREADS=1`` stands in
  for a CPU limit of one core per container (the machine is small and shared); ``PYTHONPATH``,
  when set, passes through as part of the "image" (where this checkout's packages are).
- **Readiness** is the container's ``readinessProbe.httpGet``, polled every second on the mapped port.
- **Deployments**: ``spec.replicas`` pods of the current template (a hash of it); on a template
  change new pods start and old ones stop only once the new ones are ready (``maxUnavailable:
  0``); processes that exit are restarted (``restartPolicy: Always``). Status written back:
  ``observedGeneration``, ``replicas``, ``updatedReplicas``, ``readyReplicas``,
  ``availableReplicas``.
- **Jobs** (``NonIndexed`` or ``Indexed``): up to ``parallelism`` pods until ``completions``
  succeed, retries up to ``backoffLimit``, ``activeDeadlineSeconds``; status ``active``,
  ``succeeded``, ``failed``, ``completedIndexes``, ``startTime``, ``completionTime`` and the
  ``Complete``/``Failed`` conditions.
- **Pod objects** are created in the API with their phase, Ready condition and podIP, so
  ``kubectl get pods`` shows them; they are deleted with the process.
- Objects that disappear (deleted, or garbage-collected through owner references) have their
  processes stopped (SIGTERM, then SIGKILL after a grace period).
- **Prometheus**: every pod annotated ``prometheus.io/scrape: "true"`` is a file_sd target at its
  mapped ``prometheus.io/port``, labelled with ``namespace`` and ``pod`` (as a PodMonitor's
  relabelling would), kept in the file the Prometheus server watches.

``endpoints(namespace, selector)`` gives the ready pods a Service with that selector would route
to; the traffic generator sends its requests there. It knows nothing about Polymorph's resources.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

__all__ = ["Endpoint", "FileSD", "LocalPod", "PodExecutor", "UnsupportedPod", "free_port"]

MERGE = "application/merge-patch+json"
GRACE_S = 5.0
PROBE_S = 1.0
"""Seconds between readiness probes of a container (a kubelet's periodSeconds, shortened)."""
_LOOPBACK = re.compile(r"(127\.0\.0\.1|localhost|0\.0\.0\.0):(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class UnsupportedPod(RuntimeError):
    """The pod uses something this executor cannot run locally (a PVC, a port it cannot map...)."""


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
        executor: PodExecutor,
        namespace: str,
        name: str,
        template: dict[str, Any],
        owner: dict[str, Any],
        index: int | None = None,
    ) -> None:
        self.executor = executor
        self.namespace, self.name = namespace, name
        self.template = template
        self.owner = owner
        self.index = index
        self.labels: dict[str, str] = dict(template.get("metadata", {}).get("labels") or {})
        self.annotations: dict[str, str] = dict(template.get("metadata", {}).get("annotations") or {})
        self.spec: dict[str, Any] = template.get("spec") or {}
        self.restart_always = self.spec.get("restartPolicy", "Always") == "Always"
        self.dir = executor.workdir / "pods" / f"{namespace}.{name}"
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
                cm = self.executor.read("configmaps", self.namespace, vol["configMap"]["name"])
                if cm is None and not vol["configMap"].get("optional"):
                    raise UnsupportedPod(f"configMap {vol['configMap']['name']} not found")
                for key, value in ((cm or {}).get("data") or {}).items():
                    (path / key).write_text(value)
            elif "secret" in vol:
                sec = self.executor.read("secrets", self.namespace, vol["secret"]["secretName"])
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
            "PATH": f"{self.executor.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
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
                obj = self.executor.read("secrets" if secret else "configmaps", self.namespace, ref["name"])
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
        argv[0] = shutil.which(argv[0], path=str(self.executor.bin_dir)) or shutil.which(argv[0]) or argv[0]
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
        try:
            r = httpx.get(f"http://127.0.0.1:{c.probe[1]}{c.probe[0]}", timeout=0.5)
        except httpx.HTTPError:
            return False
        return r.status_code < 400

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
            self.executor.pod_changed(self)
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
                    self.executor.pod_changed(self)
            self._stop.wait(0.25)

    def _finish(self, phase: str, message: str) -> None:
        self.phase, self.message, self.ready = phase, message, False
        self.executor.pod_changed(self)

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


@dataclass
class _Workload:
    kind: str
    uid: str
    pods: list[LocalPod] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    started: str | None = None
    started_mono: float = 0.0
    succeeded: set[int] = field(default_factory=set)
    failed: int = 0
    finished: bool = False


def _template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _indexes(done: set[int]) -> str:
    """``completedIndexes`` as the Job controller writes it: ``0-2,5``."""
    out: list[str] = []
    for i in sorted(done):
        if out and "-" not in out[-1] and int(out[-1]) == i - 1:
            out[-1] = f"{out[-1]}-{i}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


class PodExecutor:
    """Runs the pods of the Deployments and Jobs in ``namespaces`` as local processes."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: list[str],
        workdir: Path,
        targets: FileSD,
        interval: float = 0.5,
        bin_dir: Path | None = None,
    ) -> None:
        self.api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        self.core, self.apps, self.batch = (
            k8s.CoreV1Api(self.api),
            k8s.AppsV1Api(self.api),
            k8s.BatchV1Api(self.api),
        )
        self.namespaces = namespaces
        self.workdir = workdir
        self.targets = targets
        self.interval = interval
        self.bin_dir = bin_dir or Path(sys.executable).parent
        self._workloads: dict[str, _Workload] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-executor", daemon=True)
        self.errors: list[str] = []
        self.started_pods: list[str] = []

    # --- API --------------------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        raw = fn(*args, _preload_content=False, **kw)
        return json.loads(raw.data)

    def read(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        fn = {"configmaps": self.core.read_namespaced_config_map, "secrets": self.core.read_namespaced_secret}
        try:
            result: dict[str, Any] = self._call(fn[resource], name, namespace)
            return result
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pod_changed(self, _pod: LocalPod) -> None:
        self._changed.set()

    # --- loop --------------------------------------------------------------------------------

    def start(self) -> PodExecutor:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout=10)
        pods = [p for w in self._workloads.values() for p in w.pods]
        for pod in pods:
            pod.stop()
        for pod in pods:
            pod.join()
            self._forget_pod(pod)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # the API can blip; the next sync repairs, but keep the reason
                self.errors.append(f"{type(exc).__name__}: {exc}")
                del self.errors[:-20]
            self._changed.wait(self.interval)
            self._changed.clear()

    def sync(self) -> None:
        """One pass: make local pods and API status match every Deployment and Job."""
        seen: set[str] = set()
        for ns in self.namespaces:
            for d in self._call(self.apps.list_namespaced_deployment, ns)["items"]:
                seen.add(d["metadata"]["uid"])
                self._deployment(d)
            for j in self._call(self.batch.list_namespaced_job, ns)["items"]:
                seen.add(j["metadata"]["uid"])
                self._job(j)
        with self._lock:
            gone = [uid for uid in self._workloads if uid not in seen]
        for uid in gone:
            work = self._workloads.pop(uid)
            for pod in work.pods:
                self._stop_pod(pod)

    def _new_pod(
        self, obj: dict[str, Any], work: _Workload, suffix: str, index: int | None, **labels: str
    ) -> LocalPod:
        meta = obj["metadata"]
        owner = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
                 "controller": True}  # fmt: skip
        name = f"{meta['name']}-{suffix}-{secrets.token_hex(3)}"
        template = obj["spec"]["template"]
        pod = LocalPod(self, meta["namespace"], name, template, owner, index)
        pod.labels.update(labels)
        work.pods.append(pod)
        self.started_pods.append(name)
        self._create_pod_object(pod)
        return pod.start()

    def _stop_pod(self, pod: LocalPod) -> None:
        pod.stop()

        def reap() -> None:
            pod.join()
            self._forget_pod(pod)

        threading.Thread(target=reap, daemon=True).start()
        if pod.metrics_target:
            self.targets.remove(pod.metrics_target)
            pod.metrics_target = None

    def _forget_pod(self, pod: LocalPod) -> None:
        if pod.metrics_target:
            self.targets.remove(pod.metrics_target)
            pod.metrics_target = None
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(pod.name, pod.namespace, _preload_content=False)

    # --- pods in the API -------------------------------------------------------------------

    def _create_pod_object(self, pod: LocalPod) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": pod.labels,
                         "annotations": pod.annotations, "ownerReferences": [pod.owner]},
            "spec": {**pod.spec, "nodeName": "local"},
        }  # fmt: skip
        try:
            # The client sends a plain dict as the JSON it is (a V1Pod would drop unknown fields).
            self.core.create_namespaced_pod(pod.namespace, body, _preload_content=False)  # type: ignore[arg-type]
        except ApiException as exc:
            self.errors.append(f"pod {pod.name}: {exc.status} {exc.reason}")

    def _pod_status(self, pod: LocalPod) -> None:
        status = {
            "phase": pod.phase,
            "podIP": "127.0.0.1",
            "message": pod.message or None,
            "conditions": [{"type": "Ready", "status": "True" if pod.ready else "False"}],
        }
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_pod_status(
                pod.name, pod.namespace, {"status": status}, _content_type=MERGE, _preload_content=False
            )

    def _scrape(self, pod: LocalPod) -> None:
        """Keep the pod's metrics endpoint in file_sd while it runs."""
        want = pod.annotations.get("prometheus.io/scrape") == "true" and pod.phase == "Running"
        if want and pod.metrics_target is None:
            port = pod.ports.get(int(pod.annotations.get("prometheus.io/port", "0")))
            if port:
                pod.metrics_target = f"127.0.0.1:{port}"
                self.targets.add(pod.metrics_target, namespace=pod.namespace, pod=pod.name)
        elif not want and pod.metrics_target is not None:
            self.targets.remove(pod.metrics_target)
            pod.metrics_target = None

    # --- Deployments -------------------------------------------------------------------------

    def _deployment(self, d: dict[str, Any]) -> None:
        meta, spec = d["metadata"], d["spec"]
        with self._lock:
            work = self._workloads.setdefault(meta["uid"], _Workload("Deployment", meta["uid"]))
        want = int(spec.get("replicas", 1) or 0)
        current_hash = _template_hash(spec["template"])
        for pod in [p for p in work.pods if p.done]:  # failed to start: replaced below
            self.errors.append(f"pod {pod.name}: {pod.message}")
            self._stop_pod(pod)
        work.pods = [p for p in work.pods if not p._stop.is_set()]
        current = [p for p in work.pods if p.labels.get("pod-template-hash") == current_hash]
        old = [p for p in work.pods if p not in current]
        while len(current) < want:
            current.append(self._new_pod(d, work, current_hash, None, **{"pod-template-hash": current_hash}))
        for pod in sorted(current, key=lambda p: p.ready)[: max(0, len(current) - want)]:
            self._stop_pod(pod)
            current.remove(pod)
        ready_new = sum(p.ready for p in current)
        # maxUnavailable 0: an old pod goes only when a new one is ready to take its place.
        keep_old = max(0, want - ready_new)
        for pod in sorted(old, key=lambda p: p.ready)[: max(0, len(old) - keep_old)]:
            self._stop_pod(pod)
        work.pods = [p for p in work.pods if not p._stop.is_set()]
        for pod in work.pods:
            self._scrape(pod)
            self._sync_pod_object(pod)
        ready = sum(p.ready for p in work.pods)
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(work.pods),
            "updatedReplicas": len(current),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, want - ready),
        }
        self._write_status(self.apps.patch_namespaced_deployment_status, d, work, status)

    def _sync_pod_object(self, pod: LocalPod) -> None:
        seen = (pod.phase, pod.ready)
        if getattr(pod, "_reported", None) != seen:
            pod._reported = seen  # type: ignore[attr-defined]
            self._pod_status(pod)

    def _write_status(self, fn: Any, obj: dict[str, Any], work: _Workload, status: dict[str, Any]) -> None:
        if status == work.status and all((obj.get("status") or {}).get(k) == v for k, v in status.items()):
            return
        meta = obj["metadata"]
        try:
            fn(
                meta["name"],
                meta["namespace"],
                {"status": status},
                _content_type=MERGE,
                _preload_content=False,
            )
            work.status = status
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- Jobs -------------------------------------------------------------------------------

    def _job(self, j: dict[str, Any]) -> None:
        meta, spec = j["metadata"], j["spec"]
        with self._lock:
            work = self._workloads.setdefault(meta["uid"], _Workload("Job", meta["uid"]))
        if work.finished:
            return
        completions = int(spec.get("completions") or 1)
        parallelism = int(spec.get("parallelism") or 1)
        indexed = spec.get("completionMode") == "Indexed"
        if work.started is None:
            work.started, work.started_mono = _now(), time.monotonic()
        for pod in [p for p in work.pods if p.done]:
            if pod.phase == "Succeeded":
                work.succeeded.add(pod.index if indexed and pod.index is not None else len(work.succeeded))
            else:
                work.failed += 1
            work.pods.remove(pod)
            self._sync_pod_object(pod)
            self._stop_pod(pod)
        condition: dict[str, Any] | None = None
        deadline = spec.get("activeDeadlineSeconds")
        if len(work.succeeded) >= completions:
            condition = {"type": "Complete", "status": "True", "lastTransitionTime": _now()}
        elif work.failed > int(spec.get("backoffLimit", 6)):
            condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                         "message": "Job has reached the specified backoff limit", "lastTransitionTime": _now()}  # fmt: skip
        elif deadline and time.monotonic() - work.started_mono > float(deadline):
            condition = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                         "message": "Job was active longer than specified deadline", "lastTransitionTime": _now()}  # fmt: skip
        elif not spec.get("suspend"):
            slots = max(0, parallelism - len(work.pods))
            if indexed:
                running = {p.index for p in work.pods}
                todo = [i for i in range(completions) if i not in work.succeeded and i not in running]
                for i in todo[:slots]:
                    self._new_pod(j, work, str(i), i)
            else:
                for _ in range(min(slots, completions - len(work.succeeded) - len(work.pods))):
                    self._new_pod(j, work, "x", None)
        for pod in work.pods:
            self._sync_pod_object(pod)
        if condition is not None:
            for pod in work.pods:
                self._stop_pod(pod)
            work.pods = []
            work.finished = True
        status: dict[str, Any] = {
            "startTime": work.started,
            "active": len(work.pods),
            "ready": sum(p.ready for p in work.pods),
            "succeeded": len(work.succeeded),
            "failed": work.failed,
        }
        if indexed:
            status["completedIndexes"] = _indexes(work.succeeded)
        if condition is not None:
            status["conditions"] = [condition]
            if condition["type"] == "Complete":
                status["completionTime"] = _now()
        self._write_status(self.batch.patch_namespaced_job_status, j, work, status)

    # --- Services -----------------------------------------------------------------------------

    def endpoints(self, namespace: str, selector: dict[str, str]) -> list[Endpoint]:
        """Ready pods whose labels match ``selector``, with the URL of their first container port."""
        with self._lock:
            pods = [p for w in self._workloads.values() for p in w.pods]
        out = []
        for pod in pods:
            if pod.namespace != namespace or not pod.ready or pod._stop.is_set():
                continue
            if any(pod.labels.get(k) != v for k, v in selector.items()):
                continue
            ports = [p for c in pod.spec.get("containers") or [] for p in c.get("ports") or []]
            if ports:
                out.append(Endpoint(pod.name, pod.url(int(ports[0]["containerPort"])), dict(pod.labels)))
        return out

    def pods(self) -> list[LocalPod]:
        with self._lock:
            return [p for w in self._workloads.values() for p in w.pods]
