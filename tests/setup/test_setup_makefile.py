"""The Makefile's setup targets and ``.ci/run``: what ``make test`` installs by itself.

``make system-packages`` and ``make go-version`` run the real Makefile under a PATH that holds
only stubs (``id``, ``apt-get``, ``go``, the tests' system commands) and the few real tools the
recipes use, so each case chooses what is "installed" without touching the machine. apt-get's
stub records its arguments instead of installing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on PATH")

REAL_TOOLS = ("sed", "sort")
"""What the recipes run besides shell built-ins and the stubs."""
SYSTEM_COMMANDS = ("prometheus", "promtool", "chromium", "tmux")
# Run under `make test`, the outer make's flags (its jobserver, -n, -k) must not reach these runs.
ENV = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def make(
    target: str,
    tmp_path: Path,
    *,
    present: tuple[str, ...],
    uid: int = 0,
    go: str | None = None,
    apt_fails: bool = False,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``make target`` with a PATH of stubs: ``present`` commands exist, the user is ``uid``,
    ``go env GOVERSION`` answers ``go``; returns make's result and apt-get's calls."""
    assert MAKE is not None
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in REAL_TOOLS:
        found = shutil.which(tool)
        assert found is not None, f"no {tool} on PATH"
        (folder / tool).symlink_to(found)
    for name in present:
        stub(folder, name, "exit 0")
    stub(folder, "id", f"echo {uid}")
    fail = (
        "; [ $1 = update ] || { echo 'E: Unable to fetch some archives' >&2; exit 100; }" if apt_fails else ""
    )
    stub(folder, "apt-get", f'echo "$*" >> {tmp_path / "apt-get.log"}{fail}')
    if go is not None:
        stub(folder, "go", f'[ "$*" = "env GOVERSION" ] && echo {go}')
    env = {**ENV, "PATH": str(folder)}
    done = subprocess.run(
        [MAKE, "--no-print-directory", target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    log = tmp_path / "apt-get.log"
    return done, log.read_text().splitlines() if log.exists() else []


def test_nothing_is_installed_when_every_command_is_present(tmp_path: Path) -> None:
    done, apt = make("system-packages", tmp_path, present=SYSTEM_COMMANDS)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr, apt) == ("", "", [])


def test_root_installs_only_the_missing_packages_with_apt(tmp_path: Path) -> None:
    done, apt = make("system-packages", tmp_path, present=("prometheus", "chromium"))
    assert done.returncode == 0, done.stderr
    # promtool comes with Debian's prometheus package: one missing command is the package missing.
    assert apt == ["update -qq", "install -y -qq prometheus tmux"]


def test_chromium_under_ubuntu_s_name_counts_as_present(tmp_path: Path) -> None:
    done, apt = make(
        "system-packages", tmp_path, present=("prometheus", "promtool", "chromium-browser", "tmux")
    )
    assert (done.returncode, apt) == (0, [])


def test_without_root_one_sentence_names_the_missing_packages(tmp_path: Path) -> None:
    done, apt = make("system-packages", tmp_path, present=("prometheus", "promtool"), uid=1000)
    assert done.returncode != 0
    assert apt == []
    said = done.stderr.splitlines()[0]
    assert "chromium tmux" in said and "`sudo apt-get install -y chromium tmux`" in said
    assert "Traceback" not in done.stderr


def test_a_failed_apt_get_says_so_once(tmp_path: Path) -> None:
    done, apt = make("system-packages", tmp_path, present=SYSTEM_COMMANDS[:-1], apt_fails=True)
    assert done.returncode != 0
    assert apt == ["update -qq", "install -y -qq tmux"]
    assert done.stderr.splitlines()[-2:-1] == ["apt-get could not install tmux (its error is above)."]


GO_NEEDED = re.search(r"^go (\S+)", (ROOT / "tests/tools/control-plane/go.mod").read_text(), re.MULTILINE)


@pytest.mark.parametrize("version", ["go1.26.0", "go1.26.8", "go1.27.1"])
def test_a_recent_go_passes(tmp_path: Path, version: str) -> None:
    done, _ = make("go-version", tmp_path, present=(), go=version)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("version", ["go1.23.4", "go1.25.9", "go1.9"])
def test_an_older_go_is_named_with_the_version_needed(tmp_path: Path, version: str) -> None:
    assert GO_NEEDED is not None
    done, _ = make("go-version", tmp_path, present=(), go=version)
    assert done.returncode != 0
    said = done.stderr.splitlines()[0]
    assert f"Go {GO_NEEDED.group(1)} or later" in said and f"Go {version.removeprefix('go')}" in said


def database() -> str:
    assert MAKE is not None
    done = subprocess.run(
        [MAKE, "--no-print-directory", "-pq", "go-version"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


@pytest.mark.parametrize("target", ["unit", "e2e", "demo-fleet"])
def test_the_targets_that_run_tests_install_what_the_tests_need(target: str) -> None:
    rule = re.search(rf"^{target}:(.*)$", database(), re.MULTILINE)
    assert rule is not None
    assert {"system-packages", "control-plane", "go-tools"} <= set(rule.group(1).split())


def test_the_go_builds_check_the_go_version_first() -> None:
    rules = database()
    for target in ("control-plane", "go-tools"):
        rule = re.search(rf"^{target}:(.*)$", rules, re.MULTILINE)
        assert rule is not None and "go-version" in rule.group(1).split()
    assert re.search(r"^GOTOOLCHAIN := local$", rules, re.MULTILINE), "go could download a toolchain"


def test_ci_runs_make_test_and_installs_nothing_of_its_own() -> None:
    script = (ROOT / ".ci/run").read_text()
    assert re.search(r"^make test$", script, re.MULTILINE)
    assert not re.search(r"\b(curl|wget)\b|https?://", script), "no download by URL in .ci/run"
    # make is the one package the Makefile cannot install itself.
    installs = [line.strip() for line in re.findall(r"apt-get install[^;}\n]*", script)]
    assert installs == ["apt-get install -y -qq make"]
