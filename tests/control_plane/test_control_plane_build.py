"""``support.control_plane_build``: the cache is keyed by version and module, reused without Go,
and a failed build is one sentence that leaves nothing half-built behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.control_plane_build import BINARIES, VERSION, ControlPlaneUnavailable, binaries, build, cache_dir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POLYMORPH_TEST_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_go(folder: Path, script: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    go = folder / "go"
    go.write_text(f"#!/bin/sh\n{script}\n")
    go.chmod(0o755)


def test_the_cache_is_keyed_by_the_release_and_the_module(cache: Path) -> None:
    folder = cache_dir()
    assert folder.parent == cache / "control-plane"
    assert folder.name.startswith(f"{VERSION}-") and len(folder.name) == len(VERSION) + 17


def test_a_complete_cache_is_reused_without_go(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = cache_dir()
    folder.mkdir(parents=True)
    for name in BINARIES:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    fake_go(tmp_path / "bin", "echo 'go must not run' >&2; exit 1")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert build() == folder == binaries()


def test_a_failed_build_is_one_sentence_and_leaves_no_folder(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_go(tmp_path / "bin", "echo 'compile: out of memory' >&2; exit 2")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(ControlPlaneUnavailable) as failed:
        build()
    assert (
        str(failed.value)
        == f"go build of the Kubernetes {VERSION} control plane failed: compile: out of memory"
    )
    assert [p.name for p in (cache / "control-plane").iterdir()] == [f"{cache_dir().name}.lock"]
    with pytest.raises(ControlPlaneUnavailable, match="run `make control-plane`"):
        binaries()


def test_a_build_missing_a_binary_is_refused(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `go build -o DIR/` writes one binary per package; this one "forgets" the scheduler.
    script = (
        'for a; do out="$a"; done; o=""; prev=""; for a; do [ "$prev" = "-o" ] && o="$a"; prev="$a"; done\n'
    )
    script += 'for n in server kube-apiserver kube-controller-manager; do printf "#!/bin/sh\\n" > "$o$n"; chmod +x "$o$n"; done'
    fake_go(tmp_path / "bin", script)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(
        ControlPlaneUnavailable, match=r"without all of etcd, kube-apiserver, .*kube-scheduler\.$"
    ):
        build()
    assert [p.name for p in (cache / "control-plane").iterdir()] == [f"{cache_dir().name}.lock"]
