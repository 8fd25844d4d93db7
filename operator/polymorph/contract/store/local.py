"""``LocalStore``: the artifact store in a local folder (the default, ``./.polymorph/store``).

Each key is a file under the root. Writes go to a temporary file in the same folder that is
then renamed over the target (``os.replace``), so readers never see a partial object.
Ledger appends take an exclusive ``flock`` on the ledger, drop a torn final line left by a
writer that was killed mid-write, and write whole lines through ``O_APPEND``: concurrent
writers in several processes interleave whole records only. Temporary files start with
``.tmp-`` and are never listed.

It knows nothing about S3 or about what the objects mean.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from polymorph.contract.store.base import JsonRecord, KeyNotFound, Store, encode_jsonl
from polymorph.contract.store.layout import check_key, check_prefix

__all__ = ["DEFAULT_LOCAL_STORE", "LocalStore"]

DEFAULT_LOCAL_STORE = Path(".polymorph/store")
_TMP = ".tmp-"
_TAIL_CHUNK = 1 << 16


def _fsync_write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


def _complete_length(fd: int, size: int) -> int:
    """Length of the file up to and including its last newline (0 when it has none)."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


class LocalStore(Store):
    """A store in a folder; ``root`` is created on the first write."""

    def __init__(self, root: Path | str = DEFAULT_LOCAL_STORE) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def uri_for(self, key: str) -> str:
        return str(self._path(key))

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_TMP, dir=path.parent)
        try:
            os.fchmod(fd, 0o644)
            _fsync_write(fd, data)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise KeyNotFound(f"store {self.uri} has no object {key}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        # Walk only the deepest folder the prefix names, then filter by the full string prefix.
        folder = prefix.rpartition("/")[0]
        base = self.root.joinpath(*folder.split("/")) if folder else self.root
        keys: list[str] = []
        for dirpath, _dirnames, filenames in os.walk(base):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(_TMP):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def append_jsonl(self, key: str, records: Sequence[JsonRecord]) -> None:
        data = encode_jsonl(records, key)
        if not data:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            complete = _complete_length(fd, size)
            if complete != size:  # a writer died mid-line while holding the lock; drop its fragment
                os.ftruncate(fd, complete)
            _fsync_write(fd, data)
        finally:
            os.close(fd)  # releases the lock
