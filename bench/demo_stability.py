"""Does the demo's verdict hold up? ``polymorph compile`` on its embedded defaults, N times.

Each run is ``polymorph compile --json --fresh`` with no other flag (what ``make demo`` runs:
the tiny model on CPU, the sample workload, the search agent, 30 experiments), in a fresh
store. For each run it records the verdict (``state``), the paired speedup and its 95%
interval, the confirmation's speedup and interval, the experiment counts and the wall time.
A run *holds up* when it ends ``improved`` (a win confirmed by a second paired measurement)
within ``--limit`` seconds (default 180). ``--busy`` keeps one core busy with a spin loop in a
background process during the runs (the machine is not idle; neither are users' laptops).

    .venv/bin/python bench/demo_stability.py --runs 10 --out bench/results/demo-stability-idle.json
    .venv/bin/python bench/demo_stability.py --runs 5 --busy --out bench/results/demo-stability-busy.json

The result records the device, versions, date, the exact command, every run and a summary
(``heldUp`` of ``runs``, the slowest wall time). Exit status 0 when every run held up.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from polymorph import __version__


def _spin() -> None:
    """Keep one core busy until terminated."""
    x = 0
    while True:
        x = (x + 1) % 1_000_003


def _commit() -> str:
    """The repository's HEAD commit (with ``+dirty`` when the work tree differs), or ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_once(limit_s: float) -> dict[str, Any]:
    """One ``polymorph compile`` on its defaults in a fresh store, and what it reported."""
    with tempfile.TemporaryDirectory(prefix="polymorph-demo-store-") as store:
        command = [sys.executable, "-m", "polymorph.cli", "compile", "--json", "--fresh", "--store", store]
        load_before = _load()
        started = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=limit_s * 3)
            returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            returncode, stdout, stderr = -1, "", str(exc)
        wall_s = time.monotonic() - started
    run: dict[str, Any] = {"wallS": round(wall_s, 1), "exit": returncode, "loadBefore": load_before}
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        run |= {"state": "error", "error": stderr[-600:]}
        run["heldUp"] = False
        return run
    best, cand = doc.get("best"), doc.get("bestCandidate")
    shown = best or cand or {}
    run |= {
        "state": doc["state"],
        "message": doc["message"],
        "speedup": shown.get("speedup"),
        "ci": shown.get("ci"),
        "pairs": shown.get("pairs"),
        "confirmedSpeedup": best.get("confirmedSpeedup") if best else None,
        "confirmedCi": best.get("confirmedCi") if best else None,
        "knobs": best.get("knobs") if best else None,
        "experiments": doc["experiments"]["total"],
        "overhead": doc["overhead"],
        "experimentsPerHour": doc["experimentsPerHour"],
        "stopReason": doc["stopReason"],
    }
    run["heldUp"] = doc["state"] == "improved" and wall_s < limit_s
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="campaigns to run (default 10)")
    parser.add_argument("--busy", action="store_true", help="keep one core busy with a spin loop meanwhile")
    parser.add_argument(
        "--limit", type=float, default=180.0, help="seconds a run may take to count (default 180)"
    )
    parser.add_argument("--out", type=Path, help="where to write the JSON result (default: stdout only)")
    args = parser.parse_args()
    if args.runs < 1:
        raise SystemExit(f"--runs must be a positive integer; got {args.runs}")
    if not args.limit > 0:
        raise SystemExit(f"--limit must be a positive number of seconds; got {args.limit}")
    spinner = None
    if args.busy:
        spinner = mp.get_context("spawn").Process(target=_spin, name="demo-stability-spin", daemon=True)
        spinner.start()
    runs: list[dict[str, Any]] = []
    try:
        for i in range(args.runs):
            run = run_once(args.limit)
            runs.append(run)
            print(
                f"run {i + 1}/{args.runs}: {run['state']} speedup={run.get('speedup')} ci={run.get('ci')} "
                f"confirmed={run.get('confirmedSpeedup')} wall={run['wallS']}s load={run['loadBefore']}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if spinner is not None:
            spinner.terminate()
            spinner.join()
    held = sum(1 for r in runs if r["heldUp"])
    doc = {
        "benchmark": "demo-stability",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": {"type": "cpu", "cpus": os.cpu_count(), "name": platform.processor() or platform.machine()},
        "versions": {
            "python": platform.python_version(),
            "torch": importlib.metadata.version("torch"),  # the campaigns import it, not this script
            "polymorph": __version__,
        },
        "commit": _commit(),
        "busyCore": args.busy,
        "limitS": args.limit,
        "summary": {
            "runs": len(runs),
            "heldUp": held,
            "improved": sum(1 for r in runs if r.get("state") == "improved"),
            "maxWallS": max((r["wallS"] for r in runs), default=0.0),
            "speedups": [r.get("speedup") for r in runs],
            "confirmedSpeedups": [r.get("confirmedSpeedup") for r in runs],
        },
        "runs": runs,
    }
    text = json.dumps(doc, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if held == len(runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
