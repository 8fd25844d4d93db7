"""The Go test tools under ``tests/tools/`` (kstatus, argocd-lua), built once and cached.

Contract:
- ``go_tool(name)`` returns the path of ``tests/tools/<name>`` built with the ``go`` on
  ``PATH`` (or ``/usr/local/go/bin/go``). The binary lives outside the repository, in
  ``$POLYMORPH_TEST_CACHE`` (default ``~/.cache/polymorph-tests``) under
  ``go-tools/<name>-<digest>``, where the digest covers the tool's ``go.sum``, ``go.mod`` and
  sources: a changed dependency or source builds anew, an unchanged one is reused by every
  later session. Modules come from the Go module proxy into Go's own module cache, checked
  against ``go.sum`` (``-mod=readonly``: the build never edits the module files).
- Concurrent callers are serialised by a file lock; the binary appears under its final name
  only once it is complete.
- When Go is missing or the build fails, ``GoToolUnavailable`` says so in one sentence, with
  the compiler's last line.
- ``python -m support.go_tools`` (``make go-tools``, run by ``.ci/run`` while the venv installs)
  builds every tool ahead of the tests, so that no test spends its time on a cold build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["GO_TOOLS", "TOOLS", "GoToolUnavailable", "go_tool", "run_json"]

TOOLS = Path(__file__).resolve().parents[1] / "tools"
GO_TOOLS = ("kstatus", "argocd-lua")
"""The tools ``go_tool`` builds (``tools/control-plane`` is ``support.control_plane_build``'s)."""
_lock = threading.Lock()


class GoToolUnavailable(RuntimeError):
    """A Go test tool could not be built; the message says why."""


def _go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if found is None:
        raise GoToolUnavailable(
            "Go is not installed (no `go` on PATH); the tests need Go 1.26 or later: see go.dev/doc/install."
        )
    return found


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.name in ("go.mod", "go.sum") or p.suffix == ".go"):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def go_tool(name: str) -> Path:
    source = TOOLS / name
    if not (source / "go.sum").is_file():
        raise GoToolUnavailable(f"tests/tools/{name} has no go.sum; run `go mod tidy` there.")
    root = (
        Path(os.environ.get("POLYMORPH_TEST_CACHE") or Path.home() / ".cache" / "polymorph-tests")
        / "go-tools"
    )
    target = root / f"{name}-{_digest(source)}" / name
    if target.is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _lock, open(root / f"{name}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{name}.partial")
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
        done = subprocess.run(
            [_go(), "build", "-trimpath", "-o", str(partial), "."],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise GoToolUnavailable(f"go build of tests/tools/{name} failed: {last}")
        os.replace(partial, target)
    return target


def run_json(name: str, args: list[str], stdin: str) -> list[dict[str, object]]:
    """Run a tool with ``stdin``; one JSON object per output line. A non-zero exit raises with its stderr."""
    import json

    done = subprocess.run(
        [str(go_tool(name)), *args], input=stdin, capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def main() -> None:
    """Build (or find) every tool and print where each is."""
    for name in GO_TOOLS:
        started = time.monotonic()
        try:
            path = go_tool(name)
        except GoToolUnavailable as error:
            sys.exit(str(error))
        print(f"tests/tools/{name} in {path} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
