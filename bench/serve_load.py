#!/usr/bin/env python
"""Serving under load: 200 concurrent clients (half streaming) against the engine, old server beside new.

Starts, on loopback, two ``polymorph engine serve`` processes over the same tiny CPU model and
reference build:
- **new**: this tree's server (aiohttp, admission control: 503 with Retry-After past
  ``--max-batch`` + ``--max-queue`` admitted requests);
- **old**: the hand-written ``http.server`` engine taken from git history (``--old-commit``,
  by default the last commit before the aiohttp server) with ``git show`` into a temporary
  package, so nothing of it stays in the tree.

Both servers stay up; each gets the same load in ``--rounds`` rounds, interleaved (old, new, old,
new, ...) so a busy machine weighs on both alike. A round is ``--clients`` concurrent clients,
every other one streaming (SSE), each sending ``--requests`` completions one after another
on its own connection. A 503 is retried after its Retry-After, up to ``--retries`` times;
every attempt's answer is counted. Recorded per server: wall time, completed requests per
second and output tokens per second, TTFT p50/p99 (streaming clients: request sent to first
token event), end-to-end latency p50/p99, counts of 200, 503 (and whether each had
Retry-After) and anything else (other statuses, resets, timeouts, by kind), and whether
``/healthz`` and ``/readyz`` answer 200 afterwards.

Run: ``.venv/bin/python bench/serve_load.py --out bench/results/serve-load-tiny-cpu.json``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "52b080e"
"""The last commit whose engine served over ``http.server`` (before issue 9's aiohttp server)."""
OLD_FILES = ("cli.py", "metrics.py", "openai_api.py", "server.py", "service.py", "trace.py")

# Starts the old engine from a package of its files, imported under another name.
OLD_LAUNCHER = """
import argparse, sys
from polymorph_old_serving import cli
parser = argparse.ArgumentParser()
cli.configure(parser)
sys.exit(cli.run(parser.parse_args(sys.argv[1:])))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def old_package(commit: str, into: Path) -> Path:
    """The old ``polymorph_engine/serving`` files at ``commit`` as package ``polymorph_old_serving``."""
    pkg = into / "polymorph_old_serving"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name in OLD_FILES:
        text = subprocess.run(
            ["git", "show", f"{commit}:engine_image/polymorph_engine/serving/{name}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (pkg / name).write_text(text.replace("polymorph_engine.serving.", "polymorph_old_serving."))
    (into / "launch_old.py").write_text(OLD_LAUNCHER)
    return into / "launch_old.py"


def start_server(command: list[str], port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).split(b" ", 2)[1:2] == [b"200"]:
                    return proc
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the server on port {port} did not become ready: {log.read_text()[-2000:]}")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def client(
    url: str, index: int, args: argparse.Namespace, counts: Counter[str], ttfts: list[float], lat: list[float]
) -> int:
    """One client on its own connection; returns the output tokens it received."""
    stream = index % 2 == 1
    tokens = 0
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=1)) as session:
        for n in range(args.requests):
            body = {
                "model": "tiny",
                "prompt": f"client {index} request {n}: the quick brown fox",
                "max_tokens": args.max_tokens,
                "stream": stream,
                **({"stream_options": {"include_usage": True}} if stream else {}),
            }
            for _attempt in range(args.retries + 1):
                sent = time.monotonic()
                try:
                    async with session.post(f"{url}/v1/completions", json=body) as r:
                        if r.status == 503:
                            counts["503" if "Retry-After" in r.headers else "503 without Retry-After"] += 1
                            await r.read()
                            await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                            continue
                        if r.status != 200:
                            counts[f"other: HTTP {r.status}"] += 1
                            await r.read()
                            break
                        if stream:
                            first = None
                            async for line in r.content:
                                if not line.startswith(b"data: {"):
                                    continue
                                event = json.loads(line[len(b"data: ") :])
                                if event.get("usage"):
                                    tokens += int(event["usage"]["completion_tokens"])
                                elif event.get("choices") and event["choices"][0]["text"]:
                                    first = first or time.monotonic()
                            if first is not None:
                                ttfts.append(first - sent)
                        else:
                            doc = await r.json()
                            tokens += int(doc["usage"]["completion_tokens"])
                        counts["200"] += 1
                        lat.append(time.monotonic() - sent)
                        break
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    counts[f"other: {type(exc).__name__}"] += 1
                    break
    return tokens


async def load(url: str, args: argparse.Namespace) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    ttfts: list[float] = []
    lat: list[float] = []
    started = time.monotonic()
    tokens = await asyncio.gather(*(client(url, i, args, counts, ttfts, lat) for i in range(args.clients)))
    wall = time.monotonic() - started
    health: dict[str, int | str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for probe in ("healthz", "readyz"):
            try:
                async with session.get(f"{url}/{probe}") as r:
                    health[probe] = r.status
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                health[probe] = type(exc).__name__
    return {
        "wall_s": round(wall, 3),
        "requests_ok": counts["200"],
        "requests_per_s": round(counts["200"] / wall, 2),
        "output_tokens_per_s": round(sum(tokens) / wall, 1),
        "ttft_p50_ms": None if not ttfts else round(1000 * (pct(ttfts, 0.5) or 0), 1),
        "ttft_p99_ms": None if not ttfts else round(1000 * (pct(ttfts, 0.99) or 0), 1),
        "latency_p50_ms": None if not lat else round(1000 * (pct(lat, 0.5) or 0), 1),
        "latency_p99_ms": None if not lat else round(1000 * (pct(lat, 0.99) or 0), 1),
        "counts": dict(sorted(counts.items())),
        "other": sum(v for k, v in counts.items() if k not in ("200", "503")),
        "health_after": health,
    }


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts summed over rounds; rates and TTFT p50 as the median round, TTFT p99 and wall as the worst."""
    counts: Counter[str] = Counter()
    for r in rounds:
        counts.update(r["counts"])

    def med(key: str) -> float | None:
        values = [r[key] for r in rounds if r[key] is not None]
        return statistics.median(values) if values else None

    def worst(key: str) -> float | None:
        values = [r[key] for r in rounds if r[key] is not None]
        return max(values) if values else None

    return {
        "rounds": len(rounds),
        "requests_per_s_median": med("requests_per_s"),
        "output_tokens_per_s_median": med("output_tokens_per_s"),
        "ttft_p50_ms_median": med("ttft_p50_ms"),
        "ttft_p99_ms_worst": worst("ttft_p99_ms"),
        "latency_p99_ms_worst": worst("latency_p99_ms"),
        "wall_s_worst": worst("wall_s"),
        "counts": dict(sorted(counts.items())),
        "other": sum(v for k, v in counts.items() if k not in ("200", "503")),
        "healthy_after_every_round": all(
            r["health_after"] == {"healthz": 200, "readyz": 200} for r in rounds
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--requests", type=int, default=2, help="completions per client, one after another")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--retries", type=int, default=3, help="retries of a 503, after its Retry-After")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a client waits for one answer")
    p.add_argument("--old-commit", default=OLD_COMMIT)
    p.add_argument("--only", choices=["old", "new"], help="run one server only")
    p.add_argument("--rounds", type=int, default=3, help="load rounds per server, interleaved old/new")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    for flag in ("clients", "requests", "max_tokens", "max_batch", "max_queue", "rounds"):
        if getattr(args, flag) < 1:
            raise SystemExit(
                f"--{flag.replace('_', '-')} must be a positive integer; got {getattr(args, flag)}"
            )
    if args.retries < 0 or not args.timeout > 0:
        raise SystemExit(
            f"--retries must be >= 0 and --timeout positive; got {args.retries} and {args.timeout}"
        )

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="polymorph-serve-load-") as tmp:
        launcher = old_package(args.old_commit, Path(tmp))
        common = ["--model", "tiny", "--max-batch", str(args.max_batch), "--host", "127.0.0.1"]
        servers = {
            "new": lambda port: [sys.executable, "-m", "polymorph.cli", "engine", "serve", *common,
                                 "--port", str(port), "--max-queue", str(args.max_queue)],
            "old": lambda port: [sys.executable, str(launcher), "serve", *common, "--port", str(port)],
        }  # fmt: skip
        names = [n for n in ("old", "new") if not args.only or n == args.only]
        procs: dict[str, tuple[subprocess.Popen[bytes], int, Path]] = {}
        try:
            for name in names:
                port = free_port()
                command = servers[name](port)
                run_env = {**env, "PYTHONPATH": f"{tmp}{os.pathsep}{env.get('PYTHONPATH', '')}"}
                log = Path(tmp) / f"{name}.log"
                procs[name] = (start_server(command, port, run_env, log), port, log)
                results[name] = {"command": shlex.join(command[1:]), "rounds": []}
            for round_ in range(args.rounds):  # interleaved, so a busy machine weighs on both alike
                for name in names:
                    print(
                        f"round {round_ + 1}: {name}, {args.clients} clients ...", file=sys.stderr, flush=True
                    )
                    one = asyncio.run(load(f"http://127.0.0.1:{procs[name][1]}", args))
                    results[name]["rounds"].append(one)
        finally:
            for name, (proc, _, log) in procs.items():
                proc.send_signal(signal.SIGTERM)
                try:
                    results[name]["exit_status"] = proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    results[name]["exit_status"] = "killed after 60 s"
                results[name]["traceback_in_log"] = "Traceback" in log.read_text(errors="replace")
        for name in names:
            results[name]["summary"] = summarise(results[name]["rounds"])
            print(json.dumps({name: results[name]["summary"]}, indent=2), file=sys.stderr, flush=True)
    doc = {
        "benchmark": "serve_load",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "load": {
            "clients": args.clients,
            "streaming_clients": args.clients // 2,
            "requests_per_client": args.requests,
            "max_tokens": args.max_tokens,
            "retries_of_503": args.retries,
            "max_batch": args.max_batch,
            "max_queue_new": args.max_queue,
            "model": "tiny (random weights, CPU)",
        },
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip(),
        "old_commit": args.old_commit,
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
