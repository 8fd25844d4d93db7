#!/usr/bin/env python
"""Serving as a load generator sees it: GuideLLM drives ``polymorph engine serve`` over chat (and completions).

Starts ``polymorph engine serve --model tiny`` (random weights, CPU) on loopback, warms it up with
a few requests on each endpoint, then runs GuideLLM (``guidellm run``, the ``bench`` extra)
against it once per ``--endpoints`` entry, in that order:
``--concurrency`` streams, each sending one request after another, until ``--requests``
requests were sent or ``--max-seconds`` passed. Every request is GuideLLM's own: a synthetic
user message (or prompt) of ``--prompt-tokens`` tokens asking for exactly ``--output-tokens``
tokens (``max_completion_tokens`` with ``ignore_eos``), streamed with
``stream_options.include_usage`` and ``continuous_usage_stats``, GuideLLM's defaults.

GuideLLM counts a prompt's tokens with a Hugging Face tokenizer: for a random-weight shape this
script writes one that is the engine's byte tokenizer (ids 0-255 are the UTF-8 bytes), so both
count alike; a checkpoint directory is its own tokenizer. A chat prompt is longer on the engine
than GuideLLM's message by the chat template's text; GuideLLM takes the engine's ``usage``.

Recorded per endpoint, from GuideLLM's JSON report: requests completed, errored and incomplete,
requests per second, output tokens per second, time to first token, inter-token latency and
request latency (median and p99), tokens per request (prompt as the engine counted it, and
output); and from the engine's ``/metrics`` before and after, the requests it counted ``ok`` and
the prompt and generated tokens it counted, which must match GuideLLM's; the machine's load
average before and after (the cores may be shared).

Run: ``.venv/bin/python bench/serve_guidellm.py --out bench/results/serve-guidellm-tiny-cpu.json``
(``--report-dir DIR`` keeps GuideLLM's own JSON reports too).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from polymorph.contract.inputs import Parser

REPO = Path(__file__).resolve().parents[1]
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""GuideLLM's tokenizer and data are local files: it never reaches for the Hugging Face Hub."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Return once the engine's ``/readyz`` answers 200 (it loads meanwhile)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the engine exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the engine at {url} was not ready within 180 s: {log.read_text()[-2000:]}")


def stop_server(proc: subprocess.Popen[bytes]) -> int | str:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "killed after 60 s"


def byte_tokenizer(directory: Path) -> Path:
    """A Hugging Face tokenizer that is the engine's ``ByteTokenizer``: one id per UTF-8 byte.

    A byte-level BPE without merges (GPT-2's byte-to-character table, id = byte), with the
    byte tokenizer's special ids 256 (BOS) and 257 (EOS).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + n)
    vocab = {chars[b]: b for b in range(256)} | {"<|bos|>": 256, "<|eos|>": 257}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>")
    sample = "héllo wörld"
    if fast.encode(sample, add_special_tokens=False) != list(sample.encode()):
        raise SystemExit("the byte tokenizer written for GuideLLM does not count as the engine's does")
    fast.save_pretrained(str(directory))
    return directory


def warm_up(url: str, requests: int = 8) -> None:
    """A few requests on each endpoint before any is measured, so the first run is not the cold one."""
    for n in range(requests):
        for path, body in (
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": f"warm {n}"}], "max_tokens": 8},
            ),
            ("/v1/completions", {"prompt": f"warm {n}", "max_tokens": 8}),
        ):
            request = urllib.request.Request(
                f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60) as r:
                r.read()


def engine_counts(url: str) -> dict[str, float]:
    """The engine's own count of requests answered ``ok`` and of the tokens it took and generated."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    counts = {"requests_ok": 0.0, "prompt_tokens": 0.0, "generation_tokens": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "polymorph_requests_total" and sample.labels.get("status") == "ok":
                counts["requests_ok"] += sample.value
            elif sample.name == "polymorph_prompt_tokens_total":
                counts["prompt_tokens"] += sample.value
            elif sample.name == "polymorph_generation_tokens_total":
                counts["generation_tokens"] += sample.value
    return counts


def guidellm_command(
    url: str, endpoint: str, tokenizer: Path, report: Path, args: argparse.Namespace
) -> list[str]:
    backend = f"kind=openai_http,target={url},model={args.model_name},request_format={ENDPOINTS[endpoint]}"
    data = f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}"
    return [
        sys.executable, "-m", "guidellm", "run",
        "--backend", backend,
        "--profile", f"kind=concurrent,streams={args.concurrency}",
        "--constraint", f"kind=max_requests,count={args.requests}",
        "--constraint", f"kind=max_duration,seconds={args.max_seconds}",
        "--data", data,
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--seed", f"kind=static,value={args.seed}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip


def stat(metric: dict[str, Any], key: str) -> float | None:
    """``median``, or a percentile such as ``p99``, of GuideLLM's successful requests."""
    ok = metric["successful"]
    if not ok.get("count"):
        return None
    value = ok["median"] if key == "median" else ok["percentiles"][key]
    return round(float(value), 3)


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of GuideLLM's report (one benchmark) that this bench records."""
    bench = report["benchmarks"][0]
    m = bench["metrics"]
    totals = m["request_totals"]
    ok = bench["requests"]["successful"]
    paths = sorted({json.loads(r["request_args"]).get("body", {}).get("messages") is not None for r in ok})
    return {
        "requests": {k: int(totals[k]) for k in ("successful", "errored", "incomplete", "total")},
        "chat_bodies": paths == [True],
        "response_ids": sorted({str(r.get("response_id", "")).split("-", 1)[0] for r in ok}),
        "duration_s": round(float(bench["duration"]), 3),
        "requests_per_s": round(float(m["requests_per_second"]["successful"]["mean"]), 3),
        "output_tokens_per_s": round(float(m["output_tokens_per_second"]["successful"]["mean"]), 2),
        "prompt_tokens_per_request_median": stat(m["prompt_token_count"], "median"),
        "output_tokens_per_request_median": stat(m["output_token_count"], "median"),
        "prompt_tokens_sum": int(m["prompt_token_count"]["successful"]["total_sum"]),
        "output_tokens_sum": int(m["output_token_count"]["successful"]["total_sum"]),
        "ttft_ms_median": stat(m["time_to_first_token_ms"], "median"),
        "ttft_ms_p99": stat(m["time_to_first_token_ms"], "p99"),
        "itl_ms_median": stat(m["inter_token_latency_ms"], "median"),
        "itl_ms_p99": stat(m["inter_token_latency_ms"], "p99"),
        "latency_s_median": stat(m["request_latency"], "median"),
        "latency_s_p99": stat(m["request_latency"], "p99"),
    }


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def endpoint_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ENDPOINTS]
    if not names or bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated from {', '.join(ENDPOINTS)}, each once, got {text!r}"
        )
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="tiny", help="model shape or checkpoint directory")
    p.add_argument(
        "--endpoints",
        type=endpoint_list,
        default="chat,completions",
        help="comma-separated from chat, completions",
    )
    p.add_argument("--concurrency", type=positive_int, default=8, help="GuideLLM's streams")
    p.add_argument("--requests", type=positive_int, default=200, help="requests per endpoint")
    p.add_argument("--max-seconds", type=positive_int, default=120, help="at most this long per endpoint")
    p.add_argument("--prompt-tokens", type=positive_int, default=64, help="tokens per prompt")
    p.add_argument("--output-tokens", type=positive_int, default=32, help="tokens per answer")
    p.add_argument("--max-batch", type=positive_int, default=8, help="the engine's --max-batch")
    p.add_argument("--seed", type=int, default=0, help="GuideLLM's synthetic data seed")
    p.add_argument("--report-dir", type=Path, help="keep GuideLLM's JSON reports here (default: not kept)")
    p.add_argument("--out", type=Path, help="write the result here")
    args = p.parse_args(argv)  # fmt: skip
    args.model_name = Path(args.model).name if Path(args.model).is_dir() else args.model
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        guidellm_version = importlib.metadata.version("guidellm")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            "GuideLLM is not installed in this environment: pip install -e '.[bench]' (make venv installs it)."
        ) from None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the engine is stopped on the way out
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **OFFLINE}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [
        sys.executable, "-m", "polymorph.cli", "engine", "serve", "--model", args.model,
        "--host", "127.0.0.1", "--port", str(port), "--max-batch", str(args.max_batch),
    ]  # fmt: skip
    results: dict[str, Any] = {}
    commands: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="polymorph-guidellm-") as tmp_name:
        tmp = Path(tmp_name)
        log = tmp / "engine.log"
        proc = subprocess.Popen(serve, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        try:
            tokenizer = Path(args.model) if Path(args.model).is_dir() else byte_tokenizer(tmp / "tokenizer")
            wait_ready(proc, url, log)
            warm_up(url)
            load_before = os.getloadavg()
            for endpoint in args.endpoints:
                report = (args.report_dir or tmp) / f"guidellm-{endpoint}.json"
                report.parent.mkdir(parents=True, exist_ok=True)
                command = guidellm_command(url, endpoint, tokenizer, report, args)
                commands[endpoint] = shlex.join(["guidellm", *command[3:]]).replace(str(tmp), "$TMP")
                print(f"{endpoint}: {commands[endpoint]}", file=sys.stderr, flush=True)
                before = engine_counts(url)
                done = subprocess.run(command, env={**env, "GUIDELLM__MAX_WORKER_PROCESSES": "1"},
                                      capture_output=True, text=True, check=False)  # fmt: skip
                after = engine_counts(url)
                if done.returncode != 0 or not report.exists():
                    raise SystemExit(
                        f"guidellm failed on {endpoint} (exit {done.returncode}): "
                        f"{(done.stderr or done.stdout)[-3000:]}"
                    )
                results[endpoint] = {
                    "endpoint": ENDPOINTS[endpoint],
                    "guidellm": summarise(json.loads(report.read_text())),
                    "engine_counted": {k: int(after[k] - before[k]) for k in after},
                }
            load_after = os.getloadavg()
        finally:
            exit_status = stop_server(proc)
            engine_log = log.read_text(errors="replace")
    doc = {
        "benchmark": "serve_guidellm",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        },
        "versions": {
            "guidellm": guidellm_version,
            "torch": importlib.metadata.version("torch"),
            "transformers": importlib.metadata.version("transformers"),
        },
        "device": "cpu",
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip(),
        "engine": {
            "command": shlex.join(serve[1:]),
            "model": f"{args.model} (random weights)" if not Path(args.model).is_dir() else args.model,
            "exit_status": exit_status,
            "traceback_in_log": "Traceback" in engine_log,
        },
        "load": {
            "generator": "guidellm run (profile concurrent, synthetic_text data)",
            "concurrency": args.concurrency,
            "requests_per_endpoint": args.requests,
            "max_seconds_per_endpoint": args.max_seconds,
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "seed": args.seed,
        },
        "guidellm_commands": commands,
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
