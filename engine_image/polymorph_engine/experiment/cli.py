"""``polymorph experiment``: run builds through verification and benchmark in ONE hot engine.

Every ``--build`` (a directory, ``reference``, or a ``sha256:`` id fetched from ``--store`` and
hash-verified) runs in order in one supervised worker (``supervisor.Supervisor``), which loads
the weights once. ``--knob name=value`` runs a variant of each build with those knob defaults;
a knob whose declared requirement is not met (``decode_capture`` without ``kv_cache=static``)
is refused rather than silently ignored. ``--experiment-timeout`` uses the one duration syntax
of manifests and every other command (``90s``, ``10m``).
Output: one ``ExperimentRecord`` JSON per line with ``--json`` (printed as each experiment
ends), else a table. Exit status: 0 when every build passed, 1 when any did not, 2 for bad
input (one sentence naming the flag or file, never a traceback).

It knows nothing about agents or Kubernetes; it only gathers inputs, calls the supervisor and
prints what comes back.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polymorph.contract import measurement
from polymorph.contract.api import ExperimentRecord, measured_shape_of
from polymorph.contract.builds import knob_variant, read_build, resolve_build_arg, resolve_knobs
from polymorph.contract.errors import BuildError, UsageError
from polymorph.contract.inputs import integer
from polymorph.contract.store import open_store, store_uri
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.supervisor import Supervisor, SupervisorStats, WorkerStartError
from polymorph_engine.runtime.config import SHAPES, dtype_name

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: 0 when every build passed, 1 when any did not, 2 for bad input"
    parser.add_argument(
        "--build",
        action="append",
        required=True,
        metavar="DIR_OR_ID",
        help="a build directory, 'reference', or a build id sha256:<hex> from --store; repeat to run several",
    )
    parser.add_argument(
        "--against",
        metavar="DIR_OR_ID",
        help="a baseline build to pair each build with, as a campaign does: interleaved passes and a "
        "speedup with its interval (default: none: each build is measured alone)",
    )
    parser.add_argument(
        "--knob", action="append", default=[], metavar="NAME=VALUE", help="run variants with this knob"
    )
    measurement.add_flags(parser)  # the same measurement flags and defaults as polymorph compile
    parser.add_argument(
        "--store",
        type=store_uri,
        metavar="PATH_OR_URI",
        help="artifact store for build ids (default: $POLYMORPH_STORE or ./.polymorph/store)",
    )
    parser.add_argument(
        "--warmup", type=integer(0, 100), default=1, help="unmeasured warm-up passes per build (default: 1)"
    )
    parser.add_argument("--json", action="store_true", help="print one ExperimentRecord JSON per line")


def _check_requirements(builds: list[Path], knobs: dict[str, str]) -> None:
    """Refuse a ``--knob`` that would do nothing: one whose declared requirement is not met.

    E.g. ``decode_capture=compile`` requires ``kv_cache=static``; with the build's ``concat``
    cache it would be silently ignored.
    """
    for build in builds:
        try:
            spec = read_build(build)
            resolved = resolve_knobs(spec, knobs)
        except BuildError as exc:
            raise UsageError(f"--knob: {exc}") from None
        for name in knobs:
            knob = spec.knobs[name]
            if resolved[name] == knob.default:
                continue
            unmet = {k: v for k, v in knob.requires.items() if resolved.get(k) != v}
            if unmet:
                needs = " ".join(f"--knob {k}={_flag_value(v)}" for k, v in unmet.items())
                has = ", ".join(f"{k}={_flag_value(resolved.get(k))}" for k in unmet)
                raise UsageError(
                    f"--knob {name}={knobs[name]} has no effect with {has} (build {spec.name}); add {needs}."
                )


def _flag_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _knobs(items: list[str]) -> dict[str, str]:
    knobs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f"--knob must look like name=value (e.g. kv_cache=static); got {item!r}.")
        knobs[name.strip()] = value.strip()
    return knobs


_DEVICE = re.compile(r"(cpu|cuda)(?::([1-9][0-9]*|0))?")
"""The devices the engine runs on, as torch.device spells them (its own pattern: ``cuda:01`` is not one)."""


def _device(text: str) -> str:
    """``--device``, checked without torch for the CPU: this process only supervises, and the
    worker loads torch (importing it here too cost each run about 2 CPU-seconds)."""
    match = _DEVICE.fullmatch(text)
    if match is None:
        raise UsageError(f"--device must be cpu or cuda[:N]; got {text!r}.")
    if match.group(1) == "cuda":  # torch is needed to know, and it judges the index as it did
        import torch

        try:
            torch.device(text)
        except RuntimeError:
            raise UsageError(f"--device must be cpu or cuda[:N]; got {text!r}.") from None
        if not torch.cuda.is_available():
            raise UsageError("--device cuda was asked for, but no CUDA device is visible to torch here.")
    return text


def _model(source: str) -> str:
    if source not in SHAPES and not Path(source).is_dir():
        raise UsageError(
            f"--model must be a shape ({', '.join(SHAPES)}) or a checkpoint directory; got {source!r}."
        )
    return source


def _resolve_build(arg: str, store_uri: str | None, cache: Path) -> Path:
    return resolve_build_arg(arg, "--build", lambda: open_store(store_uri), cache)


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="polymorph-experiment-") as tmp:
        yield Path(tmp)


def run(args: argparse.Namespace) -> int:
    knobs = _knobs(args.knob)
    device = _device(args.device)
    dtype_name(args.dtype)  # a UsageError names the allowed values
    model = _model(args.model)
    replay = measurement.campaign_workload(args.workload, device, seed=args.seed)
    records: list[ExperimentRecord] = []
    with _workdir() as work:
        builds = [_resolve_build(arg, args.store, work / "store-cache") for arg in args.build]
        against = _resolve_build(args.against, args.store, work / "store-cache") if args.against else None
        if knobs:
            _check_requirements(builds, knobs)
            try:
                builds = [knob_variant(b, knobs, work / f"variant-{i}") for i, b in enumerate(builds)]
            except BuildError as exc:
                raise UsageError(f"--knob: {exc}") from None
        settings = BenchSettings(
            repeats=args.repeats, warmup=args.warmup, seed=args.seed, scaled=replay.scale_note or ""
        )
        supervisor = Supervisor(
            model,
            device,
            args.dtype,
            replay.workload,
            experiment_timeout=args.experiment_timeout,
            seed=args.seed,
            settings=settings,
            fit=replay.fit_on_device,  # CPU workloads are fitted with measurement.CPU_SCALE, as compile's
            threads=measurement.worker_threads(args.threads, device),
            tensor_parallel=args.tensor_parallel,
        )
        try:
            with supervisor:
                for build in builds:
                    record = supervisor.run(build, against=against)
                    records.append(record)
                    if args.json:
                        print(record.model_dump_json(), flush=True)
        except WorkerStartError as exc:
            raise UsageError(str(exc)) from None
    if not args.json:
        shape = measured_shape_of(records)  # with any scaling, the worker's on an accelerator too
        if shape is not None:
            print(f"measured at: {shape.summary()}")
        elif replay.scale_note:
            print(replay.scale_note)
        _print_table(records, supervisor.stats)
    return 0 if all(r.status == "passed" for r in records) else 1


def _speedup(record: ExperimentRecord) -> str:
    """``1.43x [1.40, 1.46] (9 pairs)`` for a paired record, else ``-``."""
    c = record.comparison
    return f"{c.ratio:.2f}x [{c.lo:.2f}, {c.hi:.2f}] ({c.pairs} pairs)" if c else "-"


def _print_table(records: list[ExperimentRecord], stats: SupervisorStats) -> None:
    """A plain fixed-width table (it survives pipes, logs and narrow terminals)."""
    header = (
        "build",
        "name",
        "status",
        "agree",
        "logit err",
        "out tok/s",
        "noise",
        "baseline",
        "speedup",
        "ttft p50",
        "itl p50",
        "time s",
    )
    rows = [header]
    for r in records:
        v, f = r.verification, r.figures
        rows.append(
            (
                r.build[:15] or "-",
                r.name or "-",
                r.status,
                f"{v.tokenAgreement:.3f}" if v else "-",
                f"{v.logitError:.1e}" if v else "-",
                f"{f.outputTokensPerSecond:.1f}" if f else "-",
                f"{f.noise:.0%}" if f else "-",
                f"{r.comparison.baseline.outputTokensPerSecond:.1f}" if r.comparison else "-",
                _speedup(r),
                f"{f.ttftP50Ms:.2f}ms" if f else "-",
                f"{f.itlP50Ms:.2f}ms" if f else "-",
                f"{r.timings.totalS:.3f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for r in records:
        if r.error:
            print(f"{r.build[:15]} {r.status}: {r.error}")
    print(
        f"worker starts: {stats.starts} ({stats.mean_load_s:.2f} s each); "
        f"experiments: {stats.experiments} ({stats.mean_experiment_s:.3f} s each)"
    )
