"""Record a whole compile campaign as a benchmark result.

Runs ``polymorph compile --json`` with the given flags in a fresh store, and writes its final
object together with the device, versions, date and command to ``--out``:

    python bench/compile_campaign.py --out bench/results/compile-llama-8b-h200.json -- \\
        --model llama-8b --device cuda --dtype bfloat16 --max-experiments 16 --deadline 4m

Everything after ``--`` goes to ``polymorph compile`` unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _device() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cpus": os.cpu_count(), "cudaDevices": torch.cuda.device_count()}
    if torch.cuda.is_available():
        info |= {"type": "cuda", "name": torch.cuda.get_device_name(0)}
    else:
        info |= {"type": "cpu", "name": platform.processor() or platform.machine()}
    return info


def _versions() -> dict[str, str]:
    import torch

    from polymorph import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "polymorph": __version__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument("compile_args", nargs=argparse.REMAINDER, help="-- then flags for polymorph compile")
    args = parser.parse_args()
    flags = [a for a in args.compile_args if a != "--"]
    with tempfile.TemporaryDirectory(prefix="polymorph-bench-store-") as store:
        command = [sys.executable, "-m", "polymorph.cli", "compile", "--json", "--store", store, *flags]
        started = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True)
        wall_s = time.monotonic() - started
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        print(f"polymorph compile exited {proc.returncode}", file=sys.stderr)
        return proc.returncode
    doc = {
        "result": json.loads(proc.stdout),
        "wallSeconds": round(wall_s, 1),
        "device": _device(),
        "versions": _versions(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/compile_campaign.py", "--out", str(args.out), "--", *flags]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
