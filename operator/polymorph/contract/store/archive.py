"""Canonical build archives, build ids and safe extraction.

Owns: turning a build directory into a canonical tar.gz, the build id derived from it, and
unpacking an archive without letting it write outside its destination.

The contract:
- The canonical tar lists every regular file under the build directory, sorted by its
  POSIX relative path, with mtime 0, uid/gid 0, no user or group names and mode 0644 (or
  0755 when the owner may execute it). Directories are implied by file paths, so an empty
  directory does not change the id. ``__pycache__`` folders, ``*.pyc``/``*.pyo`` files
  and ``.DS_Store`` are skipped. A symlink, socket or device in the tree is refused.
- A **build id** is ``sha256:<hex>`` of that canonical tar stream (the bytes inside the
  gzip layer). Hashing the tar rather than the compressed bytes keeps the id a function of
  the tree alone: two zlib builds may compress the same stream differently, and a build's
  id must not depend on which machine archived it. The gzip layer is written
  deterministically too (mtime 0, no file name, fixed level).
- ``unpack_build`` accepts regular files and directories only; an absolute path, a ``..``
  segment, a link or a device entry makes it refuse the whole archive.

It knows nothing about where archives are stored, nor about what a build contains
(``build.toml``, entry modules): that is the engine's business.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from polymorph.contract.errors import StoreError

__all__ = [
    "BUILD_ID_PREFIX",
    "MAX_BUILD_BYTES",
    "archive_build",
    "archive_id",
    "build_id",
    "canonical_tar",
    "check_build_id",
    "unpack_build",
]

BUILD_ID_PREFIX = "sha256:"
MAX_BUILD_BYTES = 1 << 30
"""The largest unpacked build accepted (1 GiB); it bounds memory when reading an untrusted archive."""

_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_FILES = frozenset({".DS_Store"})
_SKIP_SUFFIXES = (".pyc", ".pyo")
_GZIP_LEVEL = 6


def check_build_id(value: str) -> str:
    """Return the hex digest of a ``sha256:<64 lowercase hex>`` build id, or raise StoreError."""
    hexpart = value[len(BUILD_ID_PREFIX) :] if value.startswith(BUILD_ID_PREFIX) else ""
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise StoreError(f"{value!r} is not a build id; a build id is sha256:<64 lowercase hex digits>")
    return hexpart


def _skipped(rel: PurePosixPath) -> bool:
    return (
        any(part in _SKIP_DIRS for part in rel.parts[:-1])
        or rel.name in _SKIP_FILES
        or rel.name.endswith(_SKIP_SUFFIXES)
    )


def _build_files(build_dir: Path) -> list[tuple[str, Path]]:
    """Every file of the build as (posix relative path, absolute path), sorted by relative path."""
    if not build_dir.is_dir():
        raise StoreError(f"build directory {build_dir} does not exist or is not a directory")
    files: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(build_dir):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = PurePosixPath(path.relative_to(build_dir).as_posix())
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise StoreError(
                    f"build directory {build_dir} contains the symlink {rel}; builds hold plain files only"
                )
            if stat.S_ISDIR(mode) or _skipped(rel):
                continue
            if not stat.S_ISREG(mode):
                raise StoreError(f"build directory {build_dir} contains {rel}, which is not a regular file")
            files.append((str(rel), path))
    if not files:
        raise StoreError(f"build directory {build_dir} holds no files")
    # Sort by the encoded path so the order does not depend on the locale or on os.walk.
    files.sort(key=lambda item: item[0].encode())
    return files


def canonical_tar(build_dir: Path) -> bytes:
    """The canonical, uncompressed tar stream of a build directory; its sha256 is the build id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for rel, path in _build_files(build_dir):
            data = path.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _gzip(tar_bytes: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=_GZIP_LEVEL) as gz:
        gz.write(tar_bytes)
    return buf.getvalue()


def _gunzip(data: bytes, what: str) -> bytes:
    """Decompress an archive, refusing anything that is not gzip or unpacks past MAX_BUILD_BYTES."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as gz:
            out = gz.read(MAX_BUILD_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise StoreError(f"{what} is not a readable tar.gz archive ({exc})") from None
    if len(out) > MAX_BUILD_BYTES:
        raise StoreError(f"{what} unpacks to more than {MAX_BUILD_BYTES} bytes, the most a build may hold")
    return out


def archive_build(build_dir: Path) -> bytes:
    """The canonical tar.gz of a build directory: the same tree always gives the same bytes here."""
    return _gzip(canonical_tar(build_dir))


def build_id(build_dir: Path) -> str:
    """``sha256:<hex>`` of the canonical tar of a build directory (see the module contract)."""
    return BUILD_ID_PREFIX + hashlib.sha256(canonical_tar(build_dir)).hexdigest()


def archive_id(data: bytes) -> str:
    """The build id of a tar.gz archive made by ``archive_build``: sha256 of the tar inside it."""
    return BUILD_ID_PREFIX + hashlib.sha256(_gunzip(data, "the archive")).hexdigest()


def _member_path(member: tarfile.TarInfo, what: str) -> PurePosixPath:
    name = member.name
    rel = PurePosixPath(name)
    if not name or name.startswith("/") or "\\" in name or "\x00" in name or rel.is_absolute():
        raise StoreError(f"{what} holds the entry {name!r} with an absolute or malformed path; refusing it")
    if any(part == ".." for part in rel.parts):
        raise StoreError(f"{what} holds the entry {name!r}, which points outside the build; refusing it")
    if not (member.isreg() or member.isdir()):
        raise StoreError(
            f"{what} holds the entry {name!r}, which is a link or device; builds hold plain files only"
        )
    return rel


def _extract_tar(tar_bytes: bytes, into: Path, what: str) -> None:
    """Write every entry of a tar stream under ``into`` after checking all of them first."""
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
            members = tar.getmembers()
            checked = [(_member_path(m, what), m) for m in members]
            root = into.resolve()
            for rel, member in checked:
                target = into.joinpath(*rel.parts)
                if root not in (target.resolve(), *target.resolve().parents):
                    raise StoreError(
                        f"{what} holds the entry {member.name!r}, which points outside the build; refusing it"
                    )
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:  # cannot happen for a regular file; keeps the types honest
                    raise StoreError(f"{what} holds the entry {member.name!r} without data")
                target.write_bytes(source.read())
                target.chmod(0o755 if member.mode & stat.S_IXUSR else 0o644)
    except tarfile.TarError as exc:
        raise StoreError(f"{what} is not a readable tar archive ({exc})") from None


def _place(tar_bytes: bytes, dest: Path, what: str) -> Path:
    """Extract into a temporary sibling of ``dest`` and rename it into place, so ``dest`` is all or nothing."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        _extract_tar(tar_bytes, tmp, what)
        tmp.chmod(0o755)
        try:
            os.replace(tmp, dest)  # succeeds onto a missing or empty directory only
        except OSError:
            raise StoreError(
                f"cannot unpack {what} into {dest}: it already exists and is not an empty directory"
            ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def unpack_build(data: bytes, dest: Path) -> Path:
    """Safely extract a tar.gz build archive into ``dest`` (missing or empty) and return ``dest``."""
    return _place(_gunzip(data, "the archive"), dest, "the archive")
