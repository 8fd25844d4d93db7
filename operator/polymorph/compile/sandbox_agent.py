"""``polymorph sandbox agent``: the trusted container of a CompileJob sandbox pod.

It holds the Anthropic key (Claude agents) and the store credentials. It reads the CompileJob
(``polymorph.contract.job``: ``--spec FILE`` or ``$POLYMORPH_COMPILEJOB``, a whole object with
metadata, or a bare spec with ``--name``), waits for the engine container, drives it through
``runner.RemoteRunner``, and writes the ledger, progress, result and ``report.html``
(``report_html``, over every sandbox's ledger so far) under
``compilejobs/<ns>/<name>-<uid>/`` in the store (``--store`` or ``$POLYMORPH_STORE``). Its share
is ``$JOB_COMPLETION_INDEX`` (or ``--index``) of ``spec.budget.sandboxes``. It never loads the
model or imports torch. It prints a JSON summary on stdout; its exit status is
``outcome.exit_status``, the same rule as ``polymorph compile``.

The result's ``hardware`` comes from ``spec.hardware`` or ``--hardware``. The engine container
is ``polymorph_engine.sandbox.cli``.

It only gathers inputs and wires the campaign, the agent and the engine together.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from polymorph.compile import report_html
from polymorph.compile.agents import make_agent
from polymorph.compile.campaign import Campaign, CampaignSettings
from polymorph.compile.judgement import budget_share
from polymorph.compile.ledger import CampaignPaths, config_uid
from polymorph.compile.outcome import exit_status
from polymorph.compile.report import Display
from polymorph.contract.api import DEFAULT_NAMESPACE, parse_duration
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.errors import StoreError, UsageError
from polymorph.contract.inputs import duration, http_url, integer, read_text
from polymorph.contract.job import SPEC_ENV, read_compilejob, sandbox_index, workload_identity
from polymorph.contract.runner import RemoteRunner, baseline_timeout
from polymorph.contract.store import open_store

__all__ = ["DEFAULT_PORT", "configure", "run"]

DEFAULT_PORT = 8471
"""The engine container's admin port on 127.0.0.1."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", metavar="FILE", help=f"the CompileJob, JSON or YAML (default: ${SPEC_ENV})")
    parser.add_argument("--name", help="campaign name when the spec has no metadata (default: metadata.name)")
    parser.add_argument(
        "--namespace", help="namespace when the spec has no metadata (default: metadata, else default)"
    )
    parser.add_argument("--uid", help="campaign uid (default: metadata.uid, else a hash of the spec)")
    parser.add_argument(
        "--engine-url",
        type=http_url,
        default=f"http://127.0.0.1:{DEFAULT_PORT}",
        help=f"the engine's admin API (default: http://127.0.0.1:{DEFAULT_PORT})",
    )
    parser.add_argument("--store", metavar="PATH_OR_URI", help="artifact store (default: $POLYMORPH_STORE)")
    parser.add_argument(
        "--index", type=integer(0, 63), help="this sandbox's index (default: $JOB_COMPLETION_INDEX, else 0)"
    )
    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="file holding the Anthropic API key for Claude agents (default: $POLYMORPH_ANTHROPIC_KEY_FILE, "
        "else $ANTHROPIC_API_KEY)",
    )
    parser.add_argument(
        "--hardware", help="hardware label for manifests (default: spec.hardware.accelerator)"
    )
    parser.add_argument(
        "--ready-timeout",
        type=duration(),
        default="15m",
        metavar="DURATION",
        help="how long to wait for the engine to load the model (default: 15m)",
    )


def run(args: argparse.Namespace) -> int:
    spec, meta = read_compilejob(args.spec)
    name = args.name or meta.get("name")
    if not name:
        raise UsageError("the CompileJob has no metadata.name; pass --name")
    namespace = args.namespace or meta.get("namespace") or DEFAULT_NAMESPACE
    uid = args.uid or meta.get("uid") or config_uid(spec.model_dump(mode="json"))
    try:
        paths = CampaignPaths(namespace, name, uid)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    index = sandbox_index(args.index, spec.budget.sandboxes)
    if args.api_key_file:  # bounded: a key is a short line
        read_text(args.api_key_file, "--api-key-file", limit=64 * 1024)
    agent = make_agent(
        spec.agent.kind,
        api_key_file=args.api_key_file,
        model=spec.agent.model,
        instructions=spec.agent.instructions,
        max_tokens=spec.agent.maxTokens,
    )
    store = open_store(args.store)
    profile, workload_hash = workload_identity(spec)
    hardware = args.hardware or (spec.hardware.accelerator if spec.hardware is not None else "")
    timeout = parse_duration(spec.budget.experimentTimeout)
    # The engine's supervisor enforces the experiment timeout (a baseline's is longer, and a
    # pairing with it may add the baseline's own seconds); this only bounds a request the engine
    # never answers.
    runner = RemoteRunner(args.engine_url, timeout=baseline_timeout(timeout) + timeout + 60)
    try:
        runner.wait_ready(timeout=args.ready_timeout)
    except TimeoutError as exc:
        raise UsageError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="polymorph-agent-") as tmp:
        if spec.baseBuild == "reference":
            base_dir = REFERENCE_BUILD
        else:
            try:
                base_dir = store.get_build(spec.baseBuild, Path(tmp))
            except StoreError as exc:
                raise UsageError(f"spec.baseBuild {spec.baseBuild}: {exc}") from None
        settings = CampaignSettings(
            paths=paths,
            base_dir=base_dir,
            base_build=spec.baseBuild,
            workload=profile,
            workload_hash=workload_hash,
            objective=spec.objective,
            gates=spec.gates,
            budget=spec.budget,
            sandbox=index,
            model=spec.model.uri
            if spec.model is not None
            else (spec.deploymentRef.name if spec.deploymentRef else ""),
            hardware=hardware,
            agent=spec.agent.kind.lower(),
        )
        total = budget_share(spec.budget.maxExperiments, spec.budget.sandboxes, index)
        display = Display(total=total, objective=spec.objective, json_mode=True)
        campaign = Campaign(settings, store, runner, on_record=display.on_record, log=display.log)
        display.begin(paths.prefix, len(campaign.ledger))
        outcome = campaign.run(agent)
    report = report_html.publish(store, paths, outcome.result, spec.budget.sandboxes)  # beside result.json
    summary = {
        "sandbox": index,
        "state": outcome.result.state,
        "stopReason": outcome.stopReason,
        "message": outcome.message,
        "ledger": store.uri_for(paths.ledger(index)),
        "progress": store.uri_for(paths.progress(index)),
        "result": store.uri_for(paths.result),
        "report": report,
        "best": outcome.result.best.model_dump(mode="json") if outcome.result.best else None,
        "experiments": outcome.progress.counts.model_dump(mode="json"),
    }
    print(json.dumps(summary, indent=2))
    return exit_status(outcome)
