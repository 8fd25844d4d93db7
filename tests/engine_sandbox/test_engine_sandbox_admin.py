"""The sandbox admin API over real HTTP: experiments through RemoteRunner into a real Supervisor.

One Supervisor (tiny model, a two-request workload) backs the module's admin server, so the
worker loads its weights once; the crash test then proves the admin server outlives a worker
that a build kills, and that the next experiment runs in a restarted worker.
"""

from __future__ import annotations

import base64
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from polymorph.contract.api import ExperimentRecord
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.errors import UsageError
from polymorph.contract.runner import RemoteRunner
from polymorph.contract.store import archive_build, build_id
from polymorph.contract.workload import RequestShape, Workload
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.supervisor import Supervisor
from polymorph_engine.sandbox.admin import serve_admin
from polymorph_engine.serving.server import EngineServer

WORKLOAD = Workload((RequestShape(8, 4), RequestShape(6, 3)), 2, "sha256:admin-test")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineServer, Supervisor, Path]]:
    workdir = tmp_path_factory.mktemp("admin-work")
    supervisor = Supervisor(
        "tiny",
        workload=WORKLOAD,
        experiment_timeout=120,
        settings=BenchSettings(repeats=1, warmup=0),
        verify_prompts=2,
        verify_steps=4,
        fit=False,
    )
    supervisor.start()
    server = serve_admin(supervisor, "127.0.0.1", 0, workdir=workdir)
    server.start()
    yield server, supervisor, workdir
    server.close()
    supervisor.close()


def _copy_reference(dest: Path, append: str = "") -> Path:
    shutil.copytree(REFERENCE_BUILD, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if append:
        entry = dest / "hotpath.py"
        entry.write_text(entry.read_text() + append)
    return dest


def test_remote_runner_runs_an_experiment(sandbox: tuple[EngineServer, Supervisor, Path]) -> None:
    server, _, workdir = sandbox
    runner = RemoteRunner(server.url, timeout=120)
    runner.wait_ready(timeout=10)
    record = runner.run(REFERENCE_BUILD, description="baseline")
    assert isinstance(record, ExperimentRecord)
    assert record.status == "passed", record.error
    assert record.build == build_id(REFERENCE_BUILD)
    assert record.description == "baseline"
    assert record.figures is not None and record.figures.outputTokensPerSecond > 0
    assert list(workdir.iterdir()) == []  # the unpacked experiment build was cleaned up


def test_a_crashing_build_is_contained(
    sandbox: tuple[EngineServer, Supervisor, Path], tmp_path: Path
) -> None:
    server, supervisor, _ = sandbox
    crash = _copy_reference(
        tmp_path / "crash", append="\n\nimport os as _os\n\n\ndef load(model, knobs):\n    _os._exit(7)\n"
    )
    runner = RemoteRunner(server.url, timeout=120)
    record = runner.run(crash, description="crash")
    assert record.status == "crashed"
    assert record.build == build_id(crash)
    assert "exited with code 7" in (record.error or "")
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    again = runner.run(REFERENCE_BUILD)
    assert again.status == "passed"
    assert supervisor.stats.restarts >= 1


def test_load_build_sets_the_current_build(
    sandbox: tuple[EngineServer, Supervisor, Path], tmp_path: Path
) -> None:
    server, _, _ = sandbox
    runner = RemoteRunner(server.url)
    variant = _copy_reference(tmp_path / "variant", append="\n# a comment changes the id\n")
    assert runner.load_build(variant) == build_id(variant)
    assert httpx.get(f"{server.url}/admin/builds/current").json() == {"build": build_id(variant)}


def test_bad_admin_bodies_get_400(sandbox: tuple[EngineServer, Supervisor, Path], tmp_path: Path) -> None:
    server, _, _ = sandbox
    good = base64.b64encode(archive_build(REFERENCE_BUILD)).decode()
    cases: list[tuple[bytes | dict[str, object], str | None]] = [
        (b"{oops", None),
        ({}, "archive"),
        ({"archive": "!!!not base64"}, "archive"),
        ({"archive": base64.b64encode(b"not a gzip").decode()}, "archive"),
        ({"archive": good, "id": "sha256:" + "0" * 64}, "id"),
        ({"archive": good, "description": 5}, "description"),
    ]
    for body, param in cases:
        if isinstance(body, bytes):
            r = httpx.post(f"{server.url}/admin/experiments", content=body)
        else:
            r = httpx.post(f"{server.url}/admin/experiments", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param
    assert httpx.post(f"{server.url}/admin/nope", json={}).status_code == 404
    assert httpx.get(f"{server.url}/admin/experiments").status_code == 405
    assert (
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "a"}).status_code == 404
    )  # no model here


def test_admin_refuses_non_loopback_hosts() -> None:
    for host in ("0.0.0.0", "10.1.2.3", "example.com"):
        with pytest.raises(UsageError, match="loopback"):
            serve_admin(_SlowRunner(0), host, 0)


class _SlowRunner:
    """A runner that sleeps, or raises when ``fail`` is set: for the client's error paths."""

    def __init__(self, delay_s: float, fail: bool = False) -> None:
        self.delay_s = delay_s
        self.fail = fail
        self.calls = 0

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("worker could not start")
        return ExperimentRecord(build=build_id(build_dir), status="passed", description=description)


def test_remote_runner_turns_engine_failures_into_records(tmp_path: Path) -> None:
    failing = serve_admin(_SlowRunner(0, fail=True), "127.0.0.1", 0, workdir=tmp_path / "a")
    slow = serve_admin(_SlowRunner(2.0), "127.0.0.1", 0, workdir=tmp_path / "b")
    failing.start()
    slow.start()
    try:
        crashed = RemoteRunner(failing.url).run(REFERENCE_BUILD, description="x")
        assert crashed.status == "crashed" and "worker could not start" in (crashed.error or "")
        assert httpx.get(f"{failing.url}/healthz").status_code == 200  # the server survived
        timed_out = RemoteRunner(slow.url, timeout=0.3).run(REFERENCE_BUILD)
        assert timed_out.status == "timeout" and timed_out.build == build_id(REFERENCE_BUILD)
        port = failing.port
    finally:
        failing.close()
        slow.close()
    gone = RemoteRunner(f"http://127.0.0.1:{port}").run(REFERENCE_BUILD)
    assert gone.status == "crashed" and "unreachable" in (gone.error or "")


def test_experiments_run_one_at_a_time(tmp_path: Path) -> None:
    runner = _SlowRunner(0.2)
    active = {"now": 0, "max": 0}
    lock = threading.Lock()
    original = runner.run

    def tracked(
        build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        try:
            return original(build_dir, description=description, against=against, screen=screen)
        finally:
            with lock:
                active["now"] -= 1

    runner.run = tracked  # type: ignore[method-assign]
    server = serve_admin(runner, "127.0.0.1", 0, workdir=tmp_path)
    server.start()
    try:
        threads = [
            threading.Thread(target=RemoteRunner(server.url).run, args=(REFERENCE_BUILD,)) for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.close()
    assert runner.calls == 3 and active["max"] == 1
