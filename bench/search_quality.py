"""How good is the search? An exhaustive sweep of a knob space, then a campaign, in one engine.

1. One ``Supervisor`` worker loads the model once. The reference build runs alone (the baseline),
   unless ``--sweep-from`` gives a recorded sweep, whose baseline stands: the campaign's own
   baseline then runs on a cold worker, as under ``polymorph compile`` (a reference run first
   warms it: qwen3-30b-a3b's reference took 49 s cold and 33 s after one run, on an H100).
2. **Exhaustive sweep**: every combination of the ``--knobs`` (the others at their defaults, or
   at ``--sweep-base``'s values: a region of a large space, such as the MoE knobs on the fused
   step; each combination completed with what its knobs ``require``, duplicates dropped) is
   benchmarked paired with the reference (ABBA passes, adaptive repeats), or with ``--anchor``
   (a configuration paired with the reference once; each point's speedup is then point /
   anchor x anchor / reference: a fast anchor makes the sweep several times shorter than
   pairing every point with a slow reference). The best passed combination by speedup is the
   exhaustive best; its *contenders* are the points whose interval reaches its lower bound
   (one noisy point must not hide a better one, nor pass for the best). ``--sweep-screen``
   measures each point by the campaign's screening protocol and then every contender again by
   the full one, until the contenders are all fully measured (a long-context shape's points
   take half a minute each by the full protocol).
3. **Campaign**: ``Campaign`` + ``SearchAgent`` from the reference, on ``polymorph compile``'s
   budget for ``--device`` unless ``--max-experiments``, ``--deadline`` or
   ``--experiment-timeout`` say otherwise, through the same worker (so the same engine, weights
   and workload), with its judgement and confirmation. The sweep's points may have a longer
   timeout (``--sweep-timeout``: a cold Triton compile of every kernel); ``--sweep-only`` stops
   after the sweep, and a later run takes it with ``--sweep-from``.
4. **Head to head**: the campaign's best paired directly with the exhaustive best and each
   contender (one experiment each, at most ``MAX_CONTENDERS``): campaign / exhaustive with its
   95% interval. "Within 3%" means the lowest of these ratios is >= 0.97.

It records every sweep point, the campaign's experiments (status, paired speedup and interval,
half-width, passes, load / verify / bench seconds), experiments per hour with and without the
torch.compile candidates' prepare time (their load and verify seconds, where compilation and
the per-bucket warm-up happen), and where the time went:

    .venv/bin/python bench/search_quality.py --out bench/results/search-quality-tiny-cpu.json
    python bench/search_quality.py --model llama-8b --device cuda --dtype bfloat16 \\
        --knobs decode_step,kernels,capture_buckets,gemv,pdl,residual,sampling,prefill \\
        --skip kernels=compile --anchor decode_step=fused --experiment-timeout 60 \\
        --out bench/results/search-quality-llama-8b-h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polymorph import __version__
from polymorph.compile.agents.search import SearchAgent, config_key, consistent, with_requirements
from polymorph.compile.campaign import Campaign, CampaignSettings
from polymorph.compile.cli import CAMPAIGN_CPU_SCALE, DEVICE_DEFAULTS
from polymorph.compile.ledger import CampaignPaths, config_uid
from polymorph.contract.api import Budget, ExperimentRecord, Gates, Objective
from polymorph.contract.api.common import parse_duration
from polymorph.contract.builds import REFERENCE_BUILD, knob_variant, read_build, resolve_knobs
from polymorph.contract.errors import BuildError, UsageError
from polymorph.contract.runner import baseline_timeout
from polymorph.contract.store import open_store
from polymorph.contract.workload import DEFAULT_WORKLOAD, fit_workload, read_workload, workload_from_profile

if TYPE_CHECKING:
    from polymorph_engine.experiment.supervisor import Supervisor

COMPILE_VALUES = {("decode_capture", "compile"), ("kernels", "compile")}
"""Knob values whose prepare time is torch.compile's (excluded from the adjusted rate)."""


def _point(record: ExperimentRecord, config: dict[str, Any] | None = None) -> dict[str, Any]:
    c = record.comparison
    t = record.timings
    return {
        "config": config if config is not None else record.knobs,
        "build": record.build,
        "status": record.status,
        "error": record.error,
        "tokS": record.figures.outputTokensPerSecond if record.figures else None,
        "speedup": c.ratio if c else None,
        "ci": [c.lo, c.hi] if c else None,
        "halfWidth": record.halfWidth,
        "passes": record.passes,
        "warmup": record.figures.warmupPasses if record.figures else None,
        "warmupRepeats": [round(x, 2) for x in record.figures.warmupRepeats] if record.figures else [],
        "against": c.against if c else None,
        "description": record.description,
        "seconds": {
            "load": t.loadS,
            "verify": t.verifyS,
            "bench": t.benchS,
            "warmup": t.warmupS,
            "fill": t.fillS,
            "prepare": t.prepareS,
            "total": t.totalS,
        },
        # Each measured pass's output tok/s, candidate and (paired) baseline: where the noise came from.
        "repeats": [round(x, 2) for x in record.figures.repeats] if record.figures else [],
        "baselineRepeats": [round(x, 2) for x in c.baseline.repeats] if c else [],
    }


def _compiles(knobs: dict[str, Any]) -> bool:
    return any((k, v) in COMPILE_VALUES for k, v in knobs.items())


MAX_CONTENDERS = 4
"""At most this many sweep points are played head to head against the campaign's best."""


def chained_ci(point: dict[str, Any]) -> tuple[float, float]:
    """A sweep point's interval over the reference: its interval over the anchor times the
    anchor's speedup (``speedup / vsAnchor``; 1 when the sweep paired with the reference)."""
    lo, hi = point["ci"]
    gain = point["speedup"] / point["vsAnchor"] if point.get("vsAnchor") else 1.0
    return lo * gain, hi * gain


def contenders(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The passed sweep points that may be the best: by speedup, every one whose interval reaches
    the top point's lower bound, at most ``MAX_CONTENDERS`` (the top point first)."""
    passed = sorted(
        (p for p in points if p["status"] == "passed" and p["speedup"] is not None and p["ci"]),
        key=lambda p: -p["speedup"],
    )
    if not passed:
        return []
    floor = chained_ci(passed[0])[0]
    return [p for p in passed if chained_ci(p)[1] >= floor][:MAX_CONTENDERS]


def exhaustive(
    knobs: list[str], work: Path, skip: list[str], base: dict[str, Any] | None = None
) -> list[tuple[dict[str, Any], Path]]:
    """Every distinct requirement-complete combination of ``knobs`` (the others at ``base``'s values,
    by default the reference's defaults), as build dirs, less those with a ``skip``ped ``knob=value``.
    The reference's own configuration is left out (it is the baseline)."""
    spec = read_build(REFERENCE_BUILD)
    reference = {name: knob.default for name, knob in spec.knobs.items()}
    defaults = base or reference
    requires = {name: knob.requires for name, knob in spec.knobs.items() if knob.requires}
    unknown = [k for k in knobs if k not in spec.knobs]
    if unknown:
        raise SystemExit(f"--knobs names knobs the reference does not declare: {', '.join(unknown)}")
    seen: dict[str, dict[str, Any]] = {}
    for values in itertools.product(*(spec.knobs[k].choices for k in knobs)):
        config = with_requirements(defaults | dict(zip(knobs, values, strict=True)), requires, defaults)
        # A combination its requirements changed beyond --knobs is another point's duplicate or
        # outside; one whose knobs require different values of another cannot be completed.
        if any(config[k] != defaults[k] for k in config if k not in knobs):
            continue
        if not consistent(config, requires, reference):
            continue
        if any(f"{k}={str(v).lower() if isinstance(v, bool) else v}" in skip for k, v in config.items()):
            continue
        seen.setdefault(config_key(config), config)
    out = []
    for i, (_key, config) in enumerate(sorted(seen.items())):
        if config == reference:
            continue
        dest = work / f"sweep-{i:04d}"
        knob_variant(REFERENCE_BUILD, config, dest, name=f"sweep-{i:04d}")
        out.append((config, dest))
    return out


def _campaign_doc(records: list[ExperimentRecord], seconds: float, confirmations: int = 0) -> dict[str, Any]:
    """The campaign's experiments, rates and where the time went (complete or so far).

    ``seconds`` is the campaign's wall time, the winner's confirmation included (``confirmations``:
    whether it ran, an experiment outside the ledger). ``screenExperimentsPerHour`` is the rate of
    the screens alone: what a campaign long enough that its one-off experiments (the baseline,
    the first compile or tile tuning, the final pairing and its confirmation) are a small part of
    it runs at."""
    # A compile candidate's prepare time is its load and verify (where compilation happens); one
    # that timed out or crashed spent all of its time preparing.
    compile_prep = sum(
        (r.timings.totalS if r.status in ("timeout", "crashed") else r.timings.loadS + r.timings.verifyS)
        for r in records
        if _compiles(r.knobs)
    )
    total = sum(r.timings.totalS for r in records)
    screens = [r.timings.totalS for r in records if r.screen]
    screen_s = sum(screens)
    experiments = len(records) + confirmations
    return {
        "experiments": experiments,
        "confirmations": confirmations,
        "seconds": round(seconds, 1),
        "experimentsPerHour": round(experiments * 3600 / seconds, 1) if seconds > 0 else 0.0,
        "screenExperimentsPerHour": round(len(screens) * 3600 / screen_s, 1) if screen_s > 0 else None,
        "experimentsPerHourWithoutCompilePrepare": round(len(records) * 3600 / (total - compile_prep), 1)
        if total > compile_prep
        else None,
        "timeSplitS": {
            "load": round(sum(r.timings.loadS for r in records), 2),
            "verify": round(sum(r.timings.verifyS for r in records), 2),
            "bench": round(sum(r.timings.benchS for r in records), 2),
            "ofBenchWarmup": round(sum(r.timings.warmupS for r in records), 2),
            "ofBenchFill": round(sum(r.timings.fillS for r in records), 2),
            "compilePrepare": round(compile_prep, 2),
            "total": round(total, 2),
        },
        "maxPassedHalfWidth": max(
            (r.halfWidth for r in records if r.status == "passed" and r.halfWidth is not None),
            default=None,
        ),
        "screened": sum(r.screen for r in records),
        "timeouts": sum(r.status == "timeout" for r in records),
        "prepareS": round(sum(r.timings.prepareS for r in records), 2),
        # What the selection relied on: the judgement's races and final pairing (full protocol).
        "judged": [
            {
                "description": r.description,
                "build": r.build,
                "halfWidth": r.halfWidth,
                "ratio": r.comparison.ratio if r.comparison else None,
            }
            for r in records
            if not r.screen and r.build != (records[0].build if records else "")
        ],
        "maxJudgedHalfWidth": max(
            (
                r.halfWidth
                for r in records[1:]
                if not r.screen and r.status == "passed" and r.halfWidth is not None
            ),
            default=None,
        ),
        "records": [_point(r) for r in records],
    }


def _configuration(text: str, flag: str) -> dict[str, Any]:
    """``flag``'s ``KNOB=VALUE,...`` (``--anchor``, ``--sweep-base``) as a requirement-complete
    configuration of the reference's knobs."""
    spec = read_build(REFERENCE_BUILD)
    defaults = spec.defaults()
    requires = {name: knob.requires for name, knob in spec.knobs.items() if knob.requires}
    pairs = (part.strip().partition("=") for part in text.split(",") if part.strip())
    try:
        config = resolve_knobs(spec, {name.strip(): raw.strip() for name, _, raw in pairs})
    except BuildError as exc:
        raise SystemExit(f"{flag} {text!r}: {exc}") from None
    return with_requirements(config, requires, defaults)


def _check(args: argparse.Namespace) -> None:
    """One line naming the flag for each bad value (what ``polymorph compile`` would refuse)."""
    if args.max_experiments < 1:
        raise SystemExit(f"--max-experiments must be a positive integer; got {args.max_experiments}")
    if args.sweep_only and args.sweep_from is not None:
        raise SystemExit(
            "--sweep-only and --sweep-from: give one (the first measures a sweep, the second reuses one)"
        )
    if args.sweep_screen and args.sweep_from is not None:
        raise SystemExit(
            "--sweep-screen and --sweep-from: --sweep-from reuses a sweep, so nothing is screened"
        )
    try:
        parse_duration(args.deadline)
    except ValueError as exc:
        raise SystemExit(f"--deadline: {exc}") from None
    if not (math.isfinite(args.min_speedup) and args.min_speedup >= 1):
        raise SystemExit(f"--min-speedup must be a finite number >= 1, e.g. 1.05; got {args.min_speedup}")
    for flag, value in (
        ("--experiment-timeout", args.experiment_timeout),
        ("--sweep-timeout", args.sweep_timeout),
    ):
        if not (math.isfinite(value) and value > 0):
            raise SystemExit(f"{flag} must be a positive number of seconds; got {value}")
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"--threads must be a positive integer; got {args.threads}")


def _previous_sweep(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The sweep of an earlier run on this device, and that run's baseline: its points are not
    measured again (only the contenders, head to head)."""
    try:
        doc = json.loads(path.read_text())
        previous = doc["exhaustive"]
        points = previous.get("points") or [previous["best"]]
        if not all(isinstance(p, dict) and isinstance(p.get("config"), dict) for p in points):
            raise ValueError("a point has no configuration")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"--sweep-from {path}: not a search_quality result with an exhaustive sweep ({exc})"
        ) from None
    sweep = {"from": str(path), "knobs": previous.get("knobs"), "combinations": len(points), "points": points}
    baseline = doc.get("baseline")
    return sweep, baseline if isinstance(baseline, dict) else None


def _sweep(
    supervisor: Supervisor,
    knobs: list[str],
    skip: list[str],
    anchor_config: dict[str, Any] | None,
    work: Path,
    progress: Callable[[dict[str, Any]], None],
    base: dict[str, Any] | None = None,
    screen: bool = False,
) -> dict[str, Any]:
    """Every combination of ``knobs``, paired with the reference or the anchor (module docstring, 2).

    ``progress`` gets the sweep so far after each point: a run killed at its time bound keeps them.
    ``screen``: each point by the screening protocol, then the contenders by the full one."""
    points = exhaustive(knobs, work, skip, base)
    print(f"exhaustive sweep: {len(points)} combinations of {', '.join(knobs)}", file=sys.stderr)
    sweep_started = time.monotonic()
    against, anchor_gain, anchor_point = Path(REFERENCE_BUILD), 1.0, None
    if anchor_config is not None:
        against = work / "anchor"
        knob_variant(REFERENCE_BUILD, anchor_config, against, name="anchor")
        anchor_point = _point(supervisor.run(against, description="anchor", against=REFERENCE_BUILD))
        if anchor_point["status"] != "passed" or anchor_point["speedup"] is None:
            raise SystemExit(f"the anchor {anchor_config} did not pass: {anchor_point['error']}")
        anchor_gain = anchor_point["speedup"]
    swept: list[dict[str, Any]] = []

    def doc() -> dict[str, Any]:
        return {
            "knobs": knobs,
            "skipped": skip,
            "base": base,
            "anchor": anchor_point,
            "combinations": len(points),
            "seconds": round(time.monotonic() - sweep_started, 1),
            "points": swept,
        }

    def measure(config: dict[str, Any], build_dir: Path, screened: bool) -> dict[str, Any]:
        record = supervisor.run(build_dir, description="exhaustive", against=against, screen=screened)
        p = _point(record, config) | {"screen": screened}
        p["vsAnchor"], p["speedup"] = p["speedup"], p["speedup"] and p["speedup"] * anchor_gain
        print(
            f"  {p['status']:<8} {p['speedup'] and round(p['speedup'], 3)} {p['ci']} {config}"
            + (" (screened)" if screened else "")
            + (f" ({p['error']})" if p.get("error") else ""),
            file=sys.stderr,
        )
        return p

    for config, build_dir in points:
        swept.append(measure(config, build_dir, screen))
        progress(doc())
    # Screened: the points that may be the best, again by the full protocol, until every one of
    # them was (a re-measured point may fall back and let a screened one through).
    dirs = {config_key(config): build_dir for config, build_dir in points}
    while screen and (open_ := [p for p in contenders(swept) if p["screen"]]):
        p = open_[0]
        full = measure(p["config"], dirs[config_key(p["config"])], False)
        swept[swept.index(p)] = full | {"screened": {k: p[k] for k in ("speedup", "ci", "passes")}}
        progress(doc())
    return doc()


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    """What a result records besides its measurements: the run, the device, the versions."""
    import torch

    return {
        "benchmark": "search-quality",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": {
            "type": torch.device(args.device).type,
            "name": torch.cuda.get_device_name(0)
            if torch.cuda.is_available() and args.device.startswith("cuda")
            else (platform.processor() or platform.machine()),
            "cpus": os.cpu_count(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "polymorph": __version__,
        },
        "model": args.model,
        "dtype": args.dtype,
        "workload": args.workload or "the sample profile",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--knobs",
        default="kv_cache,attention,sampling,fused_qkv,decode_capture",
        help="comma-separated knobs swept exhaustively (the others stay at their defaults)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="leave combinations with this knob value out of the sweep (repeatable; e.g. decode_capture=compile)",
    )
    parser.add_argument(
        "--sweep-base",
        default="",
        metavar="KNOB=VALUE,...",
        help="the values of the knobs the sweep does not vary (default: the reference's defaults)",
    )
    parser.add_argument(
        "--anchor",
        default="",
        metavar="KNOB=VALUE,...",
        help="pair the sweep's points with this configuration (itself paired with the reference once)",
    )
    parser.add_argument(
        "--experiment-timeout",
        type=float,
        help="seconds one experiment may take (default: polymorph compile's for --device)",
    )
    parser.add_argument(
        "--sweep-timeout",
        type=float,
        help="seconds one sweep point may take (default: --experiment-timeout); the campaign keeps its own",
    )
    parser.add_argument(
        "--sweep-screen",
        action="store_true",
        help="measure each sweep point by the screening protocol, then its contenders by the full one",
    )
    parser.add_argument(
        "--sweep-from",
        type=Path,
        metavar="RESULT.json",
        help="skip the sweep: take the exhaustive best of an earlier result (same device and model)",
    )
    parser.add_argument(
        "--sweep-only",
        action="store_true",
        help="stop after the sweep (a later run takes it with --sweep-from and runs the campaign)",
    )
    parser.add_argument(
        "--max-experiments",
        type=int,
        help="the campaign's budget (default: polymorph compile's for --device)",
    )
    parser.add_argument(
        "--deadline", help="the campaign's deadline (default: polymorph compile's for --device)"
    )
    parser.add_argument(
        "--workload",
        metavar="FILE",
        help="a WorkloadProfile YAML/JSON or a .jsonl trace (default: the sample profile)",
    )
    parser.add_argument("--min-speedup", type=float, default=1.05)
    parser.add_argument("--threads", type=int, help="worker torch threads (default 1 on CPU)")
    parser.add_argument("--out", type=Path, help="where to write the JSON result")
    args = parser.parse_args()
    # The campaign's budget: polymorph compile's defaults for this device unless given.
    defaults = DEVICE_DEFAULTS["cpu" if args.device == "cpu" else "cuda"]
    if args.max_experiments is None:
        args.max_experiments = int(defaults["max_experiments"])
    if args.deadline is None:
        args.deadline = str(defaults["deadline"])
    if args.experiment_timeout is None:
        args.experiment_timeout = parse_duration(str(defaults["experiment_timeout"]))
    if args.sweep_timeout is None:
        args.sweep_timeout = args.experiment_timeout
    knobs = [k.strip() for k in args.knobs.split(",") if k.strip()]
    # Bad flags fail before the worker starts.
    _check(args)
    anchor_config = _configuration(args.anchor, "--anchor") if args.anchor else None
    sweep_base = _configuration(args.sweep_base, "--sweep-base") if args.sweep_base else None
    previous, previous_baseline = (
        _previous_sweep(args.sweep_from) if args.sweep_from is not None else (None, None)
    )
    if args.workload:
        try:
            workload, profile = read_workload(args.workload)
        except UsageError as exc:
            parser.error(str(exc))
    else:
        workload, profile = workload_from_profile(DEFAULT_WORKLOAD), DEFAULT_WORKLOAD
    if args.device == "cpu":
        workload = fit_workload(workload, **CAMPAIGN_CPU_SCALE)
    gates = Gates(minSpeedup=args.min_speedup)
    threads = args.threads if args.threads is not None else (1 if args.device == "cpu" else None)
    # The engine loads only once every flag is known good: a bad one is answered at once.
    from polymorph_engine.experiment.settings import BenchSettings
    from polymorph_engine.experiment.supervisor import Supervisor

    supervisor = Supervisor(
        args.model,
        device=args.device,
        dtype=args.dtype,
        workload=workload,
        gates=gates,
        experiment_timeout=args.sweep_timeout,
        baseline_timeout=baseline_timeout(args.sweep_timeout),
        settings=BenchSettings(),
        fit=args.device != "cpu",
        threads=threads,
    )
    started = time.monotonic()

    def write(doc: dict[str, Any]) -> None:
        if args.out is not None:
            args.out.write_text(json.dumps(doc, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="polymorph-search-quality-") as tmp, supervisor:
        # Once the worker is up: a bad --model, --device or --dtype is its one line, torch never loaded here.
        meta = _meta(args)
        work = Path(tmp)
        start_s = supervisor.stats.load_seconds[0]
        meta |= {"workerStartS": round(start_s, 2)}
        if previous_baseline is not None:  # the campaign's baseline runs cold, as under polymorph compile
            meta |= {"baseline": previous_baseline, "baselineFrom": str(args.sweep_from)}
        else:
            meta |= {"baseline": _point(supervisor.run(REFERENCE_BUILD, description="baseline"))}
        if previous is not None:
            sweep_doc = previous
        else:
            sweep_doc = _sweep(
                supervisor,
                knobs,
                args.skip,
                anchor_config,
                work,
                lambda so_far: write(meta | {"partial": True, "exhaustive": so_far}),
                sweep_base,
                args.sweep_screen,
            )
        tops = contenders(sweep_doc["points"])
        if not tops:
            raise SystemExit("no point of the exhaustive sweep passed; nothing to compare the campaign with")
        sweep_doc |= {"best": tops[0], "contenders": [p["config"] for p in tops]}
        if args.sweep_only:
            doc = meta | {"exhaustive": sweep_doc, "wallS": round(time.monotonic() - started, 1)}
            write(doc)
            print(json.dumps(doc, indent=2))
            return 0
        write(meta | {"partial": True, "exhaustive": sweep_doc})  # in case the campaign does not finish

        supervisor.experiment_timeout = args.experiment_timeout  # the campaign's, as polymorph compile's
        supervisor.baseline_timeout = baseline_timeout(args.experiment_timeout)
        store = open_store(str(work / "store"))
        settings = CampaignSettings(
            paths=CampaignPaths("local", "search-quality", config_uid({"t": time.time()})),
            base_dir=REFERENCE_BUILD,
            base_build="reference",
            workload=profile,
            workload_hash=workload.digest,
            objective=Objective(),
            gates=gates,
            budget=Budget(
                maxExperiments=args.max_experiments,
                deadline=args.deadline,
                sandboxes=1,
                experimentTimeout=f"{args.experiment_timeout:g}s",
            ),
            model=args.model,
            hardware=args.device,
            agent="search",
        )
        campaign_started = time.monotonic()

        so_far: list[ExperimentRecord] = []

        def on_record(record: ExperimentRecord, _cached: bool, _progress: object) -> None:
            so_far.append(record)  # written as it lands: a killed run keeps what it measured
            campaign = _campaign_doc(so_far, time.monotonic() - campaign_started)
            write(meta | {"partial": True, "exhaustive": sweep_doc, "campaign": campaign})

        def log(message: str) -> None:
            print(message, file=sys.stderr)

        outcome = Campaign(settings, store, supervisor, on_record=on_record, log=log).run(SearchAgent())
        campaign_s = time.monotonic() - campaign_started
        result = outcome.result
        found = result.best or result.bestCandidate
        head_to_head: list[dict[str, Any]] = []
        if found is not None:
            found_dir = store.get_build(found.build, work / "found")
            for i, top in enumerate(tops):
                top_dir = work / f"contender-{i}"
                knob_variant(REFERENCE_BUILD, top["config"], top_dir, name=f"contender-{i}")
                versus = supervisor.run(
                    found_dir, description=f"campaign best vs contender {i}", against=top_dir
                )
                head_to_head.append(_point(versus, top["config"]))
    doc = meta | {
        "exhaustive": sweep_doc,
        "campaign": _campaign_doc(outcome.records, campaign_s, int(result.confirmation is not None))
        | {
            "state": result.state,
            "message": result.message,
            "best": found.model_dump(mode="json", exclude={"figures"}) if found is not None else None,
            "confirmation": result.confirmation.model_dump(mode="json") if result.confirmation else None,
        },
        # campaign best / each contender; the lowest ratio is the one "within 3%" is judged by.
        "headToHead": head_to_head,
        "headToHeadLowest": min(
            (h["speedup"] for h in head_to_head if h["speedup"] is not None), default=None
        ),
        "wallS": round(time.monotonic() - started, 1),
    }
    write(doc)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except Exception as exc:  # the engine is imported only once the flags are checked (main)
        from polymorph_engine.experiment.supervisor import WorkerStartError

        if isinstance(exc, WorkerStartError):  # a bad --model, --device or --dtype: the worker says which
            raise SystemExit(str(exc)) from None
        raise
