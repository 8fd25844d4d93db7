"""The upstream Kubernetes control plane for tests, built once from the Go module proxy and cached.

Contract:
- ``tests/tools/control-plane`` is a consumer module of ``k8s.io/kubernetes`` at ``VERSION``:
  its go.mod pins every staging module ``k8s.io/*`` to the matching ``v0.x`` release (the
  ``./staging`` replaces of k8s.io/kubernetes do not reach a consumer) and requires the
  ``go.etcd.io/etcd/server/v3`` release that k8s.io/kubernetes itself requires. Its go.sum
  checks every module (``-mod=readonly``: the build never edits the module files).
- ``build()`` builds ``etcd``, ``kube-apiserver``, ``kube-controller-manager`` and
  ``kube-scheduler`` (static, ``CGO_ENABLED=0``, stamped with ``VERSION`` as a release build
  is) into ``$POLYMORPH_TEST_CACHE`` (default ``~/.cache/polymorph-tests``) under
  ``control-plane/<VERSION>-<digest>/``, where the digest covers the module's go.mod, go.sum
  and tools.go; it returns that folder. An unchanged module is reused by every later session.
  The compiler runs at the lowest CPU priority (``nice -n 19``).
- Concurrent callers, threads or processes, are serialised by a file lock; the folder appears
  under its final name only once all four binaries are in it.
- ``binaries()`` only looks: it returns the folder, or raises ``ControlPlaneUnavailable``
  saying, in one sentence, that ``make control-plane`` builds it. Tests call this one: a cold
  build takes tens of minutes on two cores, which is no work for a test's setup.
- When Go is missing or the build fails, ``ControlPlaneUnavailable`` says so in one sentence,
  with the compiler's last line.

``python -m support.control_plane_build`` (``make control-plane``) builds and prints the
folder, with the build time.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = [
    "BINARIES",
    "ETCD_VERSION",
    "MODULE",
    "VERSION",
    "ControlPlaneUnavailable",
    "binaries",
    "build",
    "cache_dir",
]

MODULE = Path(__file__).resolve().parents[1] / "tools" / "control-plane"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
_PACKAGES = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
}
_lock = threading.Lock()


class ControlPlaneUnavailable(RuntimeError):
    """The control-plane binaries are not built or could not be built; the message says why."""


def _required(module: str) -> str:
    text = (MODULE / "go.mod").read_text()
    found = re.search(rf"^\s*{re.escape(module)} (v\S+)", text, re.MULTILINE)
    if found is None:
        raise ControlPlaneUnavailable(f"tests/tools/control-plane/go.mod does not require {module}.")
    return found.group(1)


VERSION = _required("k8s.io/kubernetes")
ETCD_VERSION = _required("go.etcd.io/etcd/server/v3")


def _digest() -> str:
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum", "tools.go"):
        h.update(name.encode() + b"\0" + (MODULE / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """The folder that holds (or will hold) the four binaries of this module's versions."""
    root = Path(os.environ.get("POLYMORPH_TEST_CACHE") or Path.home() / ".cache" / "polymorph-tests")
    return root / "control-plane" / f"{VERSION}-{_digest()}"


def _complete(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) for name in BINARIES)


def binaries() -> Path:
    """The folder of the built binaries; ``ControlPlaneUnavailable`` when they are not built."""
    folder = cache_dir()
    if not _complete(folder):
        raise ControlPlaneUnavailable(
            f"the Kubernetes {VERSION} control plane is not built in {folder}; run `make control-plane` "
            "(Go 1.26 and the Go module proxy, tens of minutes once)."
        )
    return folder


def _go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if found is None:
        raise ControlPlaneUnavailable(
            "Go is not installed (no `go` on PATH); the control plane needs Go 1.26, see go.dev/doc/install."
        )
    return found


def _ldflags() -> str:
    """What Kubernetes' own release build stamps: the version that /version and kubectl report."""
    major, minor = VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={VERSION}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def build(log: Path | None = None) -> Path:
    """Build the four binaries unless cached; returns their folder. ``log`` gets the compiler's output."""
    folder = cache_dir()
    if _complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock, open(folder.parent / f"{folder.name}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _complete(folder):  # another process finished while we waited
            return folder
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        partial.chmod(0o755)
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
        command = [
            "nice", "-n", "19", _go(), "build", "-trimpath", "-ldflags", _ldflags(),
            "-o", f"{partial}/", *_PACKAGES.values(),
        ]  # fmt: skip
        done = subprocess.run(command, cwd=MODULE, env=env, capture_output=True, text=True, check=False)
        if log is not None:
            log.write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ControlPlaneUnavailable(
                f"go build of the Kubernetes {VERSION} control plane failed: {last}"
            )
        (partial / "server").rename(partial / "etcd")  # `go build` names a binary after its package
        if not _complete(partial):
            shutil.rmtree(partial, ignore_errors=True)
            raise ControlPlaneUnavailable(f"go build left {partial} without all of {', '.join(BINARIES)}.")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)  # atomic: a reader sees all four binaries or none
    return folder


def main() -> None:
    """Build (or find) the control plane and print its folder."""
    started = time.monotonic()
    try:
        folder = build()
    except ControlPlaneUnavailable as error:
        sys.exit(str(error))
    took = time.monotonic() - started
    print(f"Kubernetes {VERSION} control plane (etcd {ETCD_VERSION}) in {folder} ({took:.0f} s)")


if __name__ == "__main__":
    main()
