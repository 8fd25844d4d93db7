"""open_store URIs and environment, and S3Store behaviour at the edges (prefixes, bad buckets, no server)."""

from __future__ import annotations

import socket
from pathlib import Path

import boto3
import pytest

from polymorph.contract.errors import StoreError, UsageError
from polymorph.contract.store import KeyNotFound, LocalStore, S3Store, open_store


def test_default_is_a_local_store_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store(None, env={})
    assert isinstance(store, LocalStore)
    assert store.uri == str(tmp_path / ".polymorph" / "store")


def test_polymorph_store_env_is_the_default(tmp_path: Path) -> None:
    store = open_store(None, env={"POLYMORPH_STORE": str(tmp_path / "elsewhere")})
    assert isinstance(store, LocalStore) and store.uri == str(tmp_path / "elsewhere")
    assert open_store(str(tmp_path / "given"), env={"POLYMORPH_STORE": "ignored"}).uri == str(
        tmp_path / "given"
    )


def test_file_uris_and_plain_paths(tmp_path: Path) -> None:
    assert open_store(f"file://{tmp_path}/s", env={}).uri == str(tmp_path / "s")
    assert open_store(str(tmp_path / "p"), env={}).uri == str(tmp_path / "p")


def test_s3_uri_takes_endpoint_and_region_from_env(s3_server: str) -> None:
    env = {
        "POLYMORPH_S3_ENDPOINT": s3_server,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_REGION": "eu-west-3",
        "AWS_DEFAULT_REGION": "us-west-2",
    }
    store = open_store("s3://my-bucket/some/prefix/", env=env)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.endpoint_url, store.region) == (
        "my-bucket",
        "some/prefix",
        s3_server,
        "eu-west-3",
    )
    assert store.uri == "s3://my-bucket/some/prefix"
    fallback = open_store("s3://b-1", env={"AWS_ENDPOINT_URL": s3_server, "AWS_DEFAULT_REGION": "us-west-2"})
    assert isinstance(fallback, S3Store)
    assert (fallback.endpoint_url, fallback.region, fallback.prefix, fallback.uri) == (
        s3_server,
        "us-west-2",
        "",
        "s3://b-1",
    )


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "store URI is empty"),
        ("  ", "store URI is empty"),
        ("s3://", "bucket name is 3-63"),
        ("s3://Upper_Case/x", "bucket name is 3-63"),
        ("s3://ab", "bucket name is 3-63"),
        ("s3://bucket/a/../b", "is not usable"),
        ("gs://bucket/x", "unsupported scheme gs://"),
        ("http://example.com/store", "unsupported scheme http://"),
        ("file://relative/path", "file:///absolute/path"),
    ],
)
def test_bad_uris_are_one_sentence_usage_errors(uri: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        open_store(uri, env={})
    assert "\n" not in str(info.value)


def test_bad_endpoint_is_a_usage_error(s3_server: str) -> None:
    with pytest.raises(UsageError, match="not a valid URL"):
        open_store("s3://bucket-x", env={"POLYMORPH_S3_ENDPOINT": "not a url"})


def test_prefixes_isolate_stores_in_one_bucket(s3_server: str, s3_bucket: str) -> None:
    one = S3Store(s3_bucket, prefix="team-a", endpoint_url=s3_server)
    two = S3Store(s3_bucket, prefix="team-b/", endpoint_url=s3_server)
    one.put_json("doc.json", {"team": "a"})
    two.put_json("doc.json", {"team": "b"})
    assert one.list("") == ["doc.json"] and two.list("") == ["doc.json"]
    assert one.get_json("doc.json") == {"team": "a"} and two.get_json("doc.json") == {"team": "b"}
    assert one.uri_for("doc.json") == f"s3://{s3_bucket}/team-a/doc.json"
    client = boto3.session.Session().client("s3", endpoint_url=s3_server)
    raw = client.list_objects_v2(Bucket=s3_bucket)
    assert sorted(o["Key"] for o in raw["Contents"]) == ["team-a/doc.json", "team-b/doc.json"]
    client.put_object(Bucket=s3_bucket, Key="team-a/folder/", Body=b"")  # a console-made "folder"
    assert one.list("") == ["doc.json"]


def test_missing_bucket_is_a_clear_error_that_never_shows_credentials(
    s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-never-print-me")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-never-print-me")
    store = open_store("s3://no-such-bucket-here/p")
    for action in (lambda: store.get_bytes("k"), lambda: store.put_bytes("k", b"v"), lambda: store.list("")):
        with pytest.raises(
            StoreError, match="bucket no-such-bucket-here of store s3://no-such-bucket-here/p does not exist"
        ) as info:
            action()
        assert "never-print-me" not in str(info.value)
    assert "never-print-me" not in repr(store)


def test_missing_credentials_are_named(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = open_store("s3://whatever-bucket")
    with pytest.raises(StoreError, match="no AWS credentials found"):
        store.put_bytes("k", b"v")


def test_unreachable_endpoint_is_a_clear_error(s3_server: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3Store("some-bucket", endpoint_url=f"http://127.0.0.1:{port}")
    with pytest.raises(StoreError, match=f"cannot reach the S3 endpoint http://127.0.0.1:{port}"):
        store.get_bytes("k")


def test_exists_is_false_for_missing_objects_in_s3(s3_store: S3Store) -> None:
    assert not s3_store.exists("nope")
    with pytest.raises(KeyNotFound):
        s3_store.get_bytes("nope")


def test_public_api_is_complete() -> None:
    import polymorph.contract.store as api

    assert all(hasattr(api, name) for name in api.__all__)
    for name in ("Store", "LocalStore", "S3Store", "open_store", "archive_build", "build_id", "unpack_build"):
        assert name in api.__all__
    for method in (
        "put_bytes",
        "get_bytes",
        "exists",
        "list",
        "delete",
        "put_json",
        "get_json",
        "append_jsonl",
    ):
        assert callable(getattr(api.Store, method))
    for method in (
        "read_jsonl",
        "put_build",
        "get_build",
        "get_manifest",
        "has_build",
        "list_builds",
        "uri_for",
    ):
        assert callable(getattr(api.Store, method))
