"""``polymorph sandbox engine|agent``: the two containers of a CompileJob sandbox pod.

``sandbox engine`` runs untrusted, agent-written builds. It needs no secrets: it loads the
model once into a supervised worker (``supervisor.Supervisor``) and serves the admin API
(``admin.serve_admin``) on 127.0.0.1 only, until SIGTERM. The workload, gates and
experiment timeout come from the CompileJob spec; the model from ``--model`` or
``spec.model``.

``sandbox agent`` is trusted: it holds the Anthropic key (Claude agents) and the store
credentials. It reads the CompileJob (``--spec FILE`` or ``$POLYMORPH_COMPILEJOB``, JSON or
YAML: a whole object with metadata, or a bare spec with ``--name``), waits for the engine,
drives it through ``admin.RemoteRunner``, and writes the ledger, progress and result under
``compilejobs/<ns>/<name>-<uid>/`` in the store (``--store`` or ``$POLYMORPH_STORE``). Its
share is ``$JOB_COMPLETION_INDEX`` (or ``--index``) of ``spec.budget.sandboxes``. It never
loads the model or imports torch. It prints the campaign's final JSON object on stdout.

The ledger keys experiments by the workload hash: the profile's digest, or the sha256 of
``traceUri`` for traces. The result's ``hardware`` comes from ``spec.hardware`` or ``--hardware``.

It only gathers inputs and wires the campaign, the agent and the engine together.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from polymorph.errors import StoreError, UsageError

__all__ = ["configure", "read_compilejob", "run"]

SPEC_ENV = "POLYMORPH_COMPILEJOB"
DEFAULT_PORT = 8471


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="role", metavar="ROLE", required=True)
    engine = sub.add_parser("engine", help="serve the engine's admin API on localhost (no secrets)")
    engine.add_argument("--spec", metavar="FILE", help=f"the CompileJob, JSON or YAML (default ${SPEC_ENV})")
    engine.add_argument("--model", help="model shape or checkpoint dir (default: spec.model.uri)")
    engine.add_argument("--workload", metavar="FILE", help="workload file overriding spec.workload")
    engine.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"admin port on 127.0.0.1 (default {DEFAULT_PORT})"
    )
    engine.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    engine.add_argument(
        "--dtype", help="float32, bfloat16 or float16 (default: spec.model.dtype, else float32)"
    )
    engine.add_argument(
        "--repeats", type=int, default=5, help="measured benchmark passes per experiment (default 5)"
    )
    engine.add_argument("--workdir", metavar="DIR", help="writable scratch folder for unpacked builds")

    agent = sub.add_parser(
        "agent", help="drive the engine and write ledger, progress and result to the store"
    )
    agent.add_argument("--spec", metavar="FILE", help=f"the CompileJob, JSON or YAML (default ${SPEC_ENV})")
    agent.add_argument("--name", help="campaign name when the spec has no metadata")
    agent.add_argument(
        "--namespace", help="namespace when the spec has no metadata (default: metadata, else default)"
    )
    agent.add_argument("--uid", help="campaign uid (default: metadata.uid, else a hash of the spec)")
    agent.add_argument(
        "--engine-url", default=f"http://127.0.0.1:{DEFAULT_PORT}", help="the engine's admin API"
    )
    agent.add_argument("--store", metavar="PATH_OR_URI", help="artifact store (default $POLYMORPH_STORE)")
    agent.add_argument(
        "--index", type=int, help="this sandbox's index (default $JOB_COMPLETION_INDEX, else 0)"
    )
    agent.add_argument(
        "--api-key-file", metavar="FILE", help="file holding the Anthropic API key (Claude agents)"
    )
    agent.add_argument("--hardware", help="hardware label for manifests (default: spec.hardware.accelerator)")
    agent.add_argument(
        "--ready-timeout", type=float, default=900.0, help="seconds to wait for the engine (default 900)"
    )


def read_compilejob(path: str | None, env: dict[str, str] | None = None) -> tuple[Any, dict[str, Any]]:
    """``(CompileJobSpec, metadata dict)`` from ``path`` or ``$POLYMORPH_COMPILEJOB``; UsageError names the field."""
    import yaml
    from pydantic import ValidationError

    from polymorph.api import CompileJob, CompileJobSpec

    env = dict(os.environ) if env is None else env
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read the CompileJob spec file {path}: {exc.strerror or exc}") from None
        where = path
    elif env.get(SPEC_ENV, "").strip():
        text, where = env[SPEC_ENV], f"${SPEC_ENV}"
    else:
        raise UsageError(f"no CompileJob given: pass --spec FILE or set {SPEC_ENV} to its JSON or YAML")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise UsageError(f"the CompileJob in {where} is neither JSON nor YAML") from None
    if not isinstance(doc, dict):
        raise UsageError(f"the CompileJob in {where} must be an object with spec (and metadata)")
    try:
        if "spec" in doc:
            doc = {k: v for k, v in doc.items() if k != "status"}
            job = CompileJob.model_validate(doc)
            return job.spec, job.metadata.model_dump(mode="json")
        return CompileJobSpec.model_validate(doc), {}
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        raise UsageError(f"the CompileJob in {where} is invalid at {loc}: {err['msg']}") from None


def _index(args: argparse.Namespace, sandboxes: int) -> int:
    raw: Any = args.index if args.index is not None else os.environ.get("JOB_COMPLETION_INDEX", "0")
    try:
        index = int(raw)
    except ValueError:
        raise UsageError(f"JOB_COMPLETION_INDEX must be an integer; got {raw!r}") from None
    if not 0 <= index < sandboxes:
        raise UsageError(
            f"the sandbox index must be in 0..{sandboxes - 1} (spec.budget.sandboxes is {sandboxes}); got {index}"
        )
    return index


def _workload_identity(spec: Any) -> tuple[Any, str]:
    """``(profile or None, workload hash)`` as the ledger keys it."""
    w = spec.workload
    if w is not None and w.profile is not None:
        return w.profile, w.profile.digest()
    if w is not None and w.traceUri:
        return None, "sha256:" + hashlib.sha256(w.traceUri.encode()).hexdigest()
    from polymorph_engine.workload import DEFAULT_WORKLOAD

    return DEFAULT_WORKLOAD, DEFAULT_WORKLOAD.digest()


def run(args: argparse.Namespace) -> int:
    if args.role == "engine":
        return run_engine(args)
    return run_agent(args)


# ---------------------------------------------------------------------------------------------
# engine container
# ---------------------------------------------------------------------------------------------


def run_engine(args: argparse.Namespace) -> int:
    from polymorph.api import parse_duration
    from polymorph_engine.admin import serve_admin
    from polymorph_engine.experiment import BenchSettings
    from polymorph_engine.supervisor import Supervisor, WorkerStartError
    from polymorph_engine.workload import load_workload, workload_from_profile

    spec, _ = read_compilejob(args.spec)
    model = args.model or (spec.model.uri if spec.model is not None else None)
    if not model:
        raise UsageError("the engine needs a model: pass --model, or give the CompileJob spec.model")
    dtype = args.dtype or (spec.model.dtype if spec.model is not None else "float32")
    if args.workload:
        workload = load_workload(args.workload)
    elif spec.workload is not None and spec.workload.traceUri:
        if "://" in spec.workload.traceUri:
            raise UsageError(
                f"the engine cannot fetch spec.workload.traceUri {spec.workload.traceUri!r} (it holds no credentials); "
                "mount the trace and pass --workload"
            )
        workload = load_workload(spec.workload.traceUri)
    else:
        profile, _ = _workload_identity(spec)
        workload = workload_from_profile(profile)
    if args.repeats < 2:
        raise UsageError(f"--repeats must be at least 2 so noise can be measured; got {args.repeats}")
    supervisor = Supervisor(
        model,
        device=args.device,
        dtype=dtype,
        workload=workload,
        gates=spec.gates,
        experiment_timeout=parse_duration(spec.budget.experimentTimeout),
        settings=BenchSettings(repeats=args.repeats),
    )
    try:
        supervisor.start()
    except WorkerStartError as exc:
        raise UsageError(str(exc)) from None
    workdir = Path(args.workdir) if args.workdir else None
    try:
        server = serve_admin(supervisor, "127.0.0.1", args.port, workdir=workdir)
        stop = threading.Event()

        def _stop(signum: int, _frame: Any) -> None:
            stop.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, _stop)
        print(
            f"polymorph sandbox engine: admin API on http://127.0.0.1:{args.port}",
            file=sys.stderr,
            flush=True,
        )
        server.serve_forever()
        server.server_close()
    finally:
        supervisor.close()
    return 0


# ---------------------------------------------------------------------------------------------
# agent container
# ---------------------------------------------------------------------------------------------


def run_agent(args: argparse.Namespace) -> int:
    from polymorph.api import parse_duration
    from polymorph.store import open_store
    from polymorph_engine.admin import RemoteRunner
    from polymorph_engine.buildspec import REFERENCE_BUILD
    from polymorph_engine.campaign import Campaign, CampaignSettings
    from polymorph_engine.ledger import CampaignPaths, config_uid
    from polymorph_engine.report import Display
    from polymorph_engine.selection import budget_share

    spec, meta = read_compilejob(args.spec)
    name = args.name or meta.get("name")
    if not name:
        raise UsageError("the CompileJob has no metadata.name; pass --name")
    namespace = args.namespace or meta.get("namespace") or "default"
    uid = args.uid or meta.get("uid") or config_uid(spec.model_dump(mode="json"))
    try:
        paths = CampaignPaths(namespace, name, uid)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    index = _index(args, spec.budget.sandboxes)
    agent: Any
    if spec.agent.kind == "Claude":
        from polymorph_engine.agents.claude import ClaudeAgent, resolve_api_key

        agent = ClaudeAgent(
            api_key=resolve_api_key(args.api_key_file),
            model=spec.agent.model,
            instructions=spec.agent.instructions,
            max_tokens=spec.agent.maxTokens,
        )
    else:
        from polymorph_engine.agents.search import SearchAgent

        agent = SearchAgent()
    store = open_store(args.store)
    profile, workload_hash = _workload_identity(spec)
    hardware = args.hardware or (spec.hardware.accelerator if spec.hardware is not None else "")
    timeout = parse_duration(spec.budget.experimentTimeout)
    runner = RemoteRunner(args.engine_url, timeout=timeout + 60)
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
    summary = {
        "sandbox": index,
        "state": outcome.result["state"],
        "stopReason": outcome.stopReason,
        "message": outcome.message,
        "ledger": store.uri_for(paths.ledger(index)),
        "progress": store.uri_for(paths.progress(index)),
        "result": store.uri_for(paths.result),
        "best": outcome.result.get("best"),
        "experiments": outcome.progress["counts"],
    }
    print(json.dumps(summary, indent=2))
    return 1 if outcome.stopReason in ("agentError", "baselineFailed") else 0
