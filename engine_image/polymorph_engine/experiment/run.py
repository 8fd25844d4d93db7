"""One experiment, in process: swap a build in, verify it, benchmark it, record the outcome.

Owns: the experiment protocol and its ``polymorph.contract.api.ExperimentRecord``:
- load the build into the hot ``Engine`` (an exception -> ``failed``);
- verify against the golden outputs (an exception -> ``failed``; a gate missed, NaN/inf
  included -> ``rejected`` with the measured values);
- benchmark the workload (an exception -> ``failed``); otherwise ``passed`` with figures.
  The benchmark is ``measure``'s protocol: warm-up to a steady state, then passes until the
  confidence interval reaches ``BenchSettings.target_half_width`` (default 2% on an
  accelerator, 4% on a CPU) or a cap. With ``against`` (a baseline build directory) it is a
  paired, interleaved benchmark: the baseline is held loaded beside the candidate (a
  ``pairing.BaselineSlot``, kept across experiments so a stream of candidates against one
  baseline loads it once), both replay the same prompts in ABBA order, and the record's
  ``comparison`` carries candidate / baseline with its CI and the baseline's figures. Each
  build's passes share one KV cache (``bench.ReusedCache``): per-bucket graph captures and
  compiled-step warm-ups happen once, as in a server, not inside every pass. The candidate is
  verified through the same cache it is benchmarked on. The baseline's cache, and the decode
  state a sampled pass fills on it, stay in its slot across experiments (the engine keeps the
  cuBLAS workspaces its captured graphs replay into), so a baseline held warm by its slot since
  an earlier experiment runs one warm-up pass, not a new steady-state search or fill.
  Verification runs first and the warm-up passes follow it directly, so an accelerator never
  idles (and drops its clocks) between the two.
A ``failed`` record's ``error`` is one line: the exception type and message, plus the
innermost frame inside the build's own files, so an agent can find the line.
``crashed`` and ``timeout`` cannot happen in process; ``supervisor.Supervisor`` records them.

Also owns ``InProcessRunner``, a ``polymorph.contract.runner.Runner`` for trusted code and tests
(``supervisor.Supervisor`` is the contained one), and ``fit_for_device``, the workload scaling
both hot and cold runs share.

It knows nothing about processes, stores, agents or the CLI.
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from polymorph.contract.api import ExperimentRecord, Gates
from polymorph.contract.api.build import MeasuredShape, PairedComparison, Timings, Verification
from polymorph.contract.steps import Plan, plan
from polymorph.contract.workload import Workload, fit_workload
from polymorph_engine.experiment.bench import PassResult, ReusedCache, figures_of, make_prompts, replay
from polymorph_engine.experiment.measure import (
    CPU_TARGET,
    CPU_TIME_CAP,
    GPU_TARGET,
    GPU_TIME_CAP,
    MeasurePolicy,
    PairedMeasurement,
    as_wall,
    measure_one,
    measure_paired,
    waits_more,
)
from polymorph_engine.experiment.pairing import BaselineSlot
from polymorph_engine.experiment.sampled import SampledPass
from polymorph_engine.experiment.settings import BenchSettings
from polymorph_engine.experiment.verify import Golden, verify
from polymorph_engine.runtime.hotreload import Engine, build_id_of
from polymorph_engine.runtime.model import LoadedModel

__all__ = [
    "DEVICE_SCALE",
    "SAMPLED_MAX_REQUESTS",
    "InProcessRunner",
    "describe_error",
    "fit_for_device",
    "inert_knobs",
    "measure_policy",
    "measured_shape",
    "record_paired",
    "run_experiment",
    "scale_note",
    "timed_by_cpu",
    "vocab_size_of",
]


def timed_by_cpu(settings: BenchSettings, device: torch.device | str) -> bool:
    """Whether passes are timed by the process's CPU time (``settings.clock``: auto = on CPU devices)."""
    if settings.clock == "auto":
        return torch.device(device).type == "cpu"
    return settings.clock == "cpu"


def measure_policy(settings: BenchSettings, device: torch.device | str) -> MeasurePolicy:
    """The measurement policy of ``settings`` for ``device`` (the default target depends on its type)."""
    cpu = torch.device(device).type == "cpu"
    target = settings.target_half_width
    if target is None:
        target = CPU_TARGET if cpu else GPU_TARGET
    cap = settings.time_cap_s
    if cap is None:
        cap = CPU_TIME_CAP if cpu else GPU_TIME_CAP
    return MeasurePolicy(
        min_passes=settings.repeats,
        max_passes=max(settings.repeats, settings.max_repeats),
        target_half_width=target,
        time_cap_s=cap,
        min_warmup=settings.warmup,
        max_warmup=max(settings.warmup, settings.max_warmup),
        warmup_tolerance=settings.warmup_tolerance,
    )


DEVICE_SCALE: dict[str, dict[str, int]] = {
    # A tiny model on CPU: an experiment takes tens of milliseconds.
    "cpu": {"max_requests": 8, "max_input": 32, "max_output": 8, "max_concurrency": 4},
    # One accelerator: one wave of 4 requests, 15 decode steps at batch 4 (60 ITL samples a pass).
    # A paired experiment runs >= 4 warm-up and >= 10 measured passes, so passes are kept to
    # ~0.1-0.2 s on a fast 8B build (the ratio's 2% interval then comes in a second or two);
    # the former two waves of 8 requests doubled every pass for no extra precision per second.
    "cuda": {"max_requests": 4, "max_input": 128, "max_output": 16, "max_concurrency": 4},
}
"""Per device type, the caps ``fit_for_device`` applies to a workload (same for hot and cold)."""

SAMPLED_MAX_REQUESTS = 4096
"""Requests a sampled pass lays out, at most (spread over the whole trace): ~10 ms of CPU a pass."""


def fit_for_device(
    workload: Workload, device: str, max_seq_len: int | None = None, settings: BenchSettings | None = None
) -> Workload:
    """``workload`` as ``device`` measures it, every request within ``max_seq_len``.

    Sampled passes (``settings.sampled_on``: accelerators by default) measure the whole workload,
    scaled only where a request would not fit the model's positions. Replayed passes scale it by
    ``DEVICE_SCALE`` for the device type."""
    kind = torch.device(device).type
    if settings is not None and settings.sampled_on(kind):
        if len(workload.requests) > SAMPLED_MAX_REQUESTS:  # laid out every pass: keep it quick
            workload = fit_workload(workload, max_requests=SAMPLED_MAX_REQUESTS)
        if max_seq_len is None or workload.max_tokens <= max_seq_len:
            return workload
        longest_in = max(r.input_tokens for r in workload.requests)
        longest_out = max(r.output_tokens for r in workload.requests)
        share = longest_in / (longest_in + longest_out)
        max_input = max(1, min(longest_in, int(max_seq_len * share)))
        return fit_workload(workload, max_input=max_input, max_output=max(1, max_seq_len - max_input))
    caps = dict(DEVICE_SCALE.get(kind, DEVICE_SCALE["cuda"]))
    if max_seq_len is not None:
        caps["max_input"] = max(1, min(caps["max_input"], max_seq_len // 2))
        caps["max_output"] = max(1, min(caps["max_output"], max_seq_len - caps["max_input"]))
    return fit_workload(workload, **caps)


def _lengths(workload: Workload) -> str:
    longest_in = max(r.input_tokens for r in workload.requests)
    longest_out = max(r.output_tokens for r in workload.requests)
    return (
        f"{len(workload.requests)} requests, prompts <= {longest_in}, outputs <= {longest_out}, "
        f"concurrency {workload.concurrency}"
    )


def scale_note(before: Workload, after: Workload, device: str) -> str:
    """What fitting ``before`` for ``device`` changed, in one line ("" when nothing)."""
    if after == before:
        return ""
    return f"workload scaled down for --device {device}: {_lengths(before)} -> {_lengths(after)}"


def measured_shape(workload: Workload, settings: BenchSettings, sampled: Plan | None) -> MeasuredShape:
    """The ``MeasuredShape`` of figures measured on ``workload`` with ``settings`` (``sampled``: the plan)."""
    slots, length = settings.cache_shape(workload)
    prompts = sorted(r.input_tokens for r in workload.requests)
    outputs = sorted(r.output_tokens for r in workload.requests)
    return MeasuredShape(
        method="sampledSteps" if sampled is not None else "replay",
        requests=len(workload.requests),
        concurrency=workload.concurrency,
        promptTokensP50=prompts[len(prompts) // 2],
        promptTokensMax=prompts[-1],
        outputTokensP50=outputs[len(outputs) // 2],
        outputTokensMax=outputs[-1],
        cacheSlots=slots,
        cacheLen=length,
        decodeSteps=(sampled or _plan(workload, length)).decode_steps,
        sampled=sampled.describe() if sampled is not None else "",
        scaled=settings.scaled,
    )


@functools.lru_cache(maxsize=8)
def _plan(workload: Workload, length: int) -> Plan:
    """``steps.plan`` of a workload for caches of ``length`` positions, once per worker (a campaign
    measures one workload throughout). The scheduler's batch is the workload's concurrency; the
    cache's spare slots, if any, only take the prefill samples (``SampledPass``)."""
    return plan(workload, None, length)


def vocab_size_of(model: LoadedModel) -> int:
    """The vocabulary size of a loaded model."""
    return int(model.config.vocab_size)


def inert_knobs(hotpath: object, knobs: dict[str, Any]) -> list[str]:
    """The knobs ``hotpath`` says change nothing for its model (its optional ``inert_knobs``),
    those of them the build declares, sorted. A build's code is untrusted: anything else in the
    attribute is ignored, and naming a knob inert can only narrow a search, never fake a figure."""
    named = getattr(hotpath, "inert_knobs", ())
    if isinstance(named, str) or not isinstance(named, (list, tuple, set, frozenset)):
        return []
    return sorted({k for k in named if isinstance(k, str) and k in knobs})


def describe_error(exc: BaseException, build_dir: Path | None = None) -> str:
    """One line: ``Type: message`` plus the innermost frame in ``build_dir`` (``at file.py:12 in fn``)."""
    message = " ".join(str(exc).split()) or "(no message)"
    if len(message) > 400:
        message = message[:397] + "..."
    text = f"{type(exc).__name__}: {message}"
    if build_dir is not None:
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if Path(f.filename).resolve().is_relative_to(build_dir.resolve())
        ]
        if frames:
            frame = frames[-1]
            text += f" (at {Path(frame.filename).relative_to(build_dir.resolve())}:{frame.lineno} in {frame.name})"
    return text


def run_experiment(
    engine: Engine,
    build_dir: str | Path,
    workload: Workload,
    gates: Gates,
    golden: Golden,
    *,
    knobs: dict[str, Any] | None = None,
    description: str = "",
    settings: BenchSettings = BenchSettings(),
    against: str | Path | None = None,
    slot: BaselineSlot | None = None,
    screen: bool = False,
    verified: dict[str, Verification] | None = None,
) -> ExperimentRecord:
    """Swap ``build_dir`` into ``engine``, verify and benchmark it; never raises for a bad build.

    With ``against``, the benchmark is paired with that build, held in ``slot`` (a temporary
    slot, released on return, when None). ``screen``: the short screening protocol
    (``MeasurePolicy.screening``). ``verified``: verifications that passed in this engine, by
    build id and knobs; a build found there is not verified again (same code, same golden
    outputs), and one that passes now is added.
    """
    build_dir = Path(build_dir).resolve()
    started = time.perf_counter()
    timings = Timings()
    record = ExperimentRecord(
        build="", status="failed", workloadHash=workload.digest, description=description, screen=screen
    )
    candidate: ReusedCache | None = None
    own_slot = slot is None and against is not None
    if own_slot:
        slot = BaselineSlot(engine.model)
    keep = slot is not None and slot.keeps_graphs
    try:
        record.build = build_id_of(build_dir)
        loaded = engine.load_build(build_dir, knobs, keep_workspaces=keep)
        timings.loadS = loaded.load_s
        record.name, record.parent, record.knobs = loaded.name, loaded.parent, loaded.knobs
        record.inertKnobs = inert_knobs(loaded.hotpath, loaded.knobs)
        if not description:
            record.description = loaded.spec.description
        device = engine.model.device
        # One cache for verification and the benchmark: the build prepares it (graph captures,
        # compiled warm-ups) once, and the benchmark's warm-up starts from a prepared build.
        candidate = ReusedCache(loaded.hotpath, shape=settings.cache_shape(workload))
        key = f"{record.build} {sorted((knobs or {}).items())!r}"
        known = verified.get(key) if verified is not None else None
        t = time.perf_counter()
        record.verification = known or verify(candidate, golden, gates, device=device)
        timings.verifyS = time.perf_counter() - t
        if verified is not None and record.verification.passed:
            verified[key] = record.verification
        if not record.verification.passed:
            record.status = "rejected"
        else:
            if against is not None:
                assert slot is not None
                try:
                    slot.hotpath(Path(against).resolve())
                except Exception as exc:
                    raise RuntimeError(
                        f"the baseline to pair against ({against}) could not be loaded: {describe_error(exc)}"
                    ) from exc
            t = time.perf_counter()
            _benchmark(
                record,
                timings,
                candidate,
                slot if against is not None else None,
                workload,
                settings,
                engine.model,
                screen,
            )
            timings.benchS = time.perf_counter() - t
            record.status = "passed"
    except Exception as exc:
        record.status = "failed"
        record.error = describe_error(exc, build_dir)
        engine.unload(keep_workspaces=slot is not None and slot.keeps_graphs)
    finally:
        if candidate is not None:
            timings.prepareS = candidate.prepare_s
            candidate.release()
        if own_slot and slot is not None:
            slot.close()
    timings.totalS = time.perf_counter() - started
    record.timings = timings
    return record


def _benchmark(
    record: ExperimentRecord,
    timings: Timings,
    candidate: ReusedCache,
    slot: BaselineSlot | None,
    workload: Workload,
    settings: BenchSettings,
    model: LoadedModel,
    screen: bool = False,
) -> None:
    """Measure ``candidate`` (paired with the baseline ``slot`` holds, when given) and fill the record's figures.

    Each build's passes share one cache for the whole measurement, as a server keeps one: the
    candidate's is the one it was verified through; the baseline's is the slot's, kept across
    experiments with its pass state (see ``pairing``). A baseline the slot has warmed in an
    earlier experiment runs one unmeasured pass, not a new steady-state search.
    """
    device = model.device
    policy = measure_policy(settings, device)
    if screen:
        policy = policy.screening()

    cpu = timed_by_cpu(settings, device)
    clock = time.process_time if cpu else time.perf_counter
    shape = settings.cache_shape(workload)
    sampled = _plan(workload, shape[1]) if settings.sampled_on(torch.device(device).type) else None
    measured = measured_shape(workload, settings, sampled)

    def passes_of(reused: ReusedCache) -> Callable[[], PassResult]:
        if sampled is not None:
            return SampledPass(
                reused,
                workload,
                sampled,
                shape,
                vocab_size=vocab_size_of(model),
                device=device,
                clock=clock,
                seed=settings.seed,
            )
        prompts = make_prompts(workload, vocab_size_of(model), settings.seed)
        return lambda: replay(reused, workload, prompts, device=device, clock=clock, cache_len=shape[1])

    def filled(run: Callable[[], PassResult]) -> float:
        return run.fill_s if isinstance(run, SampledPass) else 0.0

    run_candidate = passes_of(candidate)
    if slot is None:
        one = measure_one(run_candidate, policy)
        record.figures = figures_of(one.passes, one.warmup, measured)
        record.passes, record.halfWidth = len(one.passes), one.estimate.half_width
        timings.warmupS, timings.fillS = one.warmup_s, filled(run_candidate)
        return
    assert slot.build is not None
    run_baseline = slot.passes((workload.digest, settings.seed, sampled), passes_of, shape)
    base_filled = filled(run_baseline)
    paired = measure_paired(run_candidate, run_baseline, policy, baseline_warm=slot.warm)
    slot.warm = True
    timings.warmupS = paired.warmup_s
    timings.fillS = filled(run_candidate) + filled(run_baseline) - base_filled
    if cpu and waits_more(paired.candidate, paired.baseline):
        # The candidate spends its pass waiting rather than computing (sleeps, locks, I/O): CPU time
        # would flatter it, so this comparison is judged by wall time.
        cpu = False
        paired = as_wall(paired, policy.confidence)
    record_paired(record, slot.build, paired, "cpu" if cpu else "wall", measured)


def record_paired(
    record: ExperimentRecord,
    against: str,
    paired: PairedMeasurement,
    clock: Literal["cpu", "wall"],
    shape: MeasuredShape | None = None,
) -> None:
    """Fill ``record``'s figures and ``comparison`` from a paired measurement against build ``against``."""
    est = paired.estimate
    record.figures = figures_of(paired.candidate, paired.candidate_warmup, shape)
    record.comparison = PairedComparison(
        against=against,
        ratio=est.value,
        lo=est.lo,
        hi=est.hi,
        confidence=est.confidence,
        pairs=est.n,
        halfWidth=est.half_width,
        clock=clock,
        baseline=figures_of(paired.baseline, paired.baseline_warmup, shape),
    )
    record.passes, record.halfWidth = est.n, est.half_width


class InProcessRunner:
    """A ``Runner`` (``polymorph.contract.runner``) in this process: no crash containment, no timeout. For trusted builds and tests."""

    def __init__(
        self,
        engine: Engine,
        workload: Workload,
        gates: Gates,
        golden: Golden,
        settings: BenchSettings = BenchSettings(),
    ) -> None:
        self.engine = engine
        self.workload = workload
        self.gates = gates
        self.golden = golden
        self.settings = settings
        self.slot = BaselineSlot(engine.model)
        self.verified: dict[str, Verification] = {}

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        return run_experiment(
            self.engine,
            build_dir,
            self.workload,
            self.gates,
            self.golden,
            description=description,
            settings=self.settings,
            against=against,
            slot=self.slot,
            screen=screen,
            verified=self.verified,
        )

    def close(self) -> None:
        """Release the baseline held for pairing and the engine's current build."""
        self.slot.close()
        self.engine.unload()
