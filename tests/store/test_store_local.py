"""LocalStore specifics: atomic files, concurrent ledger writers, and writers killed mid-append."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polymorph.contract.store import LocalStore

WRITER = """
import sys
from polymorph.contract.store import LocalStore
root, key, writer, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
store = LocalStore(root)
for i in range(count):
    store.append_jsonl(key, [{"writer": writer, "i": i, "pad": str(writer) * size}])
"""


def _writer(root: Path, key: str, writer: int, count: int, size: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-c", WRITER, str(root), key, str(writer), str(count), str(size)]
    return subprocess.Popen(args, stderr=subprocess.PIPE)


def test_concurrent_writers_interleave_whole_records(tmp_path: Path) -> None:
    root, key, writers, count, size = tmp_path / "store", "compilejobs/ns/j-u/ledger-0.jsonl", 4, 60, 30_000
    procs = [_writer(root, key, w, count, size) for w in range(writers)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    records = LocalStore(root).read_jsonl(key)
    assert len(records) == writers * count
    for w in range(writers):
        mine = [r for r in records if r["writer"] == w]
        assert [r["i"] for r in mine] == list(range(count))  # each writer's records stay in order
        assert all(r["pad"] == str(w) * size for r in mine)


def test_a_killed_writer_never_corrupts_the_ledger(tmp_path: Path) -> None:
    root, key = tmp_path / "store", "ledger.jsonl"
    proc = _writer(root, key, 7, 100_000, 2_000_000)
    path = root / key
    deadline = time.monotonic() + 60
    while (not path.exists() or path.stat().st_size < 3_000_000) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    store = LocalStore(root)
    before = store.read_jsonl(key)
    assert before and all(r["pad"] == "7" * 2_000_000 for r in before)
    store.append_jsonl(key, [{"writer": 8, "i": 0, "pad": ""}])
    after = store.read_jsonl(key)
    assert after[:-1] == before and after[-1]["writer"] == 8
    assert path.read_bytes().endswith(b"\n")


def test_puts_are_atomic_renames_that_leave_no_temporaries(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_bytes("a/doc.json", b"one")
    inode = (tmp_path / "store" / "a" / "doc.json").stat().st_ino
    store.put_bytes("a/doc.json", b"two")
    assert (tmp_path / "store" / "a" / "doc.json").stat().st_ino != inode  # replaced, not rewritten in place
    assert sorted(p.name for p in (tmp_path / "store" / "a").iterdir()) == ["doc.json"]
    (tmp_path / "store" / "a" / ".tmp-leftover").write_bytes(
        b"partial"
    )  # as if a writer died before renaming
    assert store.list("a/") == ["a/doc.json"]


def test_the_store_cannot_be_escaped(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_bytes("inside", b"x")
    assert store.uri_for("inside") == str(tmp_path / "store" / "inside")
    assert store.list("") == ["inside"]
    assert not (tmp_path / "outside").exists()


def test_relative_roots_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = LocalStore("rel/store")
    assert store.uri == str(tmp_path / "rel" / "store")
    store.put_json("x.json", {"a": 1})
    assert (tmp_path / "rel" / "store" / "x.json").is_file()


HALF_WRITER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b'{"writer": 9, "i": 0, "pad": "half a rec')
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_mid_line_leaves_a_fragment_the_next_append_drops(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.append_jsonl("l.jsonl", [{"i": 0}, {"i": 1}])
    proc = subprocess.run([sys.executable, "-c", HALF_WRITER, store.uri_for("l.jsonl")], check=False)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "store" / "l.jsonl").read_bytes().endswith(b"\n")  # the fragment is there
    assert store.read_jsonl("l.jsonl") == [{"i": 0}, {"i": 1}]
    store.append_jsonl("l.jsonl", [{"i": 2}])  # the dead writer's lock is gone; this must not block
    assert store.read_jsonl("l.jsonl") == [{"i": 0}, {"i": 1}, {"i": 2}]
