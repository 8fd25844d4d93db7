"""Artifact store: builds, JSON documents and JSONL ledgers, in a local folder or S3.

``open_store(uri)`` picks the implementation from a URI: nothing or a path gives a
``LocalStore`` (default ``./.polymorph/store``, or ``$POLYMORPH_STORE``), and
``s3://bucket/prefix`` gives an ``S3Store`` whose endpoint comes from
``$POLYMORPH_S3_ENDPOINT`` or ``$AWS_ENDPOINT_URL`` and whose region comes from
``$AWS_REGION`` or ``$AWS_DEFAULT_REGION``. A URI it cannot use is a ``UsageError``.

Builds are content-addressed: see ``polymorph.contract.store.archive`` for the canonical archive and
the build id, ``polymorph.contract.store.base`` for the contracts every store keeps, and
``polymorph.contract.store.layout`` for the keys.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from polymorph.contract import timeouts
from polymorph.contract.errors import StoreError, UsageError
from polymorph.contract.store.archive import (
    MAX_BUILD_BYTES,
    archive_build,
    archive_id,
    build_id,
    canonical_tar,
    check_build_id,
    unpack_build,
)
from polymorph.contract.store.base import JsonRecord, KeyNotFound, Store
from polymorph.contract.store.layout import (
    build_archive_key,
    build_manifest_key,
    compilejob_prefix,
    ledger_key,
    progress_key,
    report_key,
    result_key,
    workload_prefix,
)
from polymorph.contract.store.local import DEFAULT_LOCAL_STORE, LocalStore
from polymorph.contract.store.s3 import S3Store

__all__ = [
    "DEFAULT_LOCAL_STORE",
    "MAX_BUILD_BYTES",
    "JsonRecord",
    "KeyNotFound",
    "LocalStore",
    "S3Store",
    "Store",
    "StoreError",
    "archive_build",
    "archive_id",
    "build_archive_key",
    "build_id",
    "build_manifest_key",
    "canonical_tar",
    "check_build_id",
    "check_store_uri",
    "check_writable",
    "compilejob_prefix",
    "ledger_key",
    "open_store",
    "progress_key",
    "report_key",
    "result_key",
    "store_uri",
    "unpack_build",
    "workload_prefix",
]

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def check_store_uri(uri: str) -> str:
    """``uri`` when it names a store ``open_store`` can open (a path, ``file:///path`` or
    ``s3://bucket/prefix``), checked as text, nothing opened; ``UsageError`` saying what is allowed."""
    if not uri.strip():
        raise UsageError("the store URI is empty; use a local path or s3://bucket/prefix")
    if uri.startswith("s3://"):
        bucket = uri[len("s3://") :].partition("/")[0]
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise UsageError(
                f"store URI {uri!r} names the bucket {bucket!r}; a bucket name is 3-63 lowercase letters, digits, dots or hyphens"
            )
        return uri
    if uri.startswith("file://"):
        if not uri[len("file://") :].startswith("/"):
            raise UsageError(f"store URI {uri!r} must be file:///absolute/path")
        return uri
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise UsageError(
            f"store URI {uri!r} uses the unsupported scheme {scheme}://; use a local path or s3://bucket/prefix"
        )
    return uri


def store_uri(text: str) -> str:
    """An argparse type for ``--store``: ``check_store_uri``, so a store that could never be opened is
    refused with the flag's name whether or not the command would have opened it."""
    try:
        return check_store_uri(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _s3_store(uri: str, env: Mapping[str, str]) -> S3Store:
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    endpoint = env.get("POLYMORPH_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    try:
        return S3Store(bucket, prefix=prefix, endpoint_url=endpoint, region=region)
    except StoreError as exc:
        raise UsageError(f"store URI {uri!r} is not usable: {exc}") from None
    except ValueError as exc:  # botocore rejects a malformed endpoint URL with a ValueError
        raise UsageError(
            f"the S3 endpoint {endpoint!r} for store {uri!r} is not a valid URL ({exc})"
        ) from None


def open_store(uri: str | None = None, env: Mapping[str, str] | None = None) -> Store:
    """The store at ``uri``: a local path, ``file:///path`` or ``s3://bucket/prefix``.

    ``None`` means ``$POLYMORPH_STORE``, else ``./.polymorph/store``. ``env`` defaults to
    ``os.environ``; it is a parameter so callers and tests can pass their own.
    """
    env = os.environ if env is None else env
    if uri is None:
        uri = env.get("POLYMORPH_STORE") or str(DEFAULT_LOCAL_STORE)
    check_store_uri(uri)
    if uri.startswith("s3://"):
        return _s3_store(uri, env)
    if uri.startswith("file://"):
        return LocalStore(Path(uri[len("file://") :]))
    return LocalStore(Path(uri))


def check_writable(
    store: Store, flag: str, uri: str | None = None, prefix: str = "compilejobs/local"
) -> None:
    """Write and delete a probe object under ``prefix``, so a store that is unwritable or unreachable
    is a one-line ``UsageError`` naming ``flag`` now, not after a model loaded or a trace was lost."""
    key = f"{prefix.rstrip('/')}/.probe-{secrets.token_hex(6)}"
    where = uri or store.uri
    # One brief try (timeouts.PROBE), as the operator probes the API server and Prometheus: an
    # endpoint that accepts and never answers is this sentence in seconds, not minutes of retries.
    probe = store.with_limits(timeouts.PROBE) if isinstance(store, S3Store) else store
    try:
        probe.put_bytes(key, b"")
        probe.delete(key)
    except StoreError as exc:
        raise UsageError(f"{flag} {where} is not usable: {exc}") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{flag} {where} is not writable: {exc.filename or where}: {reason}") from None
