"""Fixtures shared by every test: artifact stores, local and S3, the S3 one over real HTTP.

- ``s3_server`` (session): moto's ``ThreadedMotoServer`` on 127.0.0.1 at a free port;
  yields its endpoint URL. It speaks the real S3 wire protocol, so boto3 is never patched.
- ``s3_env`` (function): points the standard AWS environment at that server with dummy
  credentials (and away from any real ``~/.aws``), sets ``POLYMORPH_S3_ENDPOINT``, and
  undoes it all after the test; yields the endpoint URL.
- ``s3_session`` (session): a boto3 session with the same dummy credentials, for cheap clients.
- ``s3_bucket`` (function): a fresh, empty bucket name on the server.
- ``s3_store`` / ``local_store`` (function): an empty store of each kind.
- ``store`` (function): parametrised over ``local`` and ``s3``, so a test using it runs
  against both.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from polymorph.store import LocalStore, S3Store, Store

S3_REGION = "us-east-1"
S3_DUMMY_KEY = "polymorph-test"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL (``http://127.0.0.1:<port>``) of an in-process moto S3 server."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_session() -> boto3.session.Session:
    """One boto3 session with the dummy credentials, shared so each test's client is cheap to make."""
    return boto3.session.Session(
        aws_access_key_id=S3_DUMMY_KEY, aws_secret_access_key=S3_DUMMY_KEY, region_name=S3_REGION
    )


@pytest.fixture
def s3_env(s3_server: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """The AWS environment for the test server, reverted after the test; returns the endpoint."""
    nowhere = tmp_path_factory.mktemp("aws") / "absent"
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_DEFAULT_PROFILE",
        "AWS_ROLE_ARN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_DUMMY_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_DUMMY_KEY)
    monkeypatch.setenv("AWS_REGION", S3_REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(nowhere))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("POLYMORPH_S3_ENDPOINT", s3_server)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env: str) -> str:
    """A new, empty bucket on the test server."""
    import boto3

    name = f"polymorph-test-{uuid.uuid4().hex[:16]}"
    boto3.session.Session().client("s3", endpoint_url=s3_env, region_name=S3_REGION).create_bucket(
        Bucket=name
    )
    return name


@pytest.fixture
def s3_store(s3_env: str, s3_bucket: str, s3_session: boto3.session.Session) -> S3Store:
    """An empty S3Store in a fresh bucket on the test server."""
    return S3Store(s3_bucket, endpoint_url=s3_env, region=S3_REGION, session=s3_session)


@pytest.fixture
def local_store(tmp_path: Path) -> LocalStore:
    """An empty LocalStore in the test's temporary folder."""
    return LocalStore(tmp_path / "store")


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each kind of store in turn: the test runs once per implementation."""
    fixture = {"local": "local_store", "s3": "s3_store"}[request.param]
    result: Store = request.getfixturevalue(fixture)
    return result
