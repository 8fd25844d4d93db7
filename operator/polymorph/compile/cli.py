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
supervisor observed), and last the path of the campaign's ``report.html`` (its leaderboard and
speedup plot, written beside ``result.json`` by ``report_html``). ``--json`` prints one final
JSON object on stdout instead, with the report's path as ``report`` (progress lines go to
stderr). Exit status: 0 when the campaign reached a result (improved or not), 1
when the baseline failed or the agent failed, 2 for bad input.

It only gathers inputs, calls ``campaign`` with a ``polymorph_engine`` ``Supervisor`` and prints.
It is the one module of ``polymorph`` that imports the engine (see the import-linter contracts).
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from polymorph.compile import report_html
from polymorph.compile.agents import make_agent
from polymorph.compile.campaign import Campaign, CampaignSettings
from polymorph.compile.ledger import CampaignPaths, config_uid
from polymorph.compile.outcome import exit_status
from polymorph.compile.report import Display, final_json, render_report
from polymorph.contract import measurement
from polymorph.contract.api import Budget, Gates, Objective, format_duration
from polymorph.contract.api.common import ObjectiveMetric
from polymorph.contract.builds import resolve_build_arg
from polymorph.contract.errors import StoreError, UsageError
from polymorph.contract.inputs import duration, integer, number, read_text, shown
from polymorph.contract.runner import baseline_timeout
from polymorph.contract.store import Store, build_id, check_writable, open_store, store_uri
from polymorph.contract.validate import format_validation_error

__all__ = ["configure", "run"]


DEVICE_DEFAULTS: dict[str, dict[str, str | int]] = {
    "cpu": {
        "max_experiments": 30,
        "deadline": "10m",
        "experiment_timeout": measurement.DEFAULT_EXPERIMENT_TIMEOUT,
    },
    # A 5-minute campaign. A screen at the workload's real shape takes 2-3 s on llama-8b, but a
    # campaign also pays once for its baseline, its first compiles, its races, the final pairing
    # and the confirmation: in 2 minutes those were most of it (354 experiments an hour on
    # chat-default, H200); in 5 minutes, on an H100, 1,022 an hour on single-stream chat and
    # 1,001 on chat-default (701 before its one-offs were cut: a torch.compile try, the long
    # final pairing and confirmation), and 413 on 2-4k prompts, where each candidate fills a
    # 48k-token decode state (docs/performance.md). The longest that fits one 10-minute device
    # call beside its judgement. A torch.compile candidate still compiling after 30 s is "not
    # ready yet" (one warm retry), and a 5-minute campaign tries none (agents/search.py,
    # SLOW_PREPARE_SHARE). bench/h200.sh shapes runs each traffic shape's campaign on these
    # defaults.
    "cuda": {"max_experiments": 400, "deadline": "5m", "experiment_timeout": "30s"},
}
"""Per device type, ``--max-experiments``, ``--deadline`` and ``--experiment-timeout`` when not given."""


def _device_defaults(args: argparse.Namespace) -> None:
    """Fill the budget flags left out with ``DEVICE_DEFAULTS`` for ``--device``'s type."""
    kind = "cpu" if str(args.device).split(":")[0] == "cpu" else "cuda"
    defaults = DEVICE_DEFAULTS[kind]
    if args.max_experiments is None:
        args.max_experiments = int(defaults["max_experiments"])
    for name in ("deadline", "experiment_timeout"):
        if getattr(args, name) is None:
            setattr(args, name, duration()(str(defaults[name])))


def configure(parser: argparse.ArgumentParser) -> None:
    measurement.add_flags(parser)  # --model, --workload, --device, --dtype, --repeats, --threads, ...
    cpu, cuda = DEVICE_DEFAULTS["cpu"], DEVICE_DEFAULTS["cuda"]
    for action in parser._actions:  # the shared flag's default depends on --device here
        if action.dest == "experiment_timeout":
            action.default = None
            action.help = (
                "per experiment, e.g. 90s or 10m; a hung build is killed after it "
                f"(default: {cpu['experiment_timeout']}; {cuda['experiment_timeout']} with --device cuda)"
            )
    parser.add_argument(
        "--agent",
        choices=["search", "claude"],
        default="search",
        help="who proposes builds (default: search)",
    )
    parser.add_argument(
        "--max-experiments",
        type=integer(1, MAX_EXPERIMENTS),
        metavar="N",
        help=f"experiment budget (default: {cpu['max_experiments']}; {cuda['max_experiments']} with --device cuda)",
    )
    parser.add_argument(
        "--deadline",
        type=duration(),
        metavar="DURATION",
        help=f"time budget, e.g. 90s, 10m, 2h (default: {cpu['deadline']}; {cuda['deadline']} with --device cuda)",
    )
    parser.add_argument(
        "--store",
        type=store_uri,
        metavar="PATH_OR_URI",
        help="artifact store; checked writable before anything runs (default: $POLYMORPH_STORE or ./.polymorph/store)",
    )
    parser.add_argument(
        "--campaign", default="demo", help="campaign name; rerunning a name resumes it (default: demo)"
    )
    parser.add_argument("--fresh", action="store_true", help="start a new campaign instead of resuming")
    parser.add_argument("--json", action="store_true", help="print one final JSON object on stdout")
    parser.add_argument(
        "--min-speedup",
        type=number(1, 1000),
        default=1.05,
        help="gate: speedup the result must reach beyond noise, a finite number >= 1 (default: 1.05)",
    )
    parser.add_argument(
        "--metric",
        default="outputTokensPerSecond",
        help=f"objective metric, one of {', '.join(get_args(ObjectiveMetric))} (default: outputTokensPerSecond)",
    )
    parser.add_argument(
        "--base-build",
        default="reference",
        metavar="DIR_OR_ID",
        help="'reference', a build id from --store, or a build directory (default: reference)",
    )
    parser.add_argument(
        "--claude-model",
        default="claude-sonnet-4-5",
        help="Claude model for --agent claude (default: claude-sonnet-4-5)",
    )
    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="file holding the Anthropic API key (default: $POLYMORPH_ANTHROPIC_KEY_FILE, else $ANTHROPIC_API_KEY)",
    )
    parser.add_argument(
        "--max-tokens",
        type=integer(1),
        default=2_000_000,
        help="the campaign's whole token budget for --agent claude (default: 2000000)",
    )
    parser.add_argument(
        "--instructions", default="", help="extra instructions for --agent claude (default: none)"
    )


MAX_EXPERIMENTS = 1_000_000
CAMPAIGN_CPU_SCALE = measurement.CPU_SCALE
"""The CPU workload caps of a campaign (``polymorph.contract.measurement.CPU_SCALE``; bench scripts read this name)."""


@dataclass(frozen=True)
class _Checked:
    objective: Objective
    gates: Gates
    budget: Budget


def _checked(args: argparse.Namespace) -> _Checked:
    """Validate flags into plain values; UsageError names the flag (argparse checked the numbers)."""
    if (
        not args.campaign
        or len(args.campaign) > 63
        or not all(c.isalnum() or c in "-." for c in args.campaign)
        or args.campaign != args.campaign.lower()
    ):
        raise UsageError(
            f"--campaign must be at most 63 lowercase letters, digits, '-' and '.'; got {shown(args.campaign)}"
        )
    try:
        objective = Objective(metric=args.metric)
    except ValueError:
        raise UsageError(
            "--metric must be outputTokensPerSecond, totalTokensPerSecond, ttftP95 or itlP95; "
            f"got {shown(args.metric)}"
        ) from None
    return _Checked(
        objective=objective,
        gates=Gates(minSpeedup=args.min_speedup),
        budget=Budget(
            maxExperiments=args.max_experiments,
            deadline=format_duration(args.deadline),
            sandboxes=1,
            experimentTimeout=format_duration(args.experiment_timeout),
        ),
    )


def check_store(store: Store, uri: str | None) -> None:
    """The store is writable, checked before the model loads and the baseline runs."""
    check_writable(store, "--store", uri)


def resolve_base_build(base: str, store: Store, cache: Path) -> tuple[Path, str]:
    """``(directory, name)`` of ``--base-build``: reference, a stored build id, or a directory."""
    return resolve_build_arg(base, "--base-build", lambda: store, cache), base


def _rerun(args: argparse.Namespace, base: str) -> Callable[[str], str]:
    """The ``polymorph experiment`` line that measures a build of this campaign as it did."""

    def line(build: str) -> str:
        return measurement.rerun_command(
            build=build,
            against=base,
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            workload=args.workload,
            repeats=args.repeats,
            threads=args.threads,
            store=args.store,
            seed=args.seed,
            tensor_parallel=args.tensor_parallel,
        )

    return line


def run(args: argparse.Namespace) -> int:
    _device_defaults(args)
    checked = _checked(args)
    if args.api_key_file:  # read before the agent is made, and bounded: a key is a short line
        read_text(args.api_key_file, "--api-key-file", limit=64 * 1024)
    store = open_store(args.store)
    check_store(store, args.store)  # before the model loads and the baseline runs
    replay = measurement.campaign_workload(args.workload, args.device, seed=args.seed)
    workload, profile, scale_note = replay.workload, replay.profile, replay.scale_note
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
        if args.seed:  # seed 0 keeps the identity campaigns had before --seed existed
            identity["seed"] = args.seed
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
        # The one module of ``polymorph`` that imports the engine (an import-linter contract names
        # this exception): it wires a local, supervised engine worker into ``polymorph compile``.
        # Imported here, once every input was checked, so a bad flag is answered without torch.
        from polymorph_engine.experiment.settings import BenchSettings
        from polymorph_engine.experiment.supervisor import Supervisor, WorkerStartError

        supervisor = Supervisor(
            args.model,
            device=args.device,
            dtype=args.dtype,
            workload=workload,
            gates=checked.gates,
            experiment_timeout=args.experiment_timeout,
            baseline_timeout=baseline_timeout(args.experiment_timeout),
            settings=BenchSettings(repeats=args.repeats, seed=args.seed, scaled=scale_note or ""),
            seed=args.seed,
            fit=replay.fit_on_device,  # CPU workloads were fitted above, with measurement.CPU_SCALE
            threads=measurement.worker_threads(args.threads, args.device),
            tensor_parallel=args.tensor_parallel,
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
    report = report_html.publish(store, paths, outcome.result)  # beside result.json
    if args.json:
        print(json.dumps({**final_json(outcome, supervisor.stats, store, paths), "report": report}, indent=2))
    else:
        render_report(outcome, supervisor.stats, store, paths, rerun=_rerun(args, base_name))
        print(f"report: {report}")
    return exit_status(outcome)
