"""What the whole-loop e2e stands on: a control plane, S3, Prometheus, the operator, pods, traffic.

``Fleet`` is a context manager that starts, in this order, and stops in reverse:

- the conformant Kubernetes emulator as its own process (``python -m support.k8s_emulator``)
  with a kubeconfig; only the control plane is emulated;
- moto's S3 server (``ThreadedMotoServer``) and a bucket for the artifact store;
- the real Prometheus (Debian's binary), scraping the file_sd targets the executor keeps;
- the real ``kubectl``: it applies ``crds/``, the namespace and the store Secret (the
  credentials reach pods only through ``secretKeyRef``);
- the real operator process, ``polymorph operator`` with short intervals;
- the pod executor (``executor.PodExecutor``), which runs Deployments' and Jobs' pods as
  local processes of the real engine entrypoints.

With ``E2E_KUBECONFIG`` set, it targets that cluster instead (see e2e/README.md): nothing local
is started; the cluster must already run the operator (the Helm chart), Prometheus and the
store named by ``E2E_PROMETHEUS_URL`` and ``E2E_STORE``, and the traffic reaches pods through
``kubectl port-forward``.

``slowed_build(store, workdir, stable_knobs)`` puts a real, deliberately slower build in the
store: the reference build whose entry runs every prefill and decode twice with its knobs and
once more with the *stable* build's knobs (on three caches), and returns the first result. It
computes the same function, with the same knob space, and it is slower than the stable build
whatever knobs a campaign picks for it: it runs the stable build's step and then more work. So a
candidate tuned from it always fails the live analysis. A campaign still finds a clear win on
it: the two steps with its own knobs are most of its time, so tuning them pays about what it
pays on the reference (at the defaults, 2 reference steps and 1 stable step, against 2 tuned
and 1 stable).
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

from executor import Endpoint, FileSD, PodExecutor, free_port
from polymorph.store import S3Store, Store, open_store
from support.k8s_binaries import kubectl as kubectl_binary
from support.operator_process import NS, REPO, OperatorProcess
from support.prometheus import PrometheusServer
from support.waiting import wait_for

__all__ = ["NS", "REPO", "Fleet", "OperatorProcess", "slowed_build", "wait_for"]

GROUP, VERSION = "polymorph.dev", "v1alpha1"
BUCKET = "polymorph-e2e"
STORE_SECRET = "polymorph-store"
REFERENCE = REPO / "engine_image" / "polymorph_engine" / "builds" / "reference"
AWS = {"AWS_ACCESS_KEY_ID": "e2e", "AWS_SECRET_ACCESS_KEY": "e2e-secret", "AWS_REGION": "us-east-1"}


_TWICE = '''"""Entry of the *slowed* build (an e2e fixture): every step runs twice with the build's
knobs and once more with the stable build's knobs (``STABLE``), on three caches.

The same function as its base (the first cache's result is returned), with the same knobs, and
slower than the stable build whatever the knobs: a real build that is slower by construction,
for the rollback path.
"""

from __future__ import annotations

from typing import Any

from .hotpath import load as load_base

STABLE: dict[str, Any] = __STABLE__


class TwiceHotPath:
    def __init__(self, model: Any, knobs: dict[str, Any]) -> None:
        self.inner = load_base(model, knobs)
        self.plain = load_base(model, STABLE)

    def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
        return (
            self.inner.new_cache(max_batch, max_seq_len),
            self.inner.new_cache(max_batch, max_seq_len),
            self.plain.new_cache(max_batch, max_seq_len),
        )

    def prefill(self, cache: Any, slot: int, tokens: Any) -> Any:
        self.plain.prefill(cache[2], slot, tokens)
        self.inner.prefill(cache[1], slot, tokens)
        return self.inner.prefill(cache[0], slot, tokens)

    def decode(self, cache: Any, slots: Any, tokens: Any) -> Any:
        self.plain.decode(cache[2], slots, tokens)
        self.inner.decode(cache[1], slots, tokens)
        return self.inner.decode(cache[0], slots, tokens)

    def sample(self, logits: Any) -> Any:
        return self.inner.sample(logits)

    def free(self, cache: Any, slot: int) -> None:
        self.inner.free(cache[0], slot)
        self.inner.free(cache[1], slot)
        self.plain.free(cache[2], slot)

    def close(self) -> None:
        self.inner.close()
        self.plain.close()


def load(model: Any, knobs: dict[str, Any]) -> TwiceHotPath:
    return TwiceHotPath(model, knobs)
'''


def slowed_build(store: Store, workdir: Path, stable_knobs: dict[str, Any]) -> str:
    """Put the slowed build (see the module docstring) in ``store``, slower than a build of the
    reference with ``stable_knobs``; returns its id."""
    build = workdir / "slowed-build"
    shutil.copytree(REFERENCE, build, ignore=shutil.ignore_patterns("__pycache__"))
    toml = (build / "build.toml").read_text()
    toml = re.sub(r'name = "reference"', 'name = "slowed"', toml, count=1)
    toml = re.sub(r'entry = "hotpath.py"', 'entry = "twice.py"', toml, count=1)
    toml = re.sub(
        r'description = ".*"',
        'description = "The reference, every step computed twice, and once more with the stable build\'s knobs."',
        toml,
        count=1,
    )
    (build / "build.toml").write_text(toml)
    (build / "twice.py").write_text(_TWICE.replace("__STABLE__", repr(dict(sorted(stable_knobs.items())))))
    return store.put_build(build)


class Fleet:
    """The running system of the module docstring; ``kubectl(...)``, readers and the pieces as attributes."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="polymorph-e2e-"))
        self.cluster = os.environ.get("E2E_KUBECONFIG")
        self._stack: list[Callable[[], None]] = []
        self.executor: PodExecutor | None = None
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
        env_py = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "e2e")])}
        ready, self.kubeconfig = self.workdir / "emulator.json", self.workdir / "kubeconfig"
        log = (self.workdir / "emulator.log").open("ab")
        emulator = subprocess.Popen(
            [sys.executable, "-m", "support.k8s_emulator", "--port", "0", "--ready-file", str(ready),
             "--kubeconfig", str(self.kubeconfig)],
            env=env_py, stdout=log, stderr=log, cwd=REPO,
        )  # fmt: skip
        log.close()

        def stop_emulator() -> None:
            emulator.terminate()
            emulator.wait(timeout=15)

        self._stack.append(stop_emulator)
        wait_for("the Kubernetes emulator", lambda: ready.exists() or emulator.poll() is not None, 60, 0.1)
        assert emulator.poll() is None, (self.workdir / "emulator.log").read_text()

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

        self.operator = OperatorProcess(
            self.kubeconfig,
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
        self.executor = PodExecutor(self.kubeconfig, [NS], self.workdir, targets).start()
        self._stack.append(self.executor.close)

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
            if self.executor is not None:
                return self.executor.endpoints(NS, selector)
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
        about = [e for e in items if e.get("involvedObject", {}).get("name") == name]
        return sorted(about, key=lambda e: int(e["metadata"].get("resourceVersion") or 0))
