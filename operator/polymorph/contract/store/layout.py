"""Where each kind of object lives in the artifact store: the one place that spells out keys.

The layout (docs/store-layout.md):
- ``builds/<sha256hex>.tar.gz`` and ``builds/<sha256hex>.json`` (a ``BuildManifest``);
- ``compilejobs/<ns>/<name>-<uid>/ledger-<i>.jsonl``, ``progress-<i>.json``, ``result.json``, ``report.html``;
- ``workloads/<ns>/<md>/...`` for captured traffic profiles.

Keys are relative, ``/``-separated and never contain empty, ``.`` or ``..`` segments;
``check_key`` enforces that for every store. This module knows nothing about how bytes are
stored.
"""

from __future__ import annotations

from polymorph.contract.errors import StoreError
from polymorph.contract.store.archive import check_build_id

__all__ = [
    "build_archive_key",
    "build_manifest_key",
    "check_key",
    "check_prefix",
    "compilejob_prefix",
    "ledger_key",
    "progress_key",
    "report_key",
    "result_key",
    "workload_prefix",
]

BUILDS = "builds/"


def _check_segments(value: str, what: str, allow_trailing_slash: bool) -> str:
    body = value[:-1] if allow_trailing_slash and value.endswith("/") else value
    if value.startswith("/") or "\\" in value or "\x00" in value:
        raise StoreError(f"store {what} {value!r} must be a relative path with / separators")
    if body and any(seg in ("", ".", "..") for seg in body.split("/")):
        raise StoreError(f"store {what} {value!r} must not contain empty, '.' or '..' segments")
    return value


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise StoreError naming it."""
    if not key or key.endswith("/"):
        raise StoreError(f"store key {key!r} must name an object, not be empty or end with /")
    return _check_segments(key, "key", allow_trailing_slash=False)


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid listing prefix ('' lists everything), else raise StoreError."""
    return _check_segments(prefix, "prefix", allow_trailing_slash=True)


def _segment(value: str, what: str) -> str:
    if not value or "/" in value or value in (".", ".."):
        raise StoreError(f"{what} {value!r} must be a non-empty name without /")
    return value


def build_archive_key(build_id: str) -> str:
    """``builds/<hex>.tar.gz`` for a ``sha256:<hex>`` build id."""
    return f"{BUILDS}{check_build_id(build_id)}.tar.gz"


def build_manifest_key(build_id: str) -> str:
    """``builds/<hex>.json`` for a ``sha256:<hex>`` build id."""
    return f"{BUILDS}{check_build_id(build_id)}.json"


def compilejob_prefix(namespace: str, name: str, uid: str) -> str:
    """``compilejobs/<ns>/<name>-<uid>/``: everything a CompileJob's sandboxes write."""
    return f"compilejobs/{_segment(namespace, 'namespace')}/{_segment(name, 'name')}-{_segment(uid, 'uid')}/"


def ledger_key(namespace: str, name: str, uid: str, sandbox: int) -> str:
    """The experiment ledger of one sandbox: ``.../ledger-<i>.jsonl``."""
    return f"{compilejob_prefix(namespace, name, uid)}ledger-{int(sandbox)}.jsonl"


def progress_key(namespace: str, name: str, uid: str, sandbox: int) -> str:
    """The progress document of one sandbox: ``.../progress-<i>.json``."""
    return f"{compilejob_prefix(namespace, name, uid)}progress-{int(sandbox)}.json"


def result_key(namespace: str, name: str, uid: str) -> str:
    """The campaign result of a CompileJob: ``.../result.json``."""
    return f"{compilejob_prefix(namespace, name, uid)}result.json"


def report_key(namespace: str, name: str, uid: str) -> str:
    """The campaign's report for people, beside its result: ``.../report.html``."""
    return f"{compilejob_prefix(namespace, name, uid)}report.html"


def workload_prefix(namespace: str, deployment: str) -> str:
    """``workloads/<ns>/<md>/``: captured traffic profiles of one ModelDeployment."""
    return f"workloads/{_segment(namespace, 'namespace')}/{_segment(deployment, 'model deployment')}/"
