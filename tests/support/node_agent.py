"""A node agent for the real control plane: a kubelet whose containers are local processes.

Never part of the product. A real control plane (``support.control_plane``) has the workload
controllers (Deployment, ReplicaSet, Job, the garbage collector) and lacks only the kubelet;
``NodeAgent`` is that kubelet:

- It registers a Node (``Ready``, a loopback address, room for many pods) as the kubelet's
  identity ``system:node:<name>``, so the Node authorizer lets it read only the pods bound to
  that node and the Secrets, ConfigMaps and service accounts those pods reference. It renews
  the node's Lease in ``kube-node-lease`` every ``LEASE_RENEW_S``, as a kubelet's heartbeat:
  the node lifecycle controller lifts the ``not-ready`` taint, and the scheduler places pods.
- Every ``interval`` it lists the pods the scheduler bound to it and runs each as local
  processes with ``support.local_pods.LocalPod``, its translation: ``command`` + ``args`` of the
  real entrypoints, env (``value``, ``secretKeyRef``, ``configMapKeyRef``, ``fieldRef`` to the
  pod's name, namespace, uid, node, labels and annotations: the Job controller's
  ``JOB_COMPLETION_INDEX`` reads the index annotation), ``emptyDir``, ``configMap`` and
  ``secret`` volumes as folders, ports mapped to free loopback ports, readiness probes, restarts
  under ``restartPolicy: Always`` (with a back-off, as a kubelet's CrashLoopBackOff). The
  projected service-account volume that the ServiceAccount admission plugin adds gets what a
  kubelet writes there: a token bound to the pod from the TokenRequest API, the cluster CA
  (``kube-root-ca.crt``) and the namespace.
- It reports each pod's status through the API: ``phase``, the ``PodScheduled``,
  ``Initialized``, ``ContainersReady`` and ``Ready`` conditions, ``containerStatuses`` (state,
  readiness, restart count, exit code), ``podIP``, ``hostIP`` and ``startTime``.
- A pod marked for deletion has its processes sent SIGTERM, and SIGKILL once its
  ``deletionGracePeriodSeconds`` run out; then the agent deletes it for good (grace 0), as a
  kubelet confirms a deletion. A pod that is gone from the API has its processes stopped.
- Each running pod annotated ``prometheus.io/scrape`` is a file_sd target at its mapped
  ``prometheus.io/port``, labelled with ``namespace`` and ``pod`` (as a PodMonitor's
  relabelling would), in the file the Prometheus server watches.

``endpoints(namespace, selector)`` gives the ready pods a Service with that selector routes to.
``stand_in(container)``, when given, is the command each container runs instead of its own
(with its env, volumes, ports and probe as translated): the operator's integration tests run a
readiness endpoint there, since their engines' metrics come from elsewhere.
It knows nothing about Polymorph's resources.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from support.local_pods import Endpoint, FileSD, LocalPod, UnsupportedPod

__all__ = ["NodeAgent", "NodePod"]

_MERGE = {"Content-Type": "application/merge-patch+json"}
LEASE_RENEW_S = 10.0
"""Seconds between renewals of the node's Lease (a kubelet renews every 10 s, for 40 s)."""
READ_RETRY_S = 30.0
"""How long ``NodeAgent.read`` asks again for a Secret or ConfigMap the API server answers "later" for."""
_INDEX = "batch.kubernetes.io/job-completion-index"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _client(kubeconfig: Path, folder: Path) -> httpx.Client:
    """An httpx client with the current context's server, CA and credentials of ``kubeconfig``."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    folder.mkdir(parents=True, exist_ok=True)
    ca = folder / "ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    context = ssl.create_default_context(cafile=str(ca))
    headers = {}
    if "client-certificate-data" in user:
        (folder / "client.crt").write_bytes(base64.b64decode(user["client-certificate-data"]))
        (folder / "client.key").write_bytes(base64.b64decode(user["client-key-data"]))
        context.load_cert_chain(str(folder / "client.crt"), str(folder / "client.key"))
    if "token" in user:
        headers["Authorization"] = f"Bearer {user['token']}"
    return httpx.Client(base_url=cluster["server"], verify=context, headers=headers, timeout=30)


class NodePod(LocalPod):
    """A pod bound to the agent's node: ``LocalPod`` plus what a kubelet reads from the pod object."""

    def __init__(self, agent: NodeAgent, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        index = (meta.get("annotations") or {}).get(_INDEX)
        template = {"metadata": meta, "spec": pod["spec"]}
        super().__init__(agent, meta["namespace"], meta["name"], template, {}, int(index) if index else None)
        self.agent = agent
        self.uid: str = meta["uid"]
        self.grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        self.started_at = _now()
        self.deleting = False
        self.reported: dict[str, Any] | None = None
        self._fields = {
            "metadata.uid": self.uid,
            "spec.nodeName": agent.name,
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName") or "default",
            "status.hostIP": "127.0.0.1",
        }
        self.transitions: dict[str, tuple[str, str]] = {}

    # --- volumes a kubelet fills from the API ---------------------------------------------

    def _volumes(self) -> dict[str, Path]:
        volumes = list(self.spec.get("volumes") or [])
        self.spec = {**self.spec, "volumes": [v for v in volumes if "projected" not in v]}
        try:
            out = super()._volumes()
        finally:
            self.spec = {**self.spec, "volumes": volumes}
        for vol in volumes:
            if "projected" in vol:
                out[vol["name"]] = self._projected(vol)
        return out

    def _projected(self, vol: dict[str, Any]) -> Path:
        path = self.dir / "volumes" / vol["name"]
        path.mkdir(parents=True, exist_ok=True)
        for source in vol["projected"].get("sources") or []:
            if "serviceAccountToken" in source:
                spec = source["serviceAccountToken"]
                account = self.spec.get("serviceAccountName") or "default"
                request = {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {
                        "audiences": [spec["audience"]] if spec.get("audience") else [],
                        "expirationSeconds": int(spec.get("expirationSeconds") or 3600),
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": self.name,
                            "uid": self.uid,
                        },
                    },
                }
                got = self.agent.call(
                    "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request
                )
                (path / spec["path"]).write_text(got["status"]["token"])
            for kind in ("configMap", "secret"):
                if kind not in source:
                    continue
                ref = source[kind]
                obj = self.agent.read(
                    "configmaps" if kind == "configMap" else "secrets", self.namespace, ref["name"]
                )
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise UnsupportedPod(f"volume {vol['name']}: {kind} {ref['name']} not found")
                data = obj.get("data") or {}
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    if item["key"] in data:
                        raw = data[item["key"]]
                        (path / item["path"]).write_bytes(
                            base64.b64decode(raw) if kind == "secret" else raw.encode()
                        )
            for item in (source.get("downwardAPI") or {}).get("items") or []:
                field = (item.get("fieldRef") or {}).get("fieldPath", "")
                value = {"metadata.namespace": self.namespace, "metadata.name": self.name}.get(field, "")
                (path / item["path"]).write_text(value)
        return path

    # --- env a kubelet resolves from the pod object -----------------------------------------

    def _env(self, c: dict[str, Any], mounts: list[tuple[str, Path]]) -> dict[str, str]:
        env = super()._env(c, mounts)
        for item in c.get("env") or []:
            path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            keyed = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
            if keyed:  # e.g. the Job controller's JOB_COMPLETION_INDEX from the index annotation
                source = self.annotations if keyed[1] == "annotations" else self.labels
                env[item["name"]] = source.get(keyed[2], "")
            elif path in self._fields:
                env[item["name"]] = self._fields[path]
        return env

    def _container(self, c: dict[str, Any], volumes: dict[str, Path], sidecar: bool) -> Any:
        made = super()._container(c, volumes, sidecar)
        if self.agent.stand_in is not None:
            made.argv = self.agent.stand_in(made)
        return made

    # --- restarts --------------------------------------------------------------------------

    def _spawn(self, c: Any) -> None:
        """Start a container; a restart waits first, doubling up to 10 s (a kubelet's back-off)."""
        if c.restarts and self._stop.wait(min(10.0, 0.25 * 2 ** min(c.restarts, 6))):
            return  # deleted while backing off: _terminate finds the exited process
        super()._spawn(c)

    # --- stopping ---------------------------------------------------------------------------

    def _terminate(self) -> None:
        """SIGTERM every process, SIGKILL what still runs once the grace period is over."""
        self.ready = False
        running = [c.proc for c in self._containers if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for proc in running:
            try:
                proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def join(self, timeout: float | None = None) -> None:
        super().join(self.grace + 5 if timeout is None else timeout)

    # --- status -----------------------------------------------------------------------------

    def _container_status(self, spec: dict[str, Any], ready: bool) -> dict[str, Any]:
        c = next((c for c in self._containers if c.name == spec["name"]), None)
        state: dict[str, Any]
        rc = (
            None
            if c is None or c.proc is None
            else (c.exit_code if c.exit_code is not None else c.proc.poll())
        )
        if c is None or c.proc is None:
            state = {"waiting": {"reason": "ContainerCreating"}}
        elif rc is None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            state = {"terminated": {"exitCode": rc, "reason": "Completed" if rc == 0 else "Error"}}
        return {
            "name": spec["name"],
            "image": spec.get("image", ""),
            "imageID": "",
            "ready": ready and "running" in state,
            "started": "running" in state,
            "restartCount": c.restarts if c is not None else 0,
            "state": state,
        }

    def status(self) -> dict[str, Any]:
        """The pod's status as a kubelet reports it."""
        inits = self.spec.get("initContainers") or []
        mains = self.spec.get("containers") or []
        flags = {
            "PodScheduled": True,
            "Initialized": self.phase != "Pending",  # LocalPod runs the main containers after the inits
            "ContainersReady": self.ready,
            "Ready": self.ready,
        }
        conditions = []
        for kind, value in flags.items():
            text = "True" if value else "False"
            if self.transitions.get(kind, ("", ""))[0] != text:
                self.transitions[kind] = (text, _now())
            conditions.append({"type": kind, "status": text, "lastTransitionTime": self.transitions[kind][1]})
        status: dict[str, Any] = {
            "phase": self.phase,
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.started_at,
            "containerStatuses": [self._container_status(c, self.ready) for c in mains],
        }
        if inits:
            status["initContainerStatuses"] = [
                self._container_status(c, c.get("restartPolicy") == "Always" and self.ready) for c in inits
            ]
        if self.message:
            status["message"] = self.message
        return status


class NodeAgent:
    """A registered Node whose pods run as local processes (see the module docstring)."""

    def __init__(
        self,
        kubeconfig: Path,
        name: str,
        workdir: Path,
        *,
        targets: FileSD | None = None,
        interval: float = 0.5,
        bin_dir: Path | None = None,
        stand_in: Callable[[Any], list[str]] | None = None,
    ) -> None:
        self.name = name
        self.stand_in = stand_in
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bin_dir = bin_dir or Path(sys.executable).parent
        self.targets = targets
        self.interval = interval
        self._tls = tempfile.TemporaryDirectory(prefix="node-agent-", dir=workdir)
        self.http = _client(kubeconfig, Path(self._tls.name))
        self._pods: dict[str, NodePod] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"node-{name}", daemon=True)
        self.errors: list[str] = []
        self.started_pods: list[str] = []
        self._renewed = 0.0

    # --- API --------------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        response = self.http.request(method, path, json=body, **kw)
        if response.status_code >= 400:
            raise httpx.HTTPStatusError(
                f"{method} {path}: {response.status_code} {response.text[:300]}",
                request=response.request,
                response=response,
            )
        return response.json() if response.content else None

    def read(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap or Secret a pod references; None when it does not exist.

        As a kubelet retries a volume's set-up, an answer that says "later" (429, such as "storage
        is (re)initializing" while the API server's watch cache re-lists, or a 5xx) is asked again
        after its Retry-After, for up to ``READ_RETRY_S``; a pod failed on it once, its secret
        there all along."""
        deadline = time.monotonic() + READ_RETRY_S
        while True:
            response = self.http.get(f"/api/v1/namespaces/{namespace}/{resource}/{name}")
            later = response.status_code == 429 or response.status_code >= 500
            if not later or time.monotonic() >= deadline:
                break
            time.sleep(min(float(response.headers.get("Retry-After") or 1), 5.0))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def pod_changed(self, _pod: LocalPod) -> None:
        self._changed.set()

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> NodeAgent:
        self._register()
        self._renew_lease()
        self._thread.start()
        return self

    def _renew_lease(self) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": now}
        response = self.http.patch(path, json={"spec": spec}, headers=_MERGE)
        if response.status_code == 404:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": self.name, "namespace": "kube-node-lease"}, "spec": spec}  # fmt: skip
            self.call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
        elif response.status_code >= 400:
            raise RuntimeError(f"lease of node {self.name}: {response.status_code} {response.text[:200]}")
        self._renewed = time.monotonic()

    def _register(self) -> None:
        room = {"cpu": "64", "memory": "256Gi", "pods": "250", "ephemeral-storage": "100Gi"}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "status": {
                "capacity": room,
                "allocatable": room,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "the node agent runs pods as local processes",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
                "nodeInfo": {
                    "kubeletVersion": "v0.0.0-node-agent",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "local://processes",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                    "kernelVersion": "",
                    "osImage": "",
                    "kubeProxyVersion": "",
                },
            },
        }
        response = self.http.post("/api/v1/nodes", json=node)
        if response.status_code == 409:
            self.call(
                "PATCH", f"/api/v1/nodes/{self.name}/status", {"status": node["status"]}, headers=_MERGE
            )
        elif response.status_code >= 400:
            raise RuntimeError(
                f"node {self.name} could not register: {response.status_code} {response.text[:300]}"
            )

    def close(self) -> None:
        """Stop the agent and its pods. The Node stays registered, as a kubelet cannot delete it:
        ``ControlPlane.remove_node`` removes it, and the pods still bound to it."""
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout=15)
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            pod.grace = min(pod.grace, 5)
            pod.stop()
        for pod in pods:
            pod.join()
            self._unscrape(pod)
        self.http.close()
        self._tls.cleanup()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if time.monotonic() - self._renewed >= LEASE_RENEW_S:
                    self._renew_lease()
                self.sync()
            except Exception as exc:  # the API can blip; the next sync repairs, but keep the reason
                self.errors.append(f"{type(exc).__name__}: {exc}")
                del self.errors[:-20]
            self._changed.wait(self.interval)
            self._changed.clear()

    def sync(self) -> None:
        """One pass: run the pods bound here, stop the deleted ones, report every status."""
        listed = self.call("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.name}"})
        seen: set[str] = set()
        for pod in listed["items"]:
            meta = pod["metadata"]
            uid = meta["uid"]
            seen.add(uid)
            with self._lock:
                local = self._pods.get(uid)
            if local is None:
                if meta.get("deletionTimestamp"):
                    self._confirm_deletion(meta)
                elif (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    local = NodePod(self, pod)
                    with self._lock:
                        self._pods[uid] = local
                    self.started_pods.append(local.name)
                    local.start()
                continue
            if meta.get("deletionTimestamp") and not local.deleting:
                local.deleting = True
                local.grace = float(meta.get("deletionGracePeriodSeconds", local.grace))
                threading.Thread(target=self._delete, args=(local, meta), daemon=True).start()
            if not local.deleting:
                self._report(local)
        with self._lock:
            gone = [p for uid, p in self._pods.items() if uid not in seen]
        for pod in gone:  # deleted for good, or force-deleted: nothing to report any more
            with self._lock:
                self._pods.pop(pod.uid, None)
            pod.stop()
            self._unscrape(pod)

    def _report(self, pod: NodePod) -> None:
        self._scrape(pod)
        status = pod.status()
        if status != pod.reported:
            self.call(
                "PATCH", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status", {"status": status},
                headers=_MERGE,
            )  # fmt: skip
            pod.reported = status

    def _delete(self, pod: NodePod, meta: dict[str, Any]) -> None:
        """Stop the processes within the grace period, then remove the pod object. Once they are
        stopped the pod is no longer this agent's: a confirmation the API did not take (a dropped
        connection) is made again by the next sync, which confirms any deleted pod it does not run."""
        pod.stop()
        pod.join()
        self._unscrape(pod)
        with self._lock:
            self._pods.pop(pod.uid, None)
        try:
            self._confirm_deletion(meta)
        except httpx.TransportError as exc:
            self.errors.append(f"delete pod {meta['name']}: {type(exc).__name__}: {exc}")

    def _confirm_deletion(self, meta: dict[str, Any]) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}  # fmt: skip
        response = self.http.request(
            "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", content=json.dumps(body)
        )
        if response.status_code not in (200, 404, 409):
            self.errors.append(f"delete pod {meta['name']}: {response.status_code} {response.text[:200]}")

    # --- Prometheus ---------------------------------------------------------------------------

    def _scrape(self, pod: NodePod) -> None:
        if self.targets is None:
            return
        want = pod.annotations.get("prometheus.io/scrape") == "true" and pod.phase == "Running"
        if want and pod.metrics_target is None:
            port = pod.ports.get(int(pod.annotations.get("prometheus.io/port", "0")))
            if port:
                pod.metrics_target = f"127.0.0.1:{port}"
                self.targets.add(pod.metrics_target, namespace=pod.namespace, pod=pod.name)
        elif not want:
            self._unscrape(pod)

    def _unscrape(self, pod: NodePod) -> None:
        if self.targets is not None and pod.metrics_target is not None:
            self.targets.remove(pod.metrics_target)
        pod.metrics_target = None

    # --- Services -----------------------------------------------------------------------------

    def endpoints(self, namespace: str, selector: dict[str, str]) -> list[Endpoint]:
        """Ready pods whose labels match ``selector``, with the URL of their first container port."""
        out = []
        for pod in self.pods():
            if pod.namespace != namespace or not pod.ready or pod.deleting or pod._stop.is_set():
                continue
            if any(pod.labels.get(k) != v for k, v in selector.items()):
                continue
            ports = [p for c in pod.spec.get("containers") or [] for p in c.get("ports") or []]
            if ports:
                out.append(Endpoint(pod.name, pod.url(int(ports[0]["containerPort"])), dict(pod.labels)))
        return out

    def pods(self) -> list[NodePod]:
        with self._lock:
            return list(self._pods.values())
