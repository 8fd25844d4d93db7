"""Canonical build archives: deterministic ids, skipped junk, and extraction that cannot escape."""

from __future__ import annotations

import hashlib
import io
import os
import random
import tarfile
from pathlib import Path

import pytest

from polymorph.contract.errors import StoreError
from polymorph.contract.store import (
    archive_build,
    archive_id,
    build_id,
    canonical_tar,
    check_build_id,
    unpack_build,
)

FILES = {
    "build.toml": b'name = "demo"\n',
    "entry.py": b"def make_hot_path(ctx):\n    return ctx\n",
    "kernels/attn.py": b"# attention\n",
    "kernels/deep/mlp.py": b"# mlp\n",
    "data/table.bin": bytes(range(256)) * 4,
    "unicod\u00e9.txt": "caf\u00e9\n".encode(),
}


def write_tree(
    root: Path, files: dict[str, bytes], order: list[str] | None = None, mtime: int | None = None
) -> Path:
    for rel in order or list(files):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[rel])
        if mtime is not None:
            os.utime(path, (mtime, mtime))
    return root


def test_same_tree_same_id_whatever_mtimes_order_and_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        a = write_tree(tmp_path / "a", FILES, order=sorted(FILES), mtime=1_000_000)
    finally:
        os.umask(old)
    old = os.umask(0o002)
    try:
        shuffled = list(FILES)
        random.Random(7).shuffle(shuffled)
        b = write_tree(
            tmp_path / "elsewhere" / "b", FILES, order=list(reversed(shuffled)), mtime=2_000_000_000
        )
    finally:
        os.umask(old)
    assert (a / "entry.py").stat().st_mode != (b / "entry.py").stat().st_mode  # the umasks really differed
    assert archive_build(a) == archive_build(b)
    assert build_id(a) == build_id(b)
    assert build_id(a) == "sha256:" + hashlib.sha256(canonical_tar(a)).hexdigest()


def test_id_follows_content_names_and_exec_bit(tmp_path: Path) -> None:
    base = build_id(write_tree(tmp_path / "base", FILES))
    changed = dict(FILES, **{"entry.py": b"def make_hot_path(ctx):\n    return None\n"})
    assert build_id(write_tree(tmp_path / "content", changed)) != base
    renamed = {("kernels/attn2.py" if k == "kernels/attn.py" else k): v for k, v in FILES.items()}
    assert build_id(write_tree(tmp_path / "renamed", renamed)) != base
    execd = write_tree(tmp_path / "exec", FILES)
    (execd / "entry.py").chmod(0o755)
    assert build_id(execd) != base


def test_junk_and_empty_directories_do_not_change_the_id(tmp_path: Path) -> None:
    clean = build_id(write_tree(tmp_path / "clean", FILES))
    messy = write_tree(tmp_path / "messy", FILES)
    (messy / "__pycache__").mkdir()
    (messy / "__pycache__" / "entry.cpython-311.pyc").write_bytes(b"\x00junk")
    (messy / "kernels" / "__pycache__").mkdir()
    (messy / "kernels" / "__pycache__" / "attn.cpython-311.pyc").write_bytes(b"junk")
    (messy / "stray.pyc").write_bytes(b"junk")
    (messy / ".DS_Store").write_bytes(b"junk")
    (messy / "empty" / "nested").mkdir(parents=True)
    assert build_id(messy) == clean


def test_archive_entries_are_normalised(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "t", FILES, mtime=1_234_567)
    (tree / "entry.py").chmod(0o700)
    with tarfile.open(fileobj=io.BytesIO(archive_build(tree)), mode="r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(FILES, key=str.encode)
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        assert m.mode == (0o755 if m.name == "entry.py" else 0o644)
        assert m.isreg()
    assert archive_build(tree)[4:8] == b"\x00\x00\x00\x00"  # gzip header mtime is zero


def test_archive_id_matches_build_id(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "t", FILES)
    assert archive_id(archive_build(tree)) == build_id(tree)


def test_refuses_symlinks_missing_and_empty_dirs(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "t", FILES)
    (tree / "link.py").symlink_to(tree / "entry.py")
    with pytest.raises(StoreError, match=r"symlink link\.py"):
        build_id(tree)
    with pytest.raises(StoreError, match="does not exist"):
        build_id(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="holds no files"):
        build_id(tmp_path / "empty")


def test_unpack_round_trip_preserves_files_and_id(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "t", FILES)
    (tree / "entry.py").chmod(0o755)
    out = unpack_build(archive_build(tree), tmp_path / "out" / "x")
    assert out == tmp_path / "out" / "x"
    for rel, data in FILES.items():
        assert (out / rel).read_bytes() == data
    assert (out / "entry.py").stat().st_mode & 0o777 == 0o755
    assert (out / "build.toml").stat().st_mode & 0o777 == 0o644
    assert build_id(out) == build_id(tree)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name != "x"]  # no temporary left behind


def test_unpack_refuses_a_non_empty_destination(tmp_path: Path) -> None:
    data = archive_build(write_tree(tmp_path / "t", FILES))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(StoreError, match="already exists"):
        unpack_build(data, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "t"]
    assert (dest / "keep.txt").read_text() == "mine"


def _evil_archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        ok = tarfile.TarInfo("ok.py")
        ok.size = 3
        tar.addfile(ok, io.BytesIO(b"x=1"))
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_info("/etc/evil"), "absolute"),
        (_info("../evil.py"), "outside"),
        (_info("a/../../evil.py"), "outside"),
        (_info("link", tarfile.SYMTYPE, "/etc/passwd"), "link or device"),
        (_info("hard", tarfile.LNKTYPE, "ok.py"), "link or device"),
        (_info("dev", tarfile.CHRTYPE), "link or device"),
        (_info("fifo", tarfile.FIFOTYPE), "link or device"),
    ],
)
def test_unpack_refuses_unsafe_entries(tmp_path: Path, member: tarfile.TarInfo, message: str) -> None:
    data = _evil_archive((member, b"evil"))
    with pytest.raises(StoreError, match=message):
        unpack_build(data, tmp_path / "out" / "x")
    assert list((tmp_path / "out").iterdir()) == []  # nothing half-extracted remains
    assert not (tmp_path / "evil.py").exists()


def test_unpack_refuses_garbage(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"not a readable tar\.gz"):
        unpack_build(b"definitely not gzip", tmp_path / "x")


@pytest.mark.parametrize("bad", ["", "reference", "sha256:abc", "sha256:" + "A" * 64, "md5:" + "0" * 64])
def test_check_build_id_rejects_malformed_ids(bad: str) -> None:
    with pytest.raises(StoreError, match="is not a build id"):
        check_build_id(bad)
    assert check_build_id("sha256:" + "0f" * 32) == "0f" * 32
