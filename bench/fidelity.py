#!/usr/bin/env python
"""Fidelity of the sampled-steps estimate: every build on every shape, estimated and fully replayed.

The reference is the **full replay**: every request of the workload at its true prompt and
output lengths, at its true concurrency, through the engine's own scheduler
(``experiment.bench.replay``), on a KV cache of the shape serving allocates (``--cache-slots``,
default the workload's concurrency; ``--cache-len``, default its longest request), after an
untimed warm-up replay of its first ``--warmup-requests`` requests. The **estimate** is what an
experiment measures on an accelerator: sampled passes (``experiment.sampled.SampledPass``)
under the experiment's own stopping rules (``measure.measure_one``: steady-state warm-up, then
passes until the median's 95% interval is within 2% or 10 s).

For each shape (a workload file: a WorkloadProfile YAML or a .jsonl trace) and each build (the
reference build with a knob set of ``--builds``, sets separated by ``;``), one engine measures
both, and records output and total tok/s, TTFT p95 and ITL p95 of each, their relative errors,
the seconds each took, and per shape whether the estimate ranks the builds as the full replay
does wherever the replay separates them by more than ``--separation`` (3%).

``passSplit`` says where a sampled pass's time goes, from ``--split-passes`` more passes after the
estimate with every hot-path call timed to its end (a device sync before and after): the wall
seconds of a pass, of each kind of call (``prefill`` counts the untimed refills of the decode
state too, which ``fill`` gives alone), of laying out the workload (``layout``), and the rest
(``host``: building inputs, reading tokens back, Python).

    PYTHONPATH=operator:engine_image python bench/fidelity.py --model llama-8b --device cuda \\
        --dtype bfloat16 --shapes bench/shapes/chat-single.yaml,bench/shapes/chat-default.yaml,\\
bench/shapes/long-batch.yaml --builds "$B1;$B2" --out bench/results/fidelity-llama-8b-h200.json
    .venv/bin/python bench/fidelity.py --out bench/results/fidelity-tiny-cpu.json   # tiny, on CPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import shlex
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from polymorph import __version__
from polymorph.contract.builds import REFERENCE_BUILD, knob_variant, read_build, resolve_knobs
from polymorph.contract.errors import BuildError, UsageError
from polymorph.contract.inputs import integer
from polymorph.contract.steps import plan
from polymorph.contract.workload import Workload, read_workload

DEFAULT_BUILDS = (
    "kv_cache=static,decode_step=fused,sampling=device;kv_cache=static,decode_step=fused,kernels=triton"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        print(f"fidelity: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        allow_abbrev=False, description="The sampled-steps estimate against a full replay, build by build."
    )
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--shapes", default="bench/shapes/chat-default.yaml", help="comma-separated workload files"
    )
    p.add_argument("--builds", default=DEFAULT_BUILDS, help="knob sets, ';'-separated (k=v,k=v;...)")
    p.add_argument(
        "--requests",
        type=integer(1, 100_000),
        default=64,
        help="requests sampled from a profile (default: 64)",
    )
    p.add_argument(
        "--full-passes", type=integer(1, 100), default=2, help="measured full replays per build (default: 2)"
    )
    p.add_argument(
        "--warmup-requests",
        type=integer(1),
        default=8,
        help="requests of the untimed warm-up replay (default: 8)",
    )
    p.add_argument(
        "--cache-slots", type=integer(1, 4096), help="KV-cache slots (default: the workload's concurrency)"
    )
    p.add_argument("--cache-len", type=integer(2), help="KV-cache positions (default: the longest request)")
    p.add_argument(
        "--separation", type=float, default=0.03, help="ratios the ranking check requires (default: 0.03)"
    )
    p.add_argument(
        "--split-passes",
        type=integer(0, 100),
        default=3,
        help="passes timed call by call after each estimate, for passSplit (default: 3; 0: none)",
    )
    p.add_argument("--threads", type=integer(1, 4096), default=1, help="torch threads on a CPU (default: 1)")
    p.add_argument("--out", type=Path)
    return p


def _knobs(text: str) -> list[dict[str, Any]]:
    sets = []
    for part in filter(None, (s.strip() for s in text.split(";"))):
        knobs: dict[str, Any] = {}
        for item in filter(None, part.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise UsageError(f"--builds: {item!r} is not knob=value")
            knobs[key.strip()] = {"true": True, "false": False}.get(value.strip(), value.strip())
        try:
            resolve_knobs(read_build(REFERENCE_BUILD), knobs)
        except BuildError as exc:
            raise UsageError(f"--builds {part!r}: {exc}") from None
        sets.append(knobs)
    if not sets:
        raise UsageError("--builds names no knob set; give k=v,k=v sets separated by ';'")
    return sets


def _figures(passes: list[Any]) -> dict[str, float]:
    from polymorph_engine.experiment.bench import percentile, throughput

    return {
        "outputTokS": statistics.median(throughput(p) for p in passes),
        "totalTokS": statistics.median((p.input_tokens + p.output_tokens) / p.duration_s for p in passes),
        "ttftP95Ms": statistics.median(percentile(p.ttft_s, 95) for p in passes) * 1e3,
        "itlP95Ms": statistics.median(percentile(p.itl_s, 95) for p in passes) * 1e3,
    }


ITL_QUANTILES = (50, 90, 95, 98, 99)


def _itl_ms(passes: list[Any]) -> dict[str, float]:
    """Quantiles of the inter-token gaps of every pass pooled, in ms: where the p95 sits between
    the plain decode steps and the gaps that waited on another request's prefill."""
    from polymorph_engine.experiment.bench import percentile

    gaps = [t for p in passes for t in p.itl_s]
    return {f"p{q}": round(percentile(gaps, q) * 1e3, 3) for q in ITL_QUANTILES} if gaps else {}


def _error(estimate: dict[str, float], truth: dict[str, float]) -> dict[str, float]:
    return {k: estimate[k] / truth[k] - 1.0 for k in truth if truth[k]}


class _Timed:
    """A hot path whose every call is timed to its end (synced before and after), per method."""

    METHODS = ("new_cache", "prefill", "decode", "sample", "free")

    def __init__(self, inner: Any, sync: Any) -> None:
        self.inner, self.sync = inner, sync
        self.seconds: dict[str, float] = dict.fromkeys(self.METHODS, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(self.METHODS, 0)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name not in self.METHODS:
            return method

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.sync()
            started = time.perf_counter()
            out = method(*args, **kwargs)
            self.sync()
            self.seconds[name] += time.perf_counter() - started
            self.calls[name] += 1
            return out

        return timed


def _split(sampler: Any, reused: Any, passes: int) -> dict[str, Any]:
    """Where ``passes`` more sampled passes spend their time, per pass (see the module docstring)."""
    import torch

    sync = torch.cuda.synchronize if torch.device(sampler.device).type == "cuda" else (lambda: None)
    timed = _Timed(reused, sync)
    sampler.hotpath = timed
    fill, layout = sampler.fill_s, sampler.layout_s
    started = time.perf_counter()
    try:
        for _ in range(passes):
            sampler()
    finally:
        sampler.hotpath = reused
    wall = (time.perf_counter() - started) / passes
    calls = {name: s / passes for name, s in timed.seconds.items() if timed.calls[name]}
    layout_s = (sampler.layout_s - layout) / passes
    return {
        "passes": passes,
        "wallS": round(wall, 4),
        "callsS": {name: round(s, 4) for name, s in calls.items()},
        "callsPerPass": {name: n / passes for name, n in timed.calls.items() if n},
        "fillS": round((sampler.fill_s - fill) / passes, 4),
        "layoutS": round(layout_s, 4),
        "hostS": round(wall - sum(calls.values()) - layout_s, 4),
    }


def _ranking(rows: list[dict[str, Any]], separation: float) -> dict[str, Any]:
    """Pairs the full replay separates by more than ``separation``, and whether the estimate agrees."""
    checked, agreed = 0, 0
    disagreements = []
    for a, b in itertools.combinations([r for r in rows if "full" in r], 2):
        fa, fb = a["full"]["outputTokS"], b["full"]["outputTokS"]
        if abs(fa / fb - 1.0) <= separation:
            continue
        checked += 1
        if (fa > fb) == (a["estimate"]["outputTokS"] > b["estimate"]["outputTokS"]):
            agreed += 1
        else:
            disagreements.append([a["knobs"], b["knobs"]])
    return {"pairs": checked, "agreed": agreed, "disagreements": disagreements}


def main() -> int:
    args = _parser().parse_args()
    try:
        builds = _knobs(args.builds)
        shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
        workloads = {s: read_workload(s, n=args.requests)[0] for s in shapes}
    except UsageError as exc:
        print(f"fidelity: {exc}", file=sys.stderr)
        return 2
    import torch

    from polymorph_engine.experiment.bench import ReusedCache, make_prompts, replay
    from polymorph_engine.experiment.measure import GPU_TARGET, GPU_TIME_CAP, MeasurePolicy, measure_one
    from polymorph_engine.experiment.sampled import SampledPass
    from polymorph_engine.runtime.checkpoint import load_model
    from polymorph_engine.runtime.config import parse_dtype
    from polymorph_engine.runtime.hotreload import Engine

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    cpu = args.device == "cpu"
    clock = time.process_time if cpu else time.perf_counter
    policy = MeasurePolicy(
        min_passes=5,
        max_passes=40,
        target_half_width=0.04 if cpu else GPU_TARGET,
        time_cap_s=4.0 if cpu else GPU_TIME_CAP,
        min_warmup=1,
        max_warmup=6,
    )
    started = time.perf_counter()
    try:
        model = load_model(args.model, device=args.device, dtype=parse_dtype(args.dtype), seed=0)
    except UsageError as exc:
        print(f"fidelity: {exc}", file=sys.stderr)
        return 2
    engine = Engine(model)
    vocab = int(model.config.vocab_size)
    doc: dict[str, Any] = {
        "benchmark": "fidelity",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "device": {
            "type": torch.device(args.device).type,
            "name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "polymorph": __version__,
        },
        "model": args.model,
        "dtype": args.dtype,
        "protocol": {
            "full": f"{args.full_passes} measured full replays after a warm-up of {args.warmup_requests} requests",
            "estimate": f"sampled passes, measure_one: {policy}",
        },
        "shapes": [],
    }

    def write() -> None:
        doc["wallS"] = round(time.perf_counter() - started, 1)
        text = json.dumps(doc, indent=2)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")

    with tempfile.TemporaryDirectory(prefix="polymorph-fidelity-") as tmp:
        for name, workload in workloads.items():
            shape = (
                max(args.cache_slots or 0, workload.concurrency),
                max(args.cache_len or 0, workload.max_tokens),
            )
            sampled_plan = plan(workload, None, shape[1])
            rows: list[dict[str, Any]] = []
            entry = {
                "shape": name,
                "requests": len(workload.requests),
                "concurrency": workload.concurrency,
                "promptTokens": sum(r.input_tokens for r in workload.requests),
                "outputTokens": sum(r.output_tokens for r in workload.requests),
                "cache": list(shape),
                "plan": sampled_plan.describe(),
                "decodeSteps": sampled_plan.decode_steps,
                "builds": rows,
            }
            doc["shapes"].append(entry)
            prompts = make_prompts(workload, vocab)
            warm = Workload(workload.requests[: args.warmup_requests], workload.concurrency, workload.digest)
            for i, knobs in enumerate(builds):
                row: dict[str, Any] = {"knobs": knobs}
                rows.append(row)
                try:
                    build = knob_variant(
                        REFERENCE_BUILD, knobs, Path(tmp) / f"{Path(name).stem}-{i}", name=f"b{i}"
                    )
                    loaded = engine.load_build(build, None)
                    reused = ReusedCache(loaded.hotpath, shape=shape)
                    t = time.perf_counter()
                    sampler = SampledPass(
                        reused,
                        workload,
                        sampled_plan,
                        shape,
                        vocab_size=vocab,
                        device=args.device,
                        clock=clock,
                    )
                    estimate = measure_one(sampler, policy)
                    if args.split_passes:
                        row["passSplit"] = _split(sampler, reused, args.split_passes)
                    sampler.release()
                    row["estimate"] = _figures(estimate.passes)
                    row["estimateItlMs"] = _itl_ms(estimate.passes)
                    row["estimateS"] = round(time.perf_counter() - t, 2)
                    row["estimatePasses"] = len(estimate.passes)
                    row["estimateWarmup"] = estimate.warmup
                    row["estimateHalfWidth"] = estimate.estimate.half_width
                    replay(
                        reused,
                        warm,
                        prompts[: len(warm.requests)],
                        device=args.device,
                        clock=clock,
                        cache_len=shape[1],
                    )
                    t = time.perf_counter()
                    full = [
                        replay(reused, workload, prompts, device=args.device, clock=clock, cache_len=shape[1])
                        for _ in range(args.full_passes)
                    ]
                    row["full"] = _figures(full)
                    row["fullItlMs"] = _itl_ms(full)
                    row["fullS"] = round(time.perf_counter() - t, 2)
                    row["error"] = _error(row["estimate"], row["full"])
                    reused.release()
                except (BuildError, RuntimeError, ValueError) as exc:
                    row["failed"] = f"{type(exc).__name__}: {exc}"[:400]
                finally:
                    engine.unload()
                print(json.dumps({"shape": name, **row}), flush=True)
                write()
            entry["ranking"] = _ranking(rows, args.separation)
            write()
    print(json.dumps({"wallS": doc["wallS"], "ranking": [s["ranking"] for s in doc["shapes"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
