"""The two images, built from this repository and run as the chart runs them, where a Docker daemon
answers: the operator image prints ``polymorph --version`` and loads the operator without torch;
the engine image serves the tiny model and answers ``/readyz`` and a completion.

No registry is reached. Each image is built ``FROM`` a base made here (``local_base``: this
machine's Python and system libraries, and the wheels the image installs, repacked from the test
environment), with ``--build-arg BASE_IMAGE=<that base>`` and pip told to use only those wheels
(``PIP_INSTALL_OPTIONS=--no-index --find-links /wheels``). Every other line of the Dockerfiles
runs as it does for a release. Each container runs as the image's own user, with a read-only
root filesystem, a tmpfs at ``/tmp``, no capabilities and no network, as the chart's pods do.

Without a Docker daemon the tests skip, saying what ``docker info`` answered; a daemon on another
OS or architecture than this machine's (the base is made from its userland) skips too. Anything
else that goes wrong fails.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from local_base import import_base, remove_images

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
USER = "65532:65532"
WHEELS_ONLY = "PIP_INSTALL_OPTIONS=--no-index --find-links /wheels"
# As the chart's pods run: a read-only root, /tmp an emptyDir, nothing escalated, no network.
Build = Callable[[str, str, list[tuple[str, frozenset[str]]]], str]
HARDENED = ["--read-only", "--tmpfs", "/tmp:rw,exec,size=512m", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--network", "none"]  # fmt: skip


def docker_unavailable() -> str | None:
    """Why these tests cannot run here, or None: no docker command, no daemon answering ``docker
    info``, or a daemon whose OS and architecture differ from this machine's."""
    docker = shutil.which("docker")
    if docker is None:
        return "needs Docker: there is no docker command on PATH"
    try:
        done = subprocess.run(
            [docker, "info", "--format", "{{.OSType}}/{{.Architecture}}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "needs a Docker daemon: `docker info` did not answer within 60 s"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"needs a Docker daemon: `docker info` says: {said}"
    here = f"{platform.system().lower()}/{platform.machine()}"
    if done.stdout.strip() != here:
        return f"the base is made from this {here} machine's userland; the Docker daemon runs {done.stdout.strip()}"
    return None


@pytest.fixture(scope="module")
def docker() -> str:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)
    found = shutil.which("docker")
    assert found is not None
    return found


def _run(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture
def built(docker: str, tmp_path: Path) -> Iterator[Build]:
    """``built(dockerfile, name, roots)``: the image ``dockerfile`` builds on a local base with the
    wheels of ``roots``; every image made from that base is removed afterwards."""
    bases: list[str] = []

    def build(dockerfile: str, name: str, roots: list[tuple[str, frozenset[str]]]) -> str:
        run_id = uuid.uuid4().hex[:10]
        base = import_base(docker, f"polymorph-test/base-{name}:{run_id}", roots, tmp_path / name)
        bases.append(base)
        image = f"polymorph-test/{name}:{run_id}"
        _run(docker, "build", "-f", str(REPO / dockerfile), "-t", image,
             "--build-arg", f"BASE_IMAGE={base}", "--build-arg", WHEELS_ONLY, str(REPO))  # fmt: skip
        return image

    yield build
    for base in bases:
        remove_images(docker, base)


def _config(docker: str, image: str) -> dict[str, object]:
    inspected = json.loads(_run(docker, "image", "inspect", image).stdout)
    config: dict[str, object] = inspected[0]["Config"]
    return config


_OPERATOR_CHECKS = """
import importlib.util, json, os, sys
from pathlib import Path
import polymorph.cli, polymorph.handlers.process, polymorph.kubectl_plugin
venv = Path(sys.prefix)
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "prefix": sys.prefix,
    "absent": [m for m in ("torch", "polymorph_engine", "anthropic", "numpy") if importlib.util.find_spec(m) is None],
    "compiled": Path(importlib.util.cache_from_source(polymorph.handlers.process.__file__)).is_file(),
    "venv_mb": sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20,
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_operator_image_runs_polymorph_as_non_root_on_a_read_only_root(docker: str, built: Build) -> None:
    image = built("operator/Dockerfile", "operator", [("polymorph", frozenset())])
    config = _config(docker, image)
    assert config["User"] == USER and config["Entrypoint"] == ["polymorph"]
    version = _run(docker, "run", "--rm", *HARDENED, image, "--version").stdout.strip()
    assert version == f"polymorph {VERSION}"
    # The operator's whole command line loads: kopf, the kubernetes client, Prometheus, the store.
    helped = _run(docker, "run", "--rm", *HARDENED, image, "operator", "--help").stdout
    assert "--namespace" in helped and "--prometheus-url" in helped
    checks = json.loads(
        _run(docker, "run", "--rm", *HARDENED, "--entrypoint", "python", image, "-c", _OPERATOR_CHECKS).stdout
    )
    assert (checks["uid"], checks["gid"]) == (65532, 65532) and checks["prefix"] == "/opt/polymorph"
    # Slim: no torch, no engine, no agent SDK; bytecode compiled at build, so imports write nothing.
    assert checks["absent"] == ["torch", "polymorph_engine", "anthropic", "numpy"], checks
    assert checks["compiled"] is True
    assert checks["venv_mb"] < 300, checks


_ASK = """
import json, sys, urllib.request
url = "http://127.0.0.1:8000" + sys.argv[1]
body = sys.argv[2].encode() if len(sys.argv) > 2 else None
request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=60) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except OSError as e:
    print(json.dumps({"status": 0, "body": str(e)}))
"""


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_engine_image_serves_the_tiny_model_as_non_root_on_a_read_only_root(
    docker: str, built: Build
) -> None:
    image = built("engine_image/Dockerfile", "engine", [("polymorph", frozenset({"engine", "agent"}))])
    config = _config(docker, image)
    assert config["User"] == USER and config["Entrypoint"] == ["polymorph"]
    name = f"polymorph-test-engine-{uuid.uuid4().hex[:8]}"
    _run(docker, "run", "-d", "--name", name, *HARDENED, image,
         "engine", "serve", "--model", "tiny", "--host", "127.0.0.1", "--port", "8000")  # fmt: skip
    try:

        def ask(path: str, body: str | None = None) -> dict[str, object]:
            args = [docker, "exec", name, "python", "-c", _ASK, path, *([body] if body else [])]
            answer: dict[str, object] = json.loads(_run(*args, timeout=120).stdout)
            return answer

        deadline = time.monotonic() + 600
        ready = ask("/readyz")
        while ready["status"] != 200:
            state = json.loads(_run(docker, "inspect", "-f", "{{json .State}}", name).stdout)
            logs = _run(docker, "logs", name).stderr
            assert state["Running"], f"the engine exited ({state['ExitCode']}): {logs[-3000:]}"
            assert time.monotonic() < deadline, f"/readyz never answered 200: {ready} {logs[-3000:]}"
            time.sleep(2)
            ready = ask("/readyz")
        completion = ask("/v1/completions", json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}))
        assert completion["status"] == 200, completion
        choices = json.loads(str(completion["body"]))["choices"]
        assert len(choices) == 1 and isinstance(choices[0]["text"], str)
        user = _run(docker, "exec", name, "python", "-c", "import os; print(os.getuid(), os.getgid())").stdout
        assert user.split() == ["65532", "65532"]
        logs = _run(docker, "logs", name).stderr
        assert re.search(r"serving tiny with build sha256:[0-9a-f]{64} on ", logs), logs[
            -3000:
        ]  # the reference
        # SIGTERM: it stops accepting, lets requests finish and exits 0.
        _run(docker, "stop", "-t", "60", name, timeout=120)
        state = json.loads(_run(docker, "inspect", "-f", "{{json .State}}", name).stdout)
        assert state["ExitCode"] == 0, _run(docker, "logs", name).stderr[-3000:]
    finally:
        subprocess.run([docker, "rm", "-f", name], capture_output=True, check=False, timeout=120)
