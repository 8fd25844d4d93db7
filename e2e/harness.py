"""What the whole-loop e2e stands on: a control plane, S3, Prometheus, the operator, pods, traffic.

``Fleet`` is a context manager that starts, in this order, and stops in reverse:

- the real Kubernetes control plane (``support.control_plane``: etcd, kube-apiserver with RBAC,
  kube-controller-manager, kube-scheduler) and its admin kubeconfig;
- moto's S3 server (``ThreadedMotoServer``) and a bucket for the artifact store;
- the real Prometheus (Debian's binary), scraping the file_sd targets the node agent keeps;
- the real ``kubectl``: it applies ``crds/``, the namespace and the store Secret (the
  credentials reach pods only through ``secretKeyRef``);
- the real ``helm``: it installs ``charts/polymorph`` watching the namespace, so the chart's
  ServiceAccount, Role and RoleBinding are the operator's. The chart's own pod has a node
  selector no node matches: the operator runs here as a process instead;
- the real operator process, ``polymorph operator`` with short intervals, as the chart's
  ServiceAccount with a token from the TokenRequest API: RBAC decides every call it makes, and
  ``operator_requests()`` reads them from the API server's audit log;
- the node agent (``support.node_agent.NodeAgent``), a kubelet whose containers are local processes of
  the real engine entrypoints; the upstream Deployment, ReplicaSet and Job controllers make the
  pods and the scheduler binds them to it.

With ``E2E_KUBECONFIG`` set, it targets that cluster instead (see e2e/README.md): nothing local
is started; the cluster must already run the operator (the Helm chart), Prometheus and the
store named by ``E2E_PROMETHEUS_URL`` and ``E2E_STORE``, and the traffic reaches pods through
``kubectl port-forward``.

``dawdling_build(store, workdir)`` puts the build the fleet starts on in the store: the reference
build whose entry runs every step three times (on three caches); its extra knob ``dawdle``
(default true) is two of those, so turning it off gives the reference's own step. A campaign from
it always finds a build that clears its gate and the live analysis, on any traffic and however
busy the cores: without that, the first promotion rested on a campaign finding a real CPU win over
the reference beyond noise (1.19-1.56x at the serving shape, and once only 1.15x [1.00, 1.33],
"no improvement", with one core kept busy).

``slowed_build(store, workdir, stable_knobs)`` puts a real, deliberately slower build in the
store: the reference build whose entry runs every prefill and decode twice with its knobs and
once more with the *stable* build's knobs (on three caches), and returns the first result. It
computes the same function, with the reference's knobs and one more, and it is slower than the
stable build whatever knobs a campaign picks for it: it runs the stable build's step and then
more work. So a candidate tuned from it always fails the live analysis. A campaign still finds
a clear win on it, on any traffic: its extra knob ``dawdle`` (default true) runs the stable
build's step four times more, and turning it off removes four of seven steps (a 2.3x margin: with
two, 1.7x, a campaign beside the whole suite once confirmed only 1.28x [0.98, 1.68] and kept
nothing).

Both are built on the reference less its torch.compile values (``support.builds``): on two
shared cores a compiled candidate cost its campaign some 20 s of inductor and g++, and a compiled
build as many seconds again in each pod that served it, while the story told here (drift, a
CompileJob, a canary promoted, a slower one rolled back) holds whichever knobs the search picks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from moto.server import ThreadedMotoServer

from polymorph.contract.store import S3Store, Store, open_store
from support.builds import eager_reference_build
from support.control_plane import ControlPlane
from support.k8s_binaries import helm as helm_binary
from support.k8s_binaries import kubectl as kubectl_binary
from support.local_pods import Endpoint, FileSD, free_port
from support.node_agent import NodeAgent
from support.operator_process import NS, REPO, OperatorProcess
from support.prometheus import PrometheusServer
from support.waiting import wait_for

__all__ = ["NS", "REPO", "Fleet", "OperatorProcess", "dawdling_build", "slowed_build", "wait_for"]

GROUP, VERSION = "polymorph.dev", "v1alpha1"
BUCKET = "polymorph-e2e"
STORE_SECRET = "polymorph-store"
RELEASE = RELEASE_NS = "polymorph"
"""The chart's release and its namespace; the ServiceAccount is the release's name."""
AWS = {"AWS_ACCESS_KEY_ID": "e2e", "AWS_SECRET_ACCESS_KEY": "e2e-secret", "AWS_REGION": "us-east-1"}


_SLOWED = '''"""Entry of a deliberately slower build (an e2e fixture): every step runs ``OWN`` times with
the build's knobs, then once with the knobs ``PLAIN`` (when given), each on its own cache; with
``dawdle = true`` (its default) the last of those steps runs ``DAWDLE`` times more.

The same function as its base (the first cache's result is returned), slower by construction;
``dawdle = false`` removes ``DAWDLE`` of its steps on any traffic, so a campaign from it always
finds a win that clears its gate.
"""

from __future__ import annotations

from typing import Any

from .hotpath import load as load_base

OWN: int = __OWN__
PLAIN: dict[str, Any] | None = __PLAIN__
DAWDLE: int = __DAWDLE__


class SlowedHotPath:
    def __init__(self, model: Any, knobs: dict[str, Any]) -> None:
        knobs = dict(knobs)
        dawdle = knobs.pop("dawdle", True)
        self.inner = load_base(model, knobs)
        last = self.inner if PLAIN is None else load_base(model, PLAIN)
        self.paths = [self.inner] * OWN + ([] if PLAIN is None else [last]) + [last] * (DAWDLE if dawdle else 0)

    def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
        return [p.new_cache(max_batch, max_seq_len) for p in self.paths]

    def prefill(self, cache: Any, slot: int, tokens: Any) -> Any:
        for i in range(len(self.paths) - 1, 0, -1):
            self.paths[i].prefill(cache[i], slot, tokens)
        return self.inner.prefill(cache[0], slot, tokens)

    def decode(self, cache: Any, slots: Any, tokens: Any) -> Any:
        for i in range(len(self.paths) - 1, 0, -1):
            self.paths[i].decode(cache[i], slots, tokens)
        return self.inner.decode(cache[0], slots, tokens)

    def sample(self, logits: Any) -> Any:
        return self.inner.sample(logits)

    def free(self, cache: Any, slot: int) -> None:
        for path, c in zip(self.paths, cache, strict=True):
            path.free(c, slot)

    def close(self) -> None:
        for path in {id(p): p for p in self.paths}.values():
            path.close()


def load(model: Any, knobs: dict[str, Any]) -> SlowedHotPath:
    return SlowedHotPath(model, knobs)
'''


def _put_slowed(store: Store, folder: Path, name: str, description: str, own: int,
                plain: dict[str, Any] | None, dawdle: int) -> str:  # fmt: skip
    """The reference build as ``name``, its entry ``_SLOWED`` with these numbers, in ``store``."""
    shutil.rmtree(folder, ignore_errors=True)
    eager_reference_build(folder)
    toml = (folder / "build.toml").read_text()
    toml = re.sub(r'name = "reference"', f'name = "{name}"', toml, count=1)
    toml = re.sub(r'entry = "hotpath.py"', 'entry = "slowed.py"', toml, count=1)
    toml = re.sub(r'description = ".*"', f"description = {json.dumps(description)}", toml, count=1)
    toml += (
        f"\n[knobs.dawdle]\nchoices = [true, false]\ndefault = true\n"
        f'description = "true: {dawdle} steps more each step (the build\'s own slowness, which a campaign removes)."\n'
    )
    (folder / "build.toml").write_text(toml)
    entry = _SLOWED.replace("__OWN__", str(own)).replace("__DAWDLE__", str(dawdle))
    plain_knobs = None if plain is None else dict(sorted((k, v) for k, v in plain.items() if k != "dawdle"))
    (folder / "slowed.py").write_text(entry.replace("__PLAIN__", repr(plain_knobs)))
    return store.put_build(folder)


def dawdling_build(store: Store, workdir: Path) -> str:
    """Put the dawdling build (see the module docstring), where the fleet starts, in ``store``; its id."""
    return _put_slowed(store, workdir / "dawdling-build", "dawdling",
                       "The reference, every step computed three times (once with dawdle = false).", 1, None, 2)  # fmt: skip


def slowed_build(store: Store, workdir: Path, stable_knobs: dict[str, Any]) -> str:
    """Put the slowed build (see the module docstring) in ``store``, slower than a build of the
    reference with ``stable_knobs``; returns its id."""
    return _put_slowed(store, workdir / "slowed-build", "slowed",
                       "The reference, every step computed twice, and once more with the stable build's knobs.",
                       2, stable_knobs, 4)  # fmt: skip


class Fleet:
    """The running system of the module docstring; ``kubectl(...)``, readers and the pieces as attributes."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="polymorph-e2e-"))
        self.cluster = os.environ.get("E2E_KUBECONFIG")
        self._stack: list[Callable[[], None]] = []
        self.node: NodeAgent | None = None
        self.control_plane: ControlPlane | None = None
        self.operator: OperatorProcess | None = None
        self.prometheus: PrometheusServer | None = None
        self._forwards: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    # --- start / stop ---------------------------------------------------------------------------

    def __enter__(self) -> Fleet:
        try:
            if self.cluster:
                self._remote()
            else:
                self._local()
        except BaseException:
            self.__exit__()
            raise
        self.api = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))
        self.core, self.custom = k8s.CoreV1Api(self.api), k8s.CustomObjectsApi(self.api)
        self.apps = k8s.AppsV1Api(self.api)
        return self

    def __exit__(self, *_: object) -> None:
        while self._stack:
            try:
                self._stack.pop()()
            except Exception as exc:  # keep stopping the rest
                print(f"e2e teardown: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _remote(self) -> None:
        self.kubeconfig = Path(self.cluster or "")
        self.prometheus_url = os.environ["E2E_PROMETHEUS_URL"]
        self.store_uri = os.environ["E2E_STORE"]
        self.store = open_store(self.store_uri)
        self._stack.append(self._close_forwards)

    def _local(self) -> None:
        control_plane = ControlPlane(self.workdir / "control-plane")
        self.control_plane = control_plane.__enter__()
        self._stack.append(lambda: control_plane.__exit__(None, None, None))
        self.kubeconfig = control_plane.kubeconfig

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        self._stack.append(moto.stop)
        host, port = moto.get_host_and_port()
        self.s3_url = f"http://{host}:{port}"
        self.aws = {**AWS, "AWS_ENDPOINT_URL": self.s3_url}
        boto3.client("s3", endpoint_url=self.s3_url, region_name=AWS["AWS_REGION"],
                     aws_access_key_id=AWS["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=AWS["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=BUCKET)  # fmt: skip
        self.store_uri = f"s3://{BUCKET}/store"
        session = boto3.session.Session(
            aws_access_key_id=AWS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=AWS["AWS_SECRET_ACCESS_KEY"]
        )
        self.store = S3Store(
            BUCKET, "store", endpoint_url=self.s3_url, region=AWS["AWS_REGION"], session=session
        )

        targets = FileSD(self.workdir / "targets.json")
        (self.workdir / "prometheus").mkdir(exist_ok=True)
        self.prometheus = PrometheusServer(workdir=self.workdir / "prometheus", targets_file=targets.path)
        self.prometheus.start()
        self._stack.append(self.prometheus.close)
        self.prometheus_url = self.prometheus.url

        self.kubectl("apply", "-f", str(REPO / "crds"))
        self.kubectl("create", "namespace", NS)
        literals = [f"--from-literal={k}={v}" for k, v in self.aws.items()]
        self.kubectl("-n", NS, "create", "secret", "generic", STORE_SECRET, *literals)
        self.kubectl("create", "namespace", RELEASE_NS)
        self.helm(
            "install", RELEASE, str(REPO / "charts" / "polymorph"), "-n", RELEASE_NS,
            "--set-json", f"watchNamespaces={json.dumps([NS])}",
            "--set-json", 'nodeSelector={"polymorph.dev/e2e": "operator-runs-as-a-process"}',
            "--set", f"store.uri={self.store_uri}",
        )  # fmt: skip
        token = self.kubectl("create", "token", RELEASE, "-n", RELEASE_NS, "--duration=6h").strip()
        self.operator_user = f"system:serviceaccount:{RELEASE_NS}:{RELEASE}"
        operator_kubeconfig = control_plane.kubeconfig_with_token(
            self.workdir / "operator.kubeconfig", token, user=self.operator_user, namespace=NS
        )

        self.operator = OperatorProcess(
            operator_kubeconfig,
            self.prometheus_url,
            self.store_uri,
            self.workdir / "operator.log",
            env=self.aws,
            store_secret=STORE_SECRET,
        ).start(timeout=60)
        self._stack.append(self.operator.stop)
        # The operator's own /metrics too (the chart's dashboard and alerts read its series); no
        # namespace target label, so its series keep the namespace of the object they are about.
        targets.add(f"127.0.0.1:{self.operator.metrics_port}", job="polymorph-operator")
        node = "e2e-node"
        self.node = NodeAgent(
            control_plane.node_kubeconfig(node), node, self.workdir, targets=targets
        ).start()
        self._stack.append(self.node.close)

    # --- tools ----------------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """The real kubectl against the fleet's API server; returns stdout."""
        proc = subprocess.run(
            [str(kubectl_binary()), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def helm(self, *args: str) -> str:
        """The real helm against the fleet's API server as the admin; returns stdout."""
        home = self.workdir / "helm"
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
               "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}  # fmt: skip
        proc = subprocess.run(
            [str(helm_binary()), "--kubeconfig", str(self.kubeconfig), *args],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def operator_requests(self) -> list[dict[str, Any]]:
        """Every request the operator made as the chart's ServiceAccount (audit events, in order)."""
        assert self.control_plane is not None, "only a local fleet has the API server's audit log"
        return self.control_plane.audit(self.operator_user)

    def apply(self, manifest: dict[str, Any]) -> str:
        return self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def endpoints(self, service: str) -> Callable[[], list[Endpoint]]:
        """What Service ``service`` routes to: ready pods matching its selector, read from the API."""
        selector: dict[str, str] = {}

        def ready() -> list[Endpoint]:
            if not selector:
                svc = self._raw(self.core.read_namespaced_service, service, NS)
                selector.update(((svc or {}).get("spec") or {}).get("selector") or {})
                if not selector:
                    return []
            if self.node is not None:
                return self.node.endpoints(NS, selector)
            return self._forwarded(selector)

        return ready

    def _forwarded(self, selector: dict[str, str]) -> list[Endpoint]:
        """Remote mode: one ``kubectl port-forward`` per ready pod of the selector."""
        text = ",".join(f"{k}={v}" for k, v in selector.items())
        pods = (self._raw(self.core.list_namespaced_pod, NS, label_selector=text) or {}).get("items", [])
        out = []
        for pod in pods:
            meta, conditions = pod["metadata"], (pod.get("status") or {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if not ready or meta.get("deletionTimestamp"):
                continue
            name = meta["name"]
            if name not in self._forwards:
                port = free_port()
                target = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
                proc = subprocess.Popen(
                    [str(kubectl_binary()), "--kubeconfig", str(self.kubeconfig), "-n", NS, "port-forward",
                     f"pod/{name}", f"{port}:{target}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                self._forwards[name] = (proc, f"http://127.0.0.1:{port}")
            out.append(Endpoint(name, self._forwards[name][1], dict(meta.get("labels") or {})))
        return out

    def _close_forwards(self) -> None:
        for proc, _ in self._forwards.values():
            proc.terminate()

    # --- readers --------------------------------------------------------------------------------

    @staticmethod
    def _raw(fn: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any] | None:
        """A kubernetes-client call's JSON body as plain data; None for a 404."""
        try:
            response = fn(*args, _preload_content=False, **kw)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: dict[str, Any] = json.loads(response.data)
        return result

    def md(self, name: str) -> dict[str, Any] | None:
        return self._raw(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, NS, "modeldeployments", name
        )

    def status(self, name: str) -> dict[str, Any]:
        return (self.md(name) or {}).get("status") or {}

    def compilejobs(self) -> list[dict[str, Any]]:
        got = self._raw(self.custom.list_namespaced_custom_object, GROUP, VERSION, NS, "compilejobs")
        return list((got or {}).get("items", []))

    def compilejob(self, name: str) -> dict[str, Any]:
        return next((cj for cj in self.compilejobs() if cj["metadata"]["name"] == name), {})

    def deployment(self, name: str) -> dict[str, Any] | None:
        return self._raw(self.apps.read_namespaced_deployment, name, NS)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return list(
            (self._raw(self.core.list_namespaced_pod, NS, label_selector=selector) or {}).get("items", [])
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        """Events about object ``name``, in the order they were recorded."""
        items = (self._raw(self.core.list_namespaced_event, NS) or {}).get("items", [])
        about = [
            e
            for e in items  # the operator's: a Deployment's Events (its controller's) share the name
            if e.get("involvedObject", {}).get("name") == name
            and e["involvedObject"].get("apiVersion", "").startswith(f"{GROUP}/")
        ]
        return sorted(about, key=lambda e: int(e["metadata"].get("resourceVersion") or 0))
