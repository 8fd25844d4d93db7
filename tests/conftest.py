"""Fixtures shared by every test: artifact stores, local and S3, the S3 one over real HTTP, and the
real control plane.

- ``control_plane`` (session): the real Kubernetes control plane of tests/operator and
  tests/control_plane, one per worker process (see its docstring).
- ``moto_s3`` (session): moto's ``ThreadedMotoServer`` on 127.0.0.1 at a free port; yields
  its endpoint URL. It speaks the real S3 wire protocol, so boto3 is never patched.
- ``s3_server`` (function): that endpoint URL, with the standard AWS environment pointed at
  it for this test only: dummy credentials (and no real ``~/.aws``), region,
  ``AWS_ENDPOINT_URL`` and ``POLYMORPH_S3_ENDPOINT``; all undone after the test.
- ``s3_session`` (session): a boto3 session with the same dummy credentials, for cheap clients.
- ``s3_bucket`` (function): a fresh, empty bucket name on the server.
- ``s3_store`` / ``local_store`` (function): an empty store of each kind.
- ``store`` (function): parametrised over ``local`` and ``s3``, so a test using it runs
  against both.
"""

from __future__ import annotations

import os

# One thread per worker process, before numpy or torch loads: three workers share two cores, and
# idle BLAS and OpenMP threads spin. As ``polymorph.cli`` does for OpenBLAS: the campaigns these
# tests run in-process (the replays) do tiny matrix products, and took 47 s of CPU for 33 s of wall
# time on one worker, 26 s with one thread. The pods the node agent runs get OMP_NUM_THREADS=1 too.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest

from polymorph.contract.store import LocalStore, S3Store, Store

if TYPE_CHECKING:
    from support.control_plane import ControlPlane

_ENVIRON_AT_START: dict[str, str] = {}


def _restore_ctrl_c() -> None:
    """Give SIGINT back its Python handler where the suite was started ignoring it.

    A shell without job control starts a background command (``make test &``, ``nohup``) with
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler. The Ctrl-C tests
    (the supervisor's, the campaign CLI's) would fail for the launch, not the code. A handled
    signal is reset to its default at exec, so the processes the tests start get Ctrl-C too.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    _restore_ctrl_c()
    _ENVIRON_AT_START.update(os.environ)


DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each test file took (setup, call and teardown of all its tests) in a full run of
``make test``. The files run longest first, so that pytest-xdist (``--dist loadfile
--no-loadscope-reorder``) starts the long ones, the operator's waits among them, while short
ones fill the other worker, instead of leaving them for last on one worker. ``pytest
--store-durations tests e2e`` records them again; a file missing from it runs after the recorded ones."""

_seconds_by_file: Counter[str] = Counter()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"record how long each test file took in {DURATIONS.name}, which orders the files (default: off)",
    )


def _recorded() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    recorded = _recorded()
    # A stable sort: the tests of a file keep their order.
    items.sort(key=lambda item: -recorded.get(item.nodeid.split("::")[0], 0.0))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds_by_file[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("store_durations") or hasattr(session.config, "workerinput"):
        return  # only the controller (or a run without xdist) has every file's reports
    recorded = _recorded()
    recorded.update({name: round(seconds, 1) for name, seconds in _seconds_by_file.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(recorded.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Importing a test module must not change the environment: every later test and every
    process it starts would inherit the change (a ``TRITON_INTERPRET=1`` left by one module once
    made every CPU campaign run its Triton candidates through the interpreter, minutes each)."""
    changed = sorted(
        k for k in {*_ENVIRON_AT_START, *os.environ} if os.environ.get(k) != _ENVIRON_AT_START.get(k)
    )
    if changed:
        raise pytest.UsageError(f"collecting the tests changed the environment: {', '.join(changed)}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real control plane (``support.control_plane``: etcd, kube-apiserver, the controller
    manager and the scheduler; about 5 CPU-seconds to start, and a few hundredths of a core while
    it serves) for every test of this worker process that asks for it, tests/operator's and
    tests/control_plane's alike, with the project's CRDs (created before the controller manager
    starts, so its garbage collector knows them from the start). The tests share it and keep
    apart by namespaces; a test that changes cluster-scoped state (a CRD, a node) puts it back."""
    from support.control_plane import ControlPlane

    crds = sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))
    with ControlPlane(tmp_path_factory.mktemp("control-plane"), crds=crds) as running:
        yield running


S3_REGION = "us-east-1"
S3_DUMMY_KEY = "polymorph-test"


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Endpoint URL (``http://127.0.0.1:<port>``) of an in-process moto S3 server, for the whole session."""
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
def s3_server(moto_s3: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test S3 server's endpoint URL, with the AWS environment pointed at it for this test only."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ROLE_ARN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_DUMMY_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_DUMMY_KEY)
    monkeypatch.setenv("AWS_REGION", S3_REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)  # never read a developer's real ~/.aws
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3)
    monkeypatch.setenv("POLYMORPH_S3_ENDPOINT", moto_s3)
    return moto_s3


@pytest.fixture
def s3_bucket(s3_server: str, s3_session: boto3.session.Session) -> str:
    """A new, empty bucket on the test server."""
    name = f"polymorph-test-{uuid.uuid4().hex[:16]}"
    s3_session.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_store(s3_server: str, s3_bucket: str, s3_session: boto3.session.Session) -> S3Store:
    """An empty S3Store in a fresh bucket on the test server."""
    return S3Store(s3_bucket, endpoint_url=s3_server, region=S3_REGION, session=s3_session)


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
