"""A real Kubernetes control plane for tests, as envtest starts one: etcd and the upstream servers.

``ControlPlane`` starts, in a temporary folder and on free loopback ports, the binaries that
``support.control_plane_build`` built (``make control-plane``):

- ``etcd``, one member, plain http on loopback, ``--unsafe-no-fsync`` (test data is disposable);
- ``kube-apiserver`` over TLS with certificates made here (a CA, its serving certificate, one
  client certificate per identity), service-account signing keys (the TokenRequest API works),
  ``--authorization-mode=Node,RBAC`` and the default admission plugins: RBAC decides every call
  of every identity but the admin;
- ``kube-controller-manager`` with the controllers a workload needs (deployments, replica sets,
  jobs, the garbage collector, namespaces, service accounts and their tokens, the root CA
  ConfigMap, role aggregation, node lifecycle), each under its own service account, as on a
  cluster; the node lifecycle controller lifts a new node's ``not-ready`` taint once it reports
  Ready, and taints it again when its Lease is not renewed;
- ``kube-scheduler``, which binds pods to the nodes that a node agent registers (none is here:
  a pod stays Pending until one is).

``crds`` (YAML files) are created, and Established, before the controller manager starts: its
garbage collector then knows their objects from the start (a CRD made later it discovers within
30 s, so an owner deleted before that keeps its dependents that long).

The admin identity is the client certificate ``CN=polymorph-admin, O=system:masters``;
``kubeconfig`` points at it. ``kubeconfig_with_token`` writes one for a bearer token (a
service account's, from the TokenRequest API). ``api()`` is an httpx client as the admin.
``node_kubeconfig(name)`` is a kubelet's identity for a node agent; ``user_kubeconfig(name)``
another admin, of its own name. ``audit(username)`` reads
the API server's audit log (``AUDIT_POLICY``): each request of that user, with the RBAC
authorizer's decision. ``timings`` holds the
seconds each server took to be ready. Leaving the context stops the
servers, last started first, and removes the folder unless it was given. A missing binary
fails at once with one sentence (``ControlPlaneUnavailable``).

- ``control_plane`` fixture (session, in tests/conftest.py): one started control plane, with
  the project's CRDs, for every test of a worker process that asks for it.
- ``python -m support.control_plane [--kubeconfig K]``: the same until SIGTERM or SIGINT,
  printing the timings.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import json
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from support import probes, yamls
from support.control_plane_build import VERSION, ControlPlaneUnavailable, binaries
from support.prometheus import free_port

__all__ = ["ADMIN", "ControlPlane", "ControlPlaneUnavailable", "write_kubeconfig"]

ADMIN = "polymorph-admin"
# Every request of the admin, of service accounts outside kube-system and of nodes, at the
# Metadata level (who, verb, resource, the authorizer's decision, the status code); none of the
# control plane's own components. A watch is logged when its response starts (ResponseStarted):
# one still open at the end of a test has no ResponseComplete yet.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "users": ["system:kube-controller-manager", "system:kube-scheduler", "system:apiserver"],
        },
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata"},
    ],
}
SERVICE_CIDR = "10.0.0.0/24"  # an address range for ClusterIPs; nothing is routed there
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "node-lifecycle-controller",
)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class _Certificates:
    """A CA and the certificates it signs, written as PEM files into ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "polymorph-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.ca_pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self.ca_file = folder / "ca.crt"
        self.ca_file.write_bytes(self.ca_pem)

    def issue(
        self, stem: str, common_name: str, *, groups: tuple[str, ...] = (), server: bool = False
    ) -> tuple[Path, Path]:
        """Sign a client (or serving) certificate; returns (certificate file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        )
        now = datetime.datetime.now(datetime.UTC)
        usage = (
            x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            names: list[x509.GeneralName] = [
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                *(
                    x509.DNSName(n)
                    for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
                ),
            ]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_file, key_file = self.folder / f"{stem}.crt", self.folder / f"{stem}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        key_file.chmod(0o600)
        return cert_file, key_file


def write_kubeconfig(
    path: Path,
    server: str,
    ca_pem: bytes,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
    user: str = ADMIN,
    namespace: str = "default",
) -> Path:
    """Write a kubeconfig for ``server`` (TLS, trusting ``ca_pem``) as a client certificate or a token."""
    credentials: dict[str, str] = {}
    if cert is not None and key is not None:
        credentials["client-certificate-data"] = base64.b64encode(cert.read_bytes()).decode()
        credentials["client-key-data"] = base64.b64encode(key.read_bytes()).decode()
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "polymorph-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {"name": user, "context": {"cluster": "polymorph-test", "user": user, "namespace": namespace}}
        ],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler (see the module docstring)."""

    def __init__(
        self, workdir: Path | None = None, *, binaries_dir: Path | None = None, crds: Sequence[Path] = ()
    ) -> None:
        self.bin = binaries_dir or binaries()
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            if not (self.bin / name).is_file():
                raise ControlPlaneUnavailable(f"{self.bin} has no {name}; run `make control-plane`.")
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="polymorph-control-plane-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit_log = self.workdir / "audit.log"
        self.timings: dict[str, float] = {}
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._crds = list(crds)

    # --- start / stop ----------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for _name, proc in reversed(self._procs):  # one by one: each stops while the rest still serve
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _start(self) -> None:
        started = time.monotonic()
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        self._certs = certs = _Certificates(pki)
        self.ca_file, self.ca_pem = certs.ca_file, certs.ca_pem
        serving = certs.issue("apiserver", "kube-apiserver", server=True)
        self.admin_cert, self.admin_key = certs.issue("admin", ADMIN, groups=("system:masters",))
        proxy = certs.issue("front-proxy-client", "front-proxy-client")
        sa_key = ec.generate_private_key(ec.SECP256R1())
        (pki / "sa.key").write_bytes(_pem_key(sa_key))
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        write_kubeconfig(self.kubeconfig, self.url, self.ca_pem, cert=self.admin_cert, key=self.admin_key)
        components = {}
        for name, identity in (
            ("kube-controller-manager", "system:kube-controller-manager"),
            ("kube-scheduler", "system:kube-scheduler"),
        ):
            cert, key = certs.issue(name, identity)
            components[name] = write_kubeconfig(
                self.workdir / f"{name}.kubeconfig", self.url, self.ca_pem, cert=cert, key=key, user=identity
            )
        self.timings["certificates"] = time.monotonic() - started
        audit_policy = self.workdir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))

        etcd_url = self._start_etcd()

        self._spawn(
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={serving[0]}", f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={self.ca_file}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            f"--requestheader-client-ca-file={self.ca_file}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy[0]}", f"--proxy-client-key-file={proxy[1]}",
            "--endpoint-reconciler-type=none", "--allow-privileged=true", "--profiling=false",
            f"--audit-policy-file={audit_policy}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-maxsize=0",
        )  # fmt: skip
        with self.api(timeout=5) as api:  # one client for the polls: each new one costs an SSL context
            self._wait("kube-apiserver", lambda: api.get("/readyz").status_code == 200, timeout=120)
        self._create_crds()

        for name, port in (("kube-controller-manager", free_port()), ("kube-scheduler", free_port())):
            flags = [
                f"--kubeconfig={components[name]}",
                f"--authentication-kubeconfig={components[name]}",
                f"--authorization-kubeconfig={components[name]}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / (name + '-certs')}",
            ]
            if name == "kube-controller-manager":
                flags += [
                    f"--controllers={','.join(CONTROLLERS)}",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={self.ca_file}",
                ]
            self._spawn(name, *flags)
            self._wait(name, lambda p=port: httpx.get(f"https://127.0.0.1:{p}/healthz", verify=False, timeout=2)
                       .text == "ok", timeout=90)  # fmt: skip
        self.timings["total"] = time.monotonic() - started

    def _start_etcd(self, attempts: int = 3) -> str:
        """Start etcd on two free ports and return its client URL. A port ``free_port`` found can be
        taken by another process before etcd binds it (seen once with the suite's three workers and
        their servers): etcd then exits with "address already in use", and it starts again on new
        ports with an empty data folder."""
        for attempt in range(attempts):
            etcd_port, peer_port = free_port(), free_port()
            etcd_url = f"http://127.0.0.1:{etcd_port}"
            self._spawn(
                "etcd",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync", "--log-level=warn",
            )  # fmt: skip
            try:
                self._wait("etcd", lambda p=etcd_port: _etcd_healthy(p))
                return etcd_url
            except ControlPlaneUnavailable:
                if attempt == attempts - 1 or "address already in use" not in self.log_tail("etcd", 3):
                    raise
                self._procs.pop()
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        raise AssertionError("unreachable")

    def _spawn(self, name: str, *args: str) -> None:
        with (self.workdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([str(self.bin / name), *args], stdout=log, stderr=log, cwd=self.workdir)
        self._procs.append((name, proc))
        self._started = time.monotonic()

    def _wait(self, name: str, ready: object, timeout: float = 60) -> None:
        assert callable(ready)
        proc = self._procs[-1][1]
        deadline = self._started + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneUnavailable(
                    f"{name} exited with status {proc.returncode}: {self.log_tail(name, 5)}"
                )
            try:
                if ready():
                    self.timings[name] = time.monotonic() - self._started
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise ControlPlaneUnavailable(f"{name} was not ready after {timeout:g} s: {self.log_tail(name, 5)}")

    def _create_crds(self) -> None:
        """Create and wait for ``crds`` before the controller manager starts, so that its garbage
        collector's first discovery sees them (later CRDs it finds within 30 s)."""
        with self.api() as api:
            for path in self._crds:
                for document in yamls.load_all(path.read_text()):
                    created = api.post(
                        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=document
                    )
                    if created.status_code != 201:
                        raise ControlPlaneUnavailable(f"{path} was refused: {created.json().get('message')}")
            for path in self._crds:
                for document in yamls.load_all(path.read_text()):
                    name = document["metadata"]["name"]
                    self._started = time.monotonic()
                    self._wait(f"CRD {name}", lambda n=name: self._established(api, n), timeout=30)

    @staticmethod
    def _established(api: httpx.Client, name: str) -> bool:
        got = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").json()
        conditions = (got.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    # --- for tests -------------------------------------------------------------------------------

    def api(self, timeout: float = 30) -> httpx.Client:
        """An httpx client as the admin (``system:masters``); close it, or use it in a ``with``."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return httpx.Client(base_url=self.url, verify=context, timeout=timeout)

    def kubeconfig_with_token(self, path: Path, token: str, *, user: str, namespace: str = "default") -> Path:
        """A kubeconfig for this server that authenticates with ``token`` (no client certificate)."""
        return write_kubeconfig(path, self.url, self.ca_pem, token=token, user=user, namespace=namespace)

    def node_kubeconfig(self, node: str) -> Path:
        """A kubeconfig as the kubelet of ``node`` (``system:node:<node>`` in ``system:nodes``): the
        Node authorizer lets it read only the pods bound to that node and what they reference."""
        identity = f"system:node:{node}"
        cert, key = self._certs.issue(f"node-{node}", identity, groups=("system:nodes",))
        return write_kubeconfig(
            self.workdir / f"node-{node}.kubeconfig", self.url, self.ca_pem, cert=cert, key=key, user=identity
        )

    def remove_node(self, node: str) -> None:
        """Delete ``node`` and the pods still bound to it, as the admin: what removing a dead node
        does on a cluster (the pod garbage collector, disabled here, deletes its orphans). A kubelet
        may not delete its own Node, so a stopped node agent leaves it behind, looking Ready until
        its Lease runs out: a later test's pods would be bound to it and never run, nor go."""
        with self.api() as api:
            gone = api.delete(f"/api/v1/nodes/{node}")
            if gone.status_code not in (200, 404):
                raise RuntimeError(f"node {node} could not be deleted: {gone.status_code} {gone.text[:300]}")
            bound = api.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
            bound.raise_for_status()
            for pod in bound.json()["items"]:
                meta = pod["metadata"]
                api.delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    params={"gracePeriodSeconds": 0},
                )

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ("system:masters",)) -> Path:
        """A kubeconfig as ``user`` in ``groups`` (a client certificate): by default an admin of its
        own name, so that ``audit(user)`` holds that one client's requests and no one else's."""
        cert, key = self._certs.issue(f"user-{user}", user, groups=groups)
        return write_kubeconfig(
            self.workdir / f"user-{user}.kubeconfig", self.url, self.ca_pem, cert=cert, key=key, user=user
        )

    def audit(self, username: str) -> list[dict[str, Any]]:
        """The audit events (``audit.k8s.io/v1`` Event, Metadata level) of one user's requests, in order."""
        events = []
        for line in self.audit_log.read_text(errors="replace").splitlines():
            if f'"{username}"' in line:
                event = json.loads(line)
                if event["user"]["username"] == username:
                    events.append(event)
        return events

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])


def _etcd_healthy(port: int) -> bool:
    """etcd's ``/health`` says so (through ``support.probes``: no client, no SSL context a poll)."""
    answer = probes.get(port, "/health", timeout=2)
    return answer is not None and json.loads(answer[1]).get("health") == "true"


def main(argv: list[str] | None = None) -> None:
    """``python -m support.control_plane``: serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m support.control_plane", description=main.__doc__)
    parser.add_argument("--kubeconfig", type=Path, help="also copy the admin kubeconfig here")
    parser.add_argument("--workdir", type=Path, help="keep certificates, etcd data and logs here")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        running = ControlPlane(args.workdir)
    except ControlPlaneUnavailable as error:
        raise SystemExit(str(error)) from None
    with running:
        if args.kubeconfig:
            shutil.copyfile(running.kubeconfig, args.kubeconfig)
        times = ", ".join(f"{k} {v:.1f} s" for k, v in running.timings.items())
        print(f"Kubernetes {VERSION} control plane at {running.url} ({times})", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
