"""The artifact store interface, and everything built on its byte-level primitives.

A ``Store`` implementation provides ``put_bytes``, ``get_bytes``, ``exists``, ``list``,
``delete``, ``append_jsonl`` and ``uri_for``. This module builds the rest on top of them:
JSON documents, JSONL ledgers, and content-addressed builds.

Contracts every implementation keeps:
- ``put_bytes`` is atomic: a reader sees the old object or the new one, never a mix.
- ``get_bytes``/``get_json`` on a missing key raise ``KeyNotFound`` (a ``StoreError``)
  whose message names the key and the store; ``read_jsonl`` on a missing key returns ``[]``.
- ``list(prefix)`` returns every key that starts with ``prefix`` (a plain string prefix,
  recursive), sorted.
- ``append_jsonl`` adds whole lines; a reader never sees half a record. A final line
  without its newline (a write in progress, or one cut short by a killed writer) is not a
  record and is skipped; the next append drops it.
- ``put_build`` is idempotent and writes the archive before the manifest, so a build whose
  manifest exists has its archive too; ``has_build`` checks both anyway.
- ``get_build`` verifies the archive against its id and refuses a tampered one.

It knows nothing about Kubernetes, the engine, or what a build's files mean (it reads only
the ``name`` in ``build.toml`` to title a default manifest).
"""

from __future__ import annotations

import abc
import builtins
import datetime as dt
import hashlib
import json
import shutil
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from polymorph.contract.api.build import BuildManifest
from polymorph.contract.errors import StoreError
from polymorph.contract.store.archive import (
    BUILD_ID_PREFIX,
    _gunzip,
    _gzip,
    _place,
    canonical_tar,
    check_build_id,
)
from polymorph.contract.store.archive import build_id as tree_id
from polymorph.contract.store.layout import BUILDS, build_archive_key, build_manifest_key

__all__ = ["JsonRecord", "KeyNotFound", "Store", "encode_jsonl", "parse_jsonl"]

JsonRecord = Mapping[str, Any] | BaseModel
"""A ledger record: a JSON object, or a pydantic model dumped in JSON mode."""


class KeyNotFound(StoreError):
    """The store holds no object under the key asked for."""


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _plain(doc: Any) -> Any:
    return doc.model_dump(mode="json") if isinstance(doc, BaseModel) else doc


def encode_jsonl(records: Sequence[JsonRecord], key: str) -> bytes:
    """One ``\\n``-terminated compact JSON line per record; raises StoreError naming a bad record."""
    lines: list[str] = []
    for i, record in enumerate(records):
        plain = _plain(record)
        if not isinstance(plain, Mapping):
            raise StoreError(
                f"record {i} for {key} is a {type(plain).__name__}; ledger records must be JSON objects"
            )
        try:
            lines.append(
                json.dumps(plain, default=_json_default, separators=(",", ":"), allow_nan=False) + "\n"
            )
        except (TypeError, ValueError) as exc:
            raise StoreError(f"record {i} for {key} cannot be written as JSON: {exc}") from None
    return "".join(lines).encode()


def complete_lines(data: bytes) -> bytes:
    """``data`` cut after its last newline: drops a torn or in-progress final line."""
    return data[: data.rfind(b"\n") + 1]


def parse_jsonl(data: bytes, where: str) -> list[dict[str, Any]]:
    """Records of a JSONL object; a final line without a newline is skipped (see the module contract)."""
    records: list[dict[str, Any]] = []
    for number, line in enumerate(complete_lines(data).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise StoreError(f"line {number} of {where} is not valid JSON; the ledger is corrupt") from None
        if not isinstance(record, dict):
            raise StoreError(f"line {number} of {where} is not a JSON object; the ledger is corrupt")
        records.append(record)
    return records


def _manifest_name(build_dir: Path) -> str:
    """The ``name`` in ``build.toml`` when it has one, else the directory name."""
    try:
        name = tomllib.loads((build_dir / "build.toml").read_text()).get("name")
    except (OSError, ValueError):
        name = None
    return name if isinstance(name, str) and name else build_dir.resolve().name


class Store(abc.ABC):
    """An artifact store: byte objects under ``/``-separated keys, plus builds, JSON and ledgers."""

    uri: str
    """Where the store is, as ``open_store`` accepts it (a local path or ``s3://bucket/prefix``)."""

    # ---- primitives -------------------------------------------------------------------------

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write an object atomically, replacing any previous one."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Read an object; raise KeyNotFound when there is none."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; removing a missing one is not an error."""

    @abc.abstractmethod
    def append_jsonl(self, key: str, records: Sequence[JsonRecord]) -> None:
        """Append records as JSON lines, creating the object when it is missing."""

    @abc.abstractmethod
    def uri_for(self, key: str) -> str:
        """A URI for one object, for status fields such as ``ledgerUri`` (a path or ``s3://...``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    # ---- documents --------------------------------------------------------------------------

    def put_json(self, key: str, doc: Any) -> None:
        """Write a JSON document (a pydantic model is dumped in JSON mode) atomically."""
        try:
            text = json.dumps(_plain(doc), default=_json_default, indent=2, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"the document for {key} cannot be written as JSON: {exc}") from None
        self.put_bytes(key, (text + "\n").encode())

    def get_json(self, key: str) -> Any:
        """Read a JSON document; raise KeyNotFound when missing, StoreError when not JSON."""
        data = self.get_bytes(key)
        try:
            return json.loads(data)
        except ValueError:
            raise StoreError(f"{self.uri_for(key)} is not valid JSON") from None

    def read_jsonl(self, key: str) -> builtins.list[dict[str, Any]]:
        """Every complete record of a JSONL ledger, in order; ``[]`` when it does not exist."""
        try:
            data = self.get_bytes(key)
        except KeyNotFound:
            return []
        return parse_jsonl(data, self.uri_for(key))

    # ---- builds -----------------------------------------------------------------------------

    def put_build(self, build_dir: Path, manifest: BuildManifest | None = None) -> str:
        """Store a build directory under its id and return the id; storing it again is harmless.

        A given ``manifest`` gets its ``id`` filled in and replaces the stored one. Without one,
        a minimal manifest is written unless the build already has one.
        """
        tar_bytes = canonical_tar(build_dir)
        bid = BUILD_ID_PREFIX + hashlib.sha256(tar_bytes).hexdigest()
        if not self.exists(build_archive_key(bid)):
            self.put_bytes(build_archive_key(bid), _gzip(tar_bytes))
        if manifest is not None:
            manifest.id = bid
            self.put_json(build_manifest_key(bid), manifest)
        elif not self.exists(build_manifest_key(bid)):
            self.put_json(build_manifest_key(bid), BuildManifest(id=bid, name=_manifest_name(build_dir)))
        return bid

    def has_build(self, build_id: str) -> bool:
        """Whether the store holds a complete build (archive and manifest) with this id."""
        return self.exists(build_manifest_key(build_id)) and self.exists(build_archive_key(build_id))

    def get_manifest(self, build_id: str) -> BuildManifest:
        """The manifest stored beside a build; StoreError when missing or malformed."""
        key = build_manifest_key(build_id)
        try:
            doc = self.get_json(key)
        except KeyNotFound:
            raise KeyNotFound(f"store {self.uri} has no build {build_id} (no {key})") from None
        try:
            return BuildManifest.model_validate(doc)
        except ValidationError as exc:
            raise StoreError(
                f"{self.uri_for(key)} is not a valid build manifest: {exc.errors()[0]['msg']}"
            ) from None

    def list_builds(self) -> builtins.list[str]:
        """Ids of every build with a manifest in the store, sorted."""
        return [
            BUILD_ID_PREFIX + key[len(BUILDS) : -len(".json")]
            for key in self.list(BUILDS)
            if key.endswith(".json") and "/" not in key[len(BUILDS) :]
        ]

    def get_build(self, build_id: str, dest: Path) -> Path:
        """Fetch, verify and unpack a build into ``dest/<hex>``, and return that directory.

        ``dest`` is a cache folder: an already-unpacked build whose files still hash to its id
        is returned without a download; one that does not is replaced. An archive whose tar
        does not hash to ``build_id`` is refused with StoreError.
        """
        hexpart = check_build_id(build_id)
        target = dest / hexpart
        if target.is_dir():
            try:
                if build_id == tree_id(target):
                    return target
            except StoreError:
                pass
            shutil.rmtree(target)
        key = build_archive_key(build_id)
        try:
            data = self.get_bytes(key)
        except KeyNotFound:
            raise KeyNotFound(f"store {self.uri} has no build {build_id} (no {key})") from None
        where = self.uri_for(key)
        tar_bytes = _gunzip(data, where)
        actual = BUILD_ID_PREFIX + hashlib.sha256(tar_bytes).hexdigest()
        if actual != build_id:
            raise StoreError(
                f"{where} hashes to {actual}, not {build_id}; refusing a tampered or corrupt build"
            )
        try:
            return _place(tar_bytes, target, where)
        except StoreError:
            # Another process unpacked the same build first; theirs is as good as ours.
            if target.is_dir() and tree_id(target) == build_id:
                return target
            raise
