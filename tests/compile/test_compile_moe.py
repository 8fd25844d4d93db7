"""``polymorph compile --model qwen3-moe-tiny`` end to end on the real engine (CPU), as a real
process: the campaign verifies every MoE build against the reference's golden outputs, none
fails, the search varies the MoE knobs, and the build it keeps is stored and verified. It searches
the reference less its torch.compile values (``support.builds``): the MoE layers under
torch.compile are checked directly (``tests/engine_builds/test_fast_knobs.py``,
``test_compiled_layers_agree_with_the_defaults[qwen3-moe-tiny]``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polymorph.contract.store import open_store
from support.builds import eager_reference_build


@pytest.mark.slow  # about 15 s: a campaign of four experiments
def test_a_campaign_on_a_moe_model_keeps_a_verified_build(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "polymorph.cli",
        "compile",
        "--model",
        "qwen3-moe-tiny",
        "--store",
        str(store),
        "--base-build",
        str(eager_reference_build(tmp_path / "base")),
    ]
    cmd += ["--json", "--repeats", "2", "--max-experiments", "4", "--campaign", "moe"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    counts = doc["experiments"]
    assert counts["failed"] == counts["crashed"] == counts["timeout"] == 0, proc.stderr[-3000:]
    assert counts["passed"] == counts["total"] >= 3
    s = open_store(str(store))
    (ledger,) = [k for k in s.list("compilejobs/") if k.endswith(".jsonl")]
    records = s.read_jsonl(ledger)
    assert all(r["status"] == "passed" for r in records)
    assert all(r["inertKnobs"] == [] for r in records)  # on an MoE model the MoE knobs are searched
    kept = doc["best"] or doc["bestCandidate"]
    if kept is not None:
        manifest = s.get_manifest(kept["build"])
        assert manifest.knobs and manifest.figures is not None
