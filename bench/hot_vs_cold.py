#!/usr/bin/env python
"""Hot vs cold experiments: the product's headline number.

The same N builds (the reference plus knob variants) go through the same protocol
(``experiment.run_experiment``: load the build, verify against golden outputs, benchmark the
workload) two ways:

- cold: a fresh Python process per experiment: imports, device init, weights read from a
  checkpoint on disk, the golden outputs read from disk, then load + verify + bench;
- hot: one ``Supervisor`` worker that loaded the weights once; each experiment swaps a build.

``cold_s_per_experiment`` is the mean wall time of a cold process, spawn to exit;
``hot_s_per_experiment`` the mean wall time of ``Supervisor.run`` (pipe round trip included),
with the worker's one-time start reported apart as ``hot_start_s``; ``ratio`` = cold / hot.
Since both ways do the same verify + bench work, ``*_overhead_s_per_experiment`` subtract it
(per record timings) and ``overhead_ratio`` compares what remains: the swap versus a restart.

It also reports, per build, batch-1 decode tok/s and its fraction of the memory roofline:
bytes per token = weight bytes + KV bytes read at the mean context; roofline tok/s = copy
bandwidth / bytes per token, the bandwidth measured in this run by a large device-to-device
copy (bytes read + written / time). On CUDA, timings synchronise the device; CUDA events time
the decode loop.

Run: ``python bench/hot_vs_cold.py --model tiny --json [--out bench/results/NAME.json]``;
on a GPU: ``--model llama-8b --device cuda --dtype bfloat16``. Random weights are saved as an
HF checkpoint (safetensors) under ``--workdir`` (default: a temp dir) so cold runs read real
files. On CPU it pins torch to ``--threads`` (default 1) in every process, hot and cold alike.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Knob sets tried, in order: the reference first, then one knob at a time, then combinations.
VARIANTS: list[dict[str, Any]] = [
    {},
    {"kv_cache": "static"},
    {"fused_qkv": True},
    {"fused_gate_up": True},
    {"attention": "sdpa"},
    {"sampling": "device"},
    {
        "kv_cache": "static",
        "fused_qkv": True,
        "fused_gate_up": True,
        "attention": "sdpa",
        "sampling": "device",
    },
    {
        "kv_cache": "static",
        "fused_qkv": True,
        "fused_gate_up": True,
        "attention": "sdpa",
        "sampling": "device",
        "decode_capture": "cuda_graph",
    },
    # The whole decode step under one CUDA graph, Triton kernels, one capture bucket (issue 12's K1).
    {
        "kv_cache": "static",
        "decode_step": "fused",
        "kernels": "triton",
        "capture_buckets": "max",
        "sampling": "device",
    },
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Hot-swap vs cold-start experiment throughput.")
    p.add_argument("--model", default="tiny", help="model shape (tiny, llama-1b, llama-8b, ...)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--builds", type=int, default=6, help=f"how many builds (1..{len(VARIANTS)})")
    p.add_argument("--repeats", type=int, default=3, help="measured benchmark passes per experiment")
    p.add_argument("--warmup", type=int, default=1, help="warm-up passes per experiment")
    p.add_argument(
        "--requests", type=int, help="benchmark requests per pass (default: DEVICE_SCALE for the device)"
    )
    p.add_argument("--max-input", type=int, help="longest prompt after scaling (default: DEVICE_SCALE)")
    p.add_argument("--max-output", type=int, help="longest output after scaling (default: DEVICE_SCALE)")
    p.add_argument("--concurrency", type=int, help="scheduler batch size cap (default: DEVICE_SCALE)")
    p.add_argument("--verify-prompts", type=int, default=4)
    p.add_argument("--verify-steps", type=int, default=16)
    p.add_argument(
        "--decode-steps", type=int, default=0, help="batch-1 decode steps timed (0: 32 CPU, 128 CUDA)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per process when --device cpu")
    p.add_argument("--experiment-timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--workdir",
        help="a fast local disk for the checkpoint and builds (kept); default: a temp dir, removed",
    )
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--json", action="store_true", help="print the JSON result (else a summary)")
    p.add_argument("--cold-child", help=argparse.SUPPRESS)  # internal: run one cold experiment
    p.add_argument("--golden", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    return p


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _set_threads(args: argparse.Namespace) -> None:
    import torch

    if args.device == "cpu" and args.threads:
        torch.set_num_threads(args.threads)


def _save_workload(workload: Any, path: Path) -> None:
    requests = [[r.input_tokens, r.output_tokens, r.arrival_s] for r in workload.requests]
    path.write_text(
        json.dumps({"requests": requests, "concurrency": workload.concurrency, "digest": workload.digest})
    )


def _load_workload(path: Path) -> Any:
    from polymorph.contract.workload import RequestShape, Workload

    doc = json.loads(path.read_text())
    return Workload(tuple(RequestShape(*r) for r in doc["requests"]), doc["concurrency"], doc["digest"])


def _fixed_settings(args: argparse.Namespace) -> Any:
    """The fixed protocol (exactly --warmup and --repeats passes, wall clock) for hot and cold alike,
    not the adaptive one, so that both sides do the same work."""
    from polymorph_engine.experiment.settings import BenchSettings

    return BenchSettings(
        repeats=args.repeats,
        warmup=args.warmup,
        max_repeats=args.repeats,
        max_warmup=args.warmup,
        clock="wall",
        seed=args.seed,
    )


def cold_child(args: argparse.Namespace) -> int:
    """One cold experiment: everything a fresh engine process does, then one JSON line on stdout."""
    started = time.perf_counter()
    import torch

    from polymorph.contract.api import Gates
    from polymorph_engine.experiment.run import run_experiment
    from polymorph_engine.experiment.verify import Golden
    from polymorph_engine.runtime.checkpoint import load_model
    from polymorph_engine.runtime.hotreload import Engine

    _set_threads(args)
    imported = time.perf_counter()
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    _sync(args.device)
    loaded = time.perf_counter()
    reference = Golden.load(args.golden)
    workload = _load_workload(Path(args.workload))
    settings = _fixed_settings(args)
    record = run_experiment(Engine(model), args.cold_child, workload, Gates(), reference, settings=settings)
    done = time.perf_counter()
    phases = {"importS": imported - started, "weightsS": loaded - imported, "experimentS": done - loaded}
    print(
        json.dumps(
            {"record": json.loads(record.model_dump_json()), "phases": phases, "torch": torch.__version__}
        )
    )
    return 0


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes per second moved (read + written) by one large device-to-device copy, best of 5."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    del src, dst
    return 2 * nbytes / best


def decode_bytes_per_step(config: Any, elem_bytes: int, context: float, batch: int = 1) -> float:
    """The fewest bytes one decode step of ``batch`` rows must read: the memory roofline's numerator.

    Every weight once, except the input embedding: a step reads one row of it per sequence, so an
    untied table counts as ``batch`` rows, and a tied one once, as the head (its rows are then
    read anyway). Plus each row's KV cache at ``context`` positions (keys and values, all layers).
    A Mixture-of-Experts layer reads its router and only the experts the batch selects: with
    ``batch`` rows each choosing k of E uniformly, E * (1 - (1 - k/E)^batch) distinct experts on
    average (``expected_experts``), each 3 * H * I weights.
    """
    from polymorph_engine.runtime.checkpoint import weight_shapes

    c = config
    params = sum(math.prod(shape) for shape in weight_shapes(c).values())
    if not c.tie_word_embeddings:
        params -= c.vocab_size * c.hidden_size - batch * c.hidden_size
    sparse = sum(1 for i in range(c.num_hidden_layers) if c.moe_layer(i))
    if sparse:
        per_expert = 3 * c.hidden_size * c.moe_intermediate_size
        read = expected_experts(c.num_experts, c.num_experts_per_tok, batch)
        params -= sparse * (c.num_experts - read) * per_expert
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * context * batch
    return elem_bytes * (params + kv)


def expected_experts(experts: int, per_token: int, batch: int) -> float:
    """Distinct experts ``batch`` rows select on average, each choosing ``per_token`` of ``experts``
    uniformly: E * (1 - (1 - k/E)^B)."""
    return experts * (1 - (1 - per_token / experts) ** batch)


def decode_batch1(engine: Any, build: Path, prompt_len: int, steps: int, device: str) -> float:
    """Batch-1 greedy decode tok/s of ``build``: ``steps`` timed steps after a short warm-up."""
    import torch

    hotpath = engine.load_build(build).hotpath
    cache = hotpath.new_cache(1, prompt_len + steps + 16)
    slots = torch.zeros(1, dtype=torch.int64)  # on the CPU, as the hot-path contract asks
    prompt = torch.arange(prompt_len, dtype=torch.int64, device=device) % engine.model.config.vocab_size
    token = hotpath.sample(hotpath.prefill(cache, 0, prompt)[None])
    for _ in range(8):  # warm-up: kernels, allocator, captured graphs
        token = hotpath.sample(hotpath.decode(cache, slots, token))
    _sync(device)
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            token = hotpath.sample(hotpath.decode(cache, slots, token))
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        t = time.perf_counter()
        for _ in range(steps):
            token = hotpath.sample(hotpath.decode(cache, slots, token))
        seconds = time.perf_counter() - t
    hotpath.free(cache, 0)
    del cache
    engine.unload()
    return steps / seconds


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    from polymorph.contract.api import Gates
    from polymorph.contract.builds import REFERENCE_BUILD, knob_variant
    from polymorph.contract.workload import DEFAULT_WORKLOAD, fit_workload, workload_from_profile
    from polymorph_engine.experiment.run import DEVICE_SCALE
    from polymorph_engine.experiment.supervisor import Supervisor
    from polymorph_engine.experiment.verify import default_prompts, golden
    from polymorph_engine.runtime.checkpoint import load_model, save_checkpoint
    from polymorph_engine.runtime.hotreload import Engine

    _set_threads(args)
    t = time.perf_counter()
    model = load_model(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    checkpoint = save_checkpoint(model, work / "checkpoint")
    setup_s = time.perf_counter() - t
    config = model.config
    builds = []
    for i, knobs in enumerate(VARIANTS[: args.builds]):
        name = "reference" if not knobs else "-".join(f"{k}={v}" for k, v in knobs.items())
        builds.append((knobs, knob_variant(REFERENCE_BUILD, knobs, work / f"build-{i}", name=name[:60])))
    caps = dict(DEVICE_SCALE["cuda" if args.device.startswith("cuda") else "cpu"])
    for key, value in (
        ("max_requests", args.requests),
        ("max_input", args.max_input),
        ("max_output", args.max_output),
        ("max_concurrency", args.concurrency),
    ):
        if value is not None:
            caps[key] = value
    profile_workload = workload_from_profile(
        DEFAULT_WORKLOAD, n=max(64, caps["max_requests"]), seed=args.seed
    )
    workload = fit_workload(profile_workload, **caps)
    _save_workload(workload, work / "workload.json")
    reference = golden(model, default_prompts(config.vocab_size, args.verify_prompts), args.verify_steps)
    reference.save(work / "golden.pt")

    # Batch-1 decode against the memory roofline, in this process, before the model is freed.
    on_cuda = args.device.startswith("cuda")
    bandwidth = copy_bandwidth(args.device, (1 << 30) if on_cuda else (256 << 20))
    prompt_len, steps = (128, args.decode_steps or 128) if on_cuda else (16, args.decode_steps or 32)
    elem = torch.empty((), dtype=model.dtype).element_size()
    bytes_per_token = decode_bytes_per_step(config, elem, prompt_len + steps / 2)
    kv_bytes = bytes_per_token - decode_bytes_per_step(config, elem, 0)
    weight_bytes = int(bytes_per_token - kv_bytes)
    roofline = bandwidth / bytes_per_token
    engine = Engine(model)
    decode = [decode_batch1(engine, build, prompt_len, steps, args.device) for _, build in builds]
    engine.close()
    del engine, model, reference
    gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()

    # Hot: one worker, weights loaded once, a swap per experiment.
    settings = _fixed_settings(args)
    threads = args.threads if args.device == "cpu" else None
    supervisor = Supervisor(
        str(checkpoint),
        args.device,
        args.dtype,
        workload,
        Gates(),
        args.experiment_timeout,
        seed=args.seed,
        settings=settings,
        verify_prompts=args.verify_prompts,
        verify_steps=args.verify_steps,
        fit=False,
        threads=threads,
    )
    with supervisor:
        hot_start_s = supervisor.stats.load_seconds[0]
        hot_records, hot_s = [], []
        for _, build in builds:
            t = time.perf_counter()
            hot_records.append(supervisor.run(build))
            hot_s.append(time.perf_counter() - t)

    # Cold: a fresh process per experiment, the same protocol.
    cold_records, cold_s, cold_phases = [], [], []
    for _, build in builds:
        command = [sys.executable, str(Path(__file__).resolve()), "--cold-child", str(build)]
        command += [
            "--model",
            str(checkpoint),
            "--device",
            args.device,
            "--dtype",
            args.dtype,
            "--seed",
            str(args.seed),
        ]
        command += [
            "--repeats",
            str(args.repeats),
            "--warmup",
            str(args.warmup),
            "--threads",
            str(args.threads),
        ]
        command += ["--golden", str(work / "golden.pt"), "--workload", str(work / "workload.json")]
        t = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=args.experiment_timeout + 600, check=False
        )
        cold_s.append(time.perf_counter() - t)
        if done.returncode != 0:
            raise SystemExit(
                f"a cold experiment failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        out = json.loads(done.stdout.strip().splitlines()[-1])
        cold_records.append(out["record"])
        cold_phases.append(out["phases"])

    cold_mean, hot_mean = sum(cold_s) / len(cold_s), sum(hot_s) / len(hot_s)
    # What each way pays besides verify + bench (the work both share): hot, the swap and the pipe;
    # cold, process start, imports, device init, weights, golden and the swap.
    hot_overhead = [s - r.timings.verifyS - r.timings.benchS for s, r in zip(hot_s, hot_records, strict=True)]
    cold_overhead = [
        s - r["timings"]["verifyS"] - r["timings"]["benchS"]
        for s, r in zip(cold_s, cold_records, strict=True)
    ]
    hot_overhead_mean = sum(hot_overhead) / len(hot_overhead)
    cold_overhead_mean = sum(cold_overhead) / len(cold_overhead)
    per_build = []
    for i, (knobs, _build) in enumerate(builds):
        hot, cold = hot_records[i], cold_records[i]
        per_build.append(
            {
                "name": hot.name,
                "knobs": knobs,
                "build": hot.build,
                "hotStatus": hot.status,
                "coldStatus": cold["status"],
                "hotS": round(hot_s[i], 4),
                "coldS": round(cold_s[i], 4),
                "hotOutputTokensPerSecond": hot.figures.outputTokensPerSecond if hot.figures else None,
                "coldOutputTokensPerSecond": (cold["figures"] or {}).get("outputTokensPerSecond"),
                "hotTimings": hot.timings.model_dump(),
                "coldPhases": {k: round(v, 4) for k, v in cold_phases[i].items()},
                "decodeBatch1TokensPerSecond": round(decode[i], 2),
                "rooflineFraction": round(decode[i] / roofline, 4),
                "error": hot.error or cold.get("error"),
            }
        )
    device_name = torch.cuda.get_device_name() if on_cuda else (platform.processor() or platform.machine())
    return {
        "cold_s_per_experiment": round(cold_mean, 4),
        "hot_s_per_experiment": round(hot_mean, 4),
        "ratio": round(cold_mean / hot_mean, 2),
        "cold_experiments_per_hour": round(3600 / cold_mean, 1),
        "hot_experiments_per_hour": round(3600 / hot_mean, 1),
        "hot_start_s": round(hot_start_s, 3),
        "hot_overhead_s_per_experiment": round(hot_overhead_mean, 4),
        "cold_overhead_s_per_experiment": round(cold_overhead_mean, 4),
        "overhead_ratio": round(cold_overhead_mean / max(hot_overhead_mean, 1e-9), 1),
        "setup_s": round(setup_s, 3),
        "builds": per_build,
        "all_passed": all(b["hotStatus"] == b["coldStatus"] == "passed" for b in per_build),
        "roofline": {
            "copyBandwidthGBps": round(bandwidth / 1e9, 2),
            "weightBytes": weight_bytes,
            "kvBytesPerToken": int(kv_bytes),
            "bytesPerToken": int(bytes_per_token),
            "rooflineTokensPerSecond": round(roofline, 2),
            "promptTokens": prompt_len,
            "decodeSteps": steps,
        },
        "protocol": {
            "model": args.model,
            "dtype": args.dtype,
            "requests": len(workload.requests),
            "concurrency": workload.concurrency,
            "inputTokens": [r.input_tokens for r in workload.requests],
            "outputTokens": [r.output_tokens for r in workload.requests],
            "repeats": args.repeats,
            "warmup": args.warmup,
            "verifyPrompts": args.verify_prompts,
            "verifySteps": args.verify_steps,
            "threads": threads,
        },
        "device": {
            "type": args.device,
            "name": device_name,
            "cpus": os.cpu_count(),
            "cudaDevices": torch.cuda.device_count() if on_cuda else 0,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "polymorph": _version(),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("polymorph")
    except PackageNotFoundError:
        return "unknown"


def _summary(result: dict[str, Any]) -> str:
    lines = [
        f"cold: {result['cold_s_per_experiment']:.3f} s/experiment ({result['cold_experiments_per_hour']:.0f}/h)",
        f"hot:  {result['hot_s_per_experiment']:.3f} s/experiment ({result['hot_experiments_per_hour']:.0f}/h), "
        f"worker start {result['hot_start_s']:.2f} s once",
        f"ratio: {result['ratio']:.1f}x end to end; overhead besides verify + bench: "
        f"cold {result['cold_overhead_s_per_experiment']:.3f} s vs hot {result['hot_overhead_s_per_experiment']:.4f} s "
        f"({result['overhead_ratio']:.0f}x)",
        f"copy bandwidth {result['roofline']['copyBandwidthGBps']} GB/s; "
        f"roofline {result['roofline']['rooflineTokensPerSecond']:.1f} tok/s at batch 1",
    ]
    for b in result["builds"]:
        lines.append(
            f"  {b['name'][:48]:48} hot {b['hotStatus']:8} cold {b['coldStatus']:8} "
            f"{b['hotS']:.3f}s vs {b['coldS']:.2f}s  b1 {b['decodeBatch1TokensPerSecond']:.1f} tok/s "
            f"({b['rooflineFraction']:.1%} of roofline)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cold_child:
        return cold_child(args)
    if not 1 <= args.builds <= len(VARIANTS):
        print(f"error: --builds must be between 1 and {len(VARIANTS)}; got {args.builds}.", file=sys.stderr)
        return 2
    for flag in (
        "requests",
        "max_input",
        "max_output",
        "concurrency",
        "repeats",
        "verify_prompts",
        "verify_steps",
    ):
        value = getattr(args, flag)
        if value is not None and value < 1:
            print(f"error: --{flag.replace('_', '-')} must be >= 1; got {value}.", file=sys.stderr)
            return 2
    from polymorph.contract.errors import BuildError, UsageError

    try:
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            result = run(args, Path(tempfile.mkdtemp(prefix="hot-vs-cold-", dir=args.workdir)))
        else:
            with tempfile.TemporaryDirectory(prefix="polymorph-hot-vs-cold-") as tmp:
                result = run(args, Path(tmp))
    except (UsageError, BuildError) as exc:  # a bad --model, --dtype or --device: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text if args.json else _summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
