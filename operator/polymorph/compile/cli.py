"""``polymorph compile``: run a compile campaign on this machine (``make demo``).

Defaults: the tiny random model on CPU, the sample workload, the SearchAgent and the local
store. The campaign lives at ``compilejobs/local/<--campaign>-<uid>/`` where ``uid`` is a
stable hash of what defines it (model, device, dtype, workload, base build, agent,
objective, gates; not the budget, so a rerun may extend it). Running the same command again
resumes it: experiments already in the ledger are not run again. ``--fresh`` starts a new
campaign instead.

Output: a progress bar and a live leaderboard when stdout is a terminal, plain lines
otherwise, then a report (baseline versus best, speedup with noise, the best build's id and
where it is stored, experiments per hour, and the cold-start versus hot-swap cost the
supervisor observed). ``--json`` prints one final JSON object on stdout instead (progress
lines go to stderr). Exit status: 0 when the campaign reached a result (improved or not), 1
when the baseline failed or the agent failed, 2 for bad input.

It only gathers inputs, calls ``campaign`` with a ``polymorph_engine`` ``Supervisor`` and prints.
It is the one module of ``polymorph`` that imports the engine (see the import-linter contracts).
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from polymorph.api import Budget, Gates, Objective, WorkloadProfile, parse_duration
from polymorph.builds import resolve_build_arg
from polymorph.compile.agents import make_agent
from polymorph.compile.campaign import Campaign, CampaignSettings
from polymorph.compile.ledger import CampaignPaths, config_uid
from polymorph.compile.outcome import exit_status
from polymorph.compile.report import Display, final_json, render_report
from polymorph.errors import StoreError, UsageError
from polymorph.store import Store, build_id, open_store
from polymorph.validate import format_validation_error
from polymorph.workload import (
    DEFAULT_WORKLOAD,
    Workload,
    fit_workload,
    is_trace,
    load_workload,
    profile_of,
    read_profile,
    workload_from_profile,
)

# The one module of ``polymorph`` that imports the engine: it wires a local, supervised engine
# worker into ``polymorph compile`` (an import-linter contract names this exception).
from polymorph_engine.experiment.run import BenchSettings
from polymorph_engine.experiment.supervisor import Supervisor, WorkerStartError

__all__ = ["configure", "run"]

MAX_THREADS = 4096
"""The most torch CPU threads a worker may be asked for (more overflows torch's C++ int)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="tiny", help="model shape (tiny, llama-1b, ...) or checkpoint dir (default tiny)"
    )
    parser.add_argument(
        "--workload", metavar="FILE", help="a WorkloadProfile YAML/JSON or a .jsonl trace (default: sample)"
    )
    parser.add_argument(
        "--agent", choices=["search", "claude"], default="search", help="who proposes builds (default search)"
    )
    parser.add_argument(
        "--max-experiments", type=int, default=30, metavar="N", help="experiment budget (default 30)"
    )
    parser.add_argument(
        "--deadline", default="10m", metavar="DURATION", help="time budget, e.g. 90s, 10m, 2h (default 10m)"
    )
    parser.add_argument(
        "--store",
        metavar="PATH_OR_URI",
        help="artifact store; checked writable before anything runs (default $POLYMORPH_STORE or ./.polymorph/store)",
    )
    parser.add_argument(
        "--campaign", default="demo", help="campaign name; rerunning a name resumes it (default demo)"
    )
    parser.add_argument("--fresh", action="store_true", help="start a new campaign instead of resuming")
    parser.add_argument("--json", action="store_true", help="print one final JSON object on stdout")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (default float32)")
    parser.add_argument(
        "--experiment-timeout",
        default="2m",
        metavar="DURATION",
        help="per experiment, e.g. 90s or 2m (default 2m)",
    )
    parser.add_argument(
        "--min-speedup",
        type=float,
        default=1.05,
        help="gate: speedup the result must reach beyond noise, a finite number >= 1 (default 1.05)",
    )
    parser.add_argument(
        "--metric", default="outputTokensPerSecond", help="objective metric (default outputTokensPerSecond)"
    )
    parser.add_argument(
        "--base-build", default="reference", help="'reference', a build id from --store, or a build directory"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="measured benchmark passes per experiment (default 5)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads in the engine worker (default: 1 with --device cpu, where one thread keeps a "
        "small model's timings steady on a shared machine; torch's default otherwise)",
    )
    parser.add_argument("--claude-model", default="claude-sonnet-4-5", help="Claude model for --agent claude")
    parser.add_argument(
        "--api-key-file", metavar="FILE", help="file holding the Anthropic API key (else $ANTHROPIC_API_KEY)"
    )
    parser.add_argument("--max-tokens", type=int, default=2_000_000, help="token budget for --agent claude")
    parser.add_argument("--instructions", default="", help="extra instructions for --agent claude")


@dataclass(frozen=True)
class _Checked:
    objective: Objective
    gates: Gates
    budget: Budget


def _checked(args: argparse.Namespace) -> _Checked:
    """Validate flags into plain values; UsageError names the flag."""
    if args.max_experiments < 1:
        raise UsageError(f"--max-experiments must be a positive integer; got {args.max_experiments}")
    for flag, value in (("--deadline", args.deadline), ("--experiment-timeout", args.experiment_timeout)):
        try:
            parse_duration(value)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    if not (math.isfinite(args.min_speedup) and args.min_speedup >= 1):
        raise UsageError(f"--min-speedup must be a finite number >= 1, e.g. 1.05; got {args.min_speedup}")
    if args.repeats < 2:
        raise UsageError(f"--repeats must be at least 2 so noise can be measured; got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be a positive integer; got {args.threads}")
    if args.threads is not None and args.threads > MAX_THREADS:
        raise UsageError(f"--threads must be at most {MAX_THREADS}; got {args.threads}")
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be a positive integer; got {args.max_tokens}")
    if (
        not args.campaign
        or not all(c.isalnum() or c in "-." for c in args.campaign)
        or args.campaign != args.campaign.lower()
    ):
        raise UsageError(f"--campaign must be lowercase letters, digits, '-' and '.'; got {args.campaign!r}")
    try:
        objective = Objective(metric=args.metric)
    except ValueError:
        raise UsageError(
            f"--metric must be outputTokensPerSecond, totalTokensPerSecond, ttftP95 or itlP95; got {args.metric!r}"
        ) from None
    return _Checked(
        objective=objective,
        gates=Gates(minSpeedup=args.min_speedup),
        budget=Budget(
            maxExperiments=args.max_experiments,
            deadline=args.deadline,
            sandboxes=1,
            experimentTimeout=args.experiment_timeout,
        ),
    )


def load_campaign_workload(path: str | None) -> tuple[Workload, WorkloadProfile]:
    """``(Workload, WorkloadProfile)`` from a workload file (a trace's profile is derived), or the sample."""
    if path is None:
        return workload_from_profile(DEFAULT_WORKLOAD), DEFAULT_WORKLOAD
    workload = load_workload(path)  # raises UsageError naming the file and field
    text = Path(path).read_text(encoding="utf-8")  # load_workload has read it already
    if is_trace(Path(path), text):
        return workload, profile_of(workload)
    return workload, read_profile(text, path)


def check_store(store: Store, uri: str | None) -> None:
    """Write and delete a probe object, so a store that is unwritable or unreachable is a one-line
    error now, not after the model loaded and the baseline ran."""
    key = f"compilejobs/local/.probe-{secrets.token_hex(6)}"
    where = uri or store.uri
    try:
        store.put_bytes(key, b"")
        store.delete(key)
    except StoreError as exc:
        raise UsageError(f"--store {where} is not usable: {exc}") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"--store {where} is not writable: {exc.filename or where}: {reason}") from None


def _scale_note(before: Workload, after: Workload) -> str | None:
    """What ``fit_workload`` changed, in one line, or None when it changed nothing."""
    changed = (
        len(after.requests) != len(before.requests)
        or after.concurrency != before.concurrency
        or after.requests != before.requests[: len(after.requests)]
    )
    if not changed:
        return None

    def shape(w: Workload) -> str:
        longest_in = max(r.input_tokens for r in w.requests)
        longest_out = max(r.output_tokens for r in w.requests)
        return f"{len(w.requests)} requests, prompts <= {longest_in}, outputs <= {longest_out}, concurrency {w.concurrency}"

    return f"workload scaled down for --device cpu: {shape(before)} -> {shape(after)}"


CAMPAIGN_CPU_SCALE = {"max_requests": 16, "max_input": 64, "max_output": 32, "max_concurrency": 4}
"""Caps for a campaign's workload on CPU. Passes are several times longer than the hot-vs-cold
benchmark's (``experiment.DEVICE_SCALE``), so a scheduling hiccup on a shared machine is a small
fraction of a pass and a real speedup stands out of the noise; an experiment still takes well
under a second on ``tiny``."""


def resolve_base_build(base: str, store: Store, cache: Path) -> tuple[Path, str]:
    """``(directory, name)`` of ``--base-build``: reference, a stored build id, or a directory."""
    return resolve_build_arg(base, "--base-build", lambda: store, cache), base


def run(args: argparse.Namespace) -> int:

    checked = _checked(args)
    store = open_store(args.store)
    check_store(store, args.store)  # before the model loads and the baseline runs
    workload, profile = load_campaign_workload(args.workload)
    scale_note = None
    if args.device == "cpu":
        fitted = fit_workload(workload, **CAMPAIGN_CPU_SCALE)
        scale_note, workload = _scale_note(workload, fitted), fitted
    agent = make_agent(
        args.agent,
        api_key_file=args.api_key_file,
        model=args.claude_model,
        instructions=args.instructions,
        max_tokens=args.max_tokens,
    )
    with tempfile.TemporaryDirectory(prefix="polymorph-compile-") as tmp:
        base_dir, base_name = resolve_base_build(args.base_build, store, Path(tmp) / "base")
        identity = {
            "model": args.model,
            "device": args.device,
            "dtype": args.dtype,
            "workload": workload.digest,
            "base": build_id(base_dir),
            "agent": args.agent,
            "agentModel": args.claude_model if args.agent == "claude" else "",
            "objective": checked.objective.model_dump(mode="json"),
            "gates": checked.gates.model_dump(mode="json"),
            "repeats": args.repeats,
        }
        if args.fresh:
            identity["fresh"] = secrets.token_hex(8)
        paths = CampaignPaths("local", args.campaign, config_uid(identity))
        settings = CampaignSettings(
            paths=paths,
            base_dir=base_dir,
            base_build=base_name,
            workload=profile,
            workload_hash=workload.digest,
            objective=checked.objective,
            gates=checked.gates,
            budget=checked.budget,
            model=args.model,
            hardware=args.device,
            agent=args.agent,
        )
        display = Display(
            total=checked.budget.maxExperiments, objective=checked.objective, json_mode=args.json
        )
        supervisor = Supervisor(
            args.model,
            device=args.device,
            dtype=args.dtype,
            workload=workload,
            gates=checked.gates,
            experiment_timeout=parse_duration(args.experiment_timeout),
            settings=BenchSettings(repeats=args.repeats),
            fit=args.device != "cpu",  # CPU workloads were fitted above, with CAMPAIGN_CPU_SCALE
            threads=args.threads if args.threads is not None else (1 if args.device == "cpu" else None),
        )
        # Built before the worker starts: a corrupt ledger or progress document is refused at once.
        try:
            campaign = Campaign(settings, store, supervisor, on_record=display.on_record, log=display.log)
        except (StoreError, ValidationError) as exc:
            what = (
                f"its {exc.title} document: {format_validation_error(exc)[0]}"
                if isinstance(exc, ValidationError)
                else str(exc)
            )
            raise UsageError(
                f"cannot resume campaign {store.uri_for(paths.prefix)}: {what}; "
                "repair or delete its documents, or pass --fresh"
            ) from None
        try:
            with supervisor, display:
                display.begin(paths.prefix, len(campaign.ledger))
                if scale_note is not None:
                    display.log(scale_note)
                outcome = campaign.run(agent)
        except WorkerStartError as exc:
            raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(final_json(outcome, supervisor.stats, store, paths), indent=2))
    else:
        render_report(outcome, supervisor.stats, store, paths, args.store)
    return exit_status(outcome)
