"""``polymorph compile`` as a user meets it: Ctrl-C, SIGTERM, resuming, corrupt documents (issue 9).

Real processes on the tiny CPU model. Each signal stops the campaign with the single line
``interrupted`` (no traceback from the CLI or its engine worker, no leaked-semaphore warning),
exit status 128 + the signal, and ``progress-0.json`` saying ``interrupted`` with the counts
so far; running the same command again resumes from the ledger. A corrupt ledger line or
progress document is one line and exit status 2 before any model loads. The campaigns search the
reference build less its torch.compile values (``support.builds.eager_reference_build``): what
these tests hold does not depend on the candidates, and inductor compiling them would be most of
their CPU time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polymorph.contract.store import open_store
from support.builds import eager_reference_build

POLYMORPH = [sys.executable, "-m", "polymorph.cli"]
FLAGS = ["--max-experiments", "200", "--repeats", "2", "--campaign", "signals"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ANTHROPIC_API_KEY", None)
    env.pop("POLYMORPH_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``--base-build`` of every campaign here (only read)."""
    return eager_reference_build(tmp_path_factory.mktemp("base") / "reference")


def _documents(store: Path) -> tuple[str | None, str | None]:
    """The keys of the campaign's ledger and progress document, once they exist."""
    if not (store / "compilejobs").exists():
        return None, None
    keys = open_store(str(store)).list("compilejobs/")
    ledger = next((k for k in keys if k.endswith("ledger-0.jsonl")), None)
    progress = next((k for k in keys if k.endswith("progress-0.json")), None)
    return ledger, progress


def _interrupt(store: Path, base: Path, signum: int) -> subprocess.CompletedProcess[str]:
    """Start a campaign, send ``signum`` once two experiments are in its ledger, and wait for it."""
    cmd = [*POLYMORPH, "compile", "--store", str(store), *FLAGS, "--base-build", str(base)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True
    )
    s = open_store(str(store))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        ledger, _ = _documents(store)
        if ledger is not None and len(s.read_jsonl(ledger)) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the campaign ended before it could be interrupted"
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)  # Ctrl-C reaches the whole process group, the worker too
    else:
        proc.send_signal(signum)  # kubelet and `kill` signal the process alone
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_campaign_with_one_line_and_it_resumes(
    tmp_path: Path, base: Path, signum: int
) -> None:
    store = tmp_path / "store"
    done = _interrupt(store, base, signum)
    assert done.returncode == 128 + signum, done.stderr
    assert "Traceback" not in done.stderr and "leaked" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "interrupted"
    assert "workload scaled down for --device cpu" in done.stdout  # the notice a scaled workload gets
    ledger, progress_key = _documents(store)
    assert ledger is not None and progress_key is not None
    s = open_store(str(store))
    progress = s.get_json(progress_key)
    recorded = len(s.read_jsonl(ledger))
    assert progress["state"] == "interrupted" and progress["stopReason"] == "interrupted"
    assert progress["counts"]["total"] == recorded >= 2
    # The budget is not part of a campaign's identity: a budget of one more experiment resumes it.
    flags = [*FLAGS[2:], "--base-build", str(base), "--max-experiments", str(recorded + 1)]
    again = subprocess.run(
        [*POLYMORPH, "compile", "--store", str(store), *flags, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert again.returncode == 0, again.stderr
    assert f"resuming: {recorded} experiments already in the ledger" in again.stderr
    assert json.loads(again.stdout)["experiments"]["fromLedger"] >= recorded


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory, base: Path) -> Path:
    """A store holding one short finished campaign."""
    store = tmp_path_factory.mktemp("campaign") / "store"
    done = _resume(store, base, timeout=300)
    assert done.returncode == 0, done.stderr
    return store


def _resume(store: Path, base: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The command that runs ``campaign``'s short campaign, and resumes it when run again."""
    cmd = [*POLYMORPH, "compile", "--store", str(store), "--max-experiments", "2", "--repeats", "2"]
    cmd += ["--base-build", str(base)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.mark.parametrize(
    ("document", "content", "needle"),
    [
        ("ledger-0.jsonl", None, "is not valid JSON; the ledger is corrupt"),
        ("progress-0.json", "{not json", "is not valid JSON"),
        ("progress-0.json", "[1, 2]", "its Progress document: must be a mapping of fields"),
    ],
)
def test_a_corrupt_document_on_resume_is_one_line(
    campaign: Path, base: Path, tmp_path: Path, document: str, content: str | None, needle: str
) -> None:
    store = tmp_path / "store"
    shutil.copytree(campaign, store)
    (path,) = store.glob(f"compilejobs/local/*/{document}")
    if content is None:
        path.write_text(path.read_text() + "{not json\n")
    else:
        path.write_text(content)
    started = time.monotonic()
    done = _resume(store, base)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: cannot resume campaign") and needle in lines[0], lines
    assert "--fresh" in lines[0]
    assert time.monotonic() - started < 60
