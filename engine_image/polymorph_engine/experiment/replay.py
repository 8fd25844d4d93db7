"""A deterministic replay of recorded GPU sweeps: a ``Runner`` that measures from recordings, on a simulated clock.

GPU time is scarce, and a search is only as good as its behaviour under the real noise, the
real per-experiment costs and the real timeouts of the device it runs on. ``ReplayRunner``
answers experiments from a ``RecordedSpace``: for each configuration, the per-pass tok/s that
a real run measured (as a candidate, and as the baseline others were paired with), its load
and verify seconds, and whether it timed out. A pass draws one recorded value (seeded) and
advances a ``SimClock`` by the time that pass took (``tokens_per_pass / tok/s``); the
measurement itself is the engine's own protocol (``measure.measure_paired`` and
``measure_one``, with its warm-up, adaptive pairs and early stop for losers) on that clock. The
campaign runs on the same clock, so its deadline, the judgement's reserve and experiments per
hour are those the device would have given, in milliseconds of CPU.

It mirrors the engine where that matters for a search: verification runs once per build (a
re-measured build is not verified again), a baseline held by the previous experiment is warm,
and a configuration whose preparation ran past the experiment timeout times out after exactly
that long and keeps what it prepared (a persistent compile cache), so its retry is warm.

``RecordedSpace.from_search_quality`` reads ``bench/search_quality.py``'s JSON (the sweep's
points with ``repeats`` and ``baselineRepeats``, the baseline, the anchor, the campaign's
records). ``RecordedSpace.base_build`` writes a build declaring just the recorded knobs, so a
search explores exactly the recorded space. ``truth`` is each configuration's mean recorded
tok/s: what "within 3% of the best" is judged by.

It knows nothing about agents or the campaign: it answers ``Runner.run``.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polymorph.contract.api import ExperimentRecord
from polymorph.contract.api.build import Timings, Verification
from polymorph.contract.builds import REFERENCE_BUILD, read_build
from polymorph.contract.store import build_id
from polymorph_engine.experiment.bench import PassResult, figures_of
from polymorph_engine.experiment.measure import (
    GPU_TARGET,
    GPU_TIME_CAP,
    MeasurePolicy,
    measure_one,
    measure_paired,
)
from polymorph_engine.experiment.run import record_paired

__all__ = ["RecordedConfig", "RecordedSpace", "ReplayRunner", "SimClock", "config_key"]

PASSED = Verification(tokenAgreement=1.0, logitError=0.0, finite=True, passed=True)


def config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


class SimClock:
    """Simulated seconds: ``clock()`` reads them, ``advance(s)`` spends them."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


@dataclass
class RecordedConfig:
    """What a real run measured of one configuration."""

    config: dict[str, Any]
    passes: list[float] = field(default_factory=list)
    """Every measured pass's tok/s, as a candidate and as a baseline of others."""
    load_s: float = 0.0
    verify_s: float = 0.0
    prepare_s: float = 0.0
    """Seconds its preparation takes cold (torch.compile, graph captures); past the experiment
    timeout it times out, and the retry resumes from what the first try prepared."""

    @property
    def truth(self) -> float:
        return statistics.fmean(self.passes)


@dataclass
class RecordedSpace:
    """Recorded configurations over the knobs a sweep varied (the others held at ``fixed``)."""

    knobs: dict[str, list[Any]]
    defaults: dict[str, Any]
    configs: dict[str, RecordedConfig]
    tokens_per_pass: float
    timeout_values: dict[str, set[Any]] = field(default_factory=dict)
    """Knob values every recorded experiment of which timed out preparing."""
    timeout_prepare_s: float = 60.0
    requires: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What each knob's non-default values require (as in the recorded build's build.toml)."""
    slow_prepare: dict[str, list[Any]] = field(default_factory=dict)
    """Each knob's values that its build.toml declares slow to prepare (torch.compile)."""

    def lookup(self, config: Mapping[str, Any]) -> RecordedConfig | None:
        found = self.configs.get(config_key({k: config[k] for k in self.knobs if k in config}))
        if found is not None:
            return found
        if any(config.get(k) in values for k, values in self.timeout_values.items()):
            return RecordedConfig(dict(config), prepare_s=math.inf)
        return None

    def truth(self, config: Mapping[str, Any]) -> float:
        found = self.lookup(config)
        return found.truth if found is not None and found.passes else 0.0

    def best_truth(self) -> float:
        return max(c.truth for c in self.configs.values() if c.passes)

    def base_build(self, dest: Path) -> Path:
        """A build declaring just the recorded knobs (choices and defaults), to search over."""
        dest.mkdir(parents=True, exist_ok=True)
        lines = [
            "[build]",
            'name = "replay"',
            'parent = ""',
            'entry = "hotpath.py"',
            'description = "The knob space of a recorded sweep (the replay answers its experiments)."',
        ]
        for name, choices in self.knobs.items():
            lines += [
                "",
                f"[knobs.{name}]",
                f"choices = {_toml(choices)}",
                f"default = {_toml(self.defaults[name])}",
            ]
            if self.requires.get(name):
                needs = ", ".join(f"{k} = {_toml(v)}" for k, v in self.requires[name].items())
                lines.append(f"requires = {{ {needs} }}")
            slow = [v for v in self.slow_prepare.get(name, ()) if v in choices]
            if slow:
                lines.append(f"slow_prepare = {_toml(slow)}")
        (dest / "build.toml").write_text("\n".join(lines) + "\n")
        (dest / "hotpath.py").write_text(
            '"""Never imported: the replay measures this build from recordings."""\n'
        )
        return dest

    @classmethod
    def from_search_quality(cls, path: Path, build: Path = REFERENCE_BUILD) -> RecordedSpace:
        """The space of a ``bench/search_quality.py`` result: its sweep points, baseline, anchor and
        campaign records, restricted to the knobs the sweep varied (with what they require in
        ``build``, the build the sweep ran)."""
        doc = json.loads(Path(path).read_text())
        sweep = doc["exhaustive"]
        points: list[dict[str, Any]] = list(sweep["points"])
        baseline: dict[str, Any] = doc["baseline"]
        anchor: dict[str, Any] | None = sweep.get("anchor")
        records: list[dict[str, Any]] = list((doc.get("campaign") or {}).get("records") or [])
        everything = [baseline, *([anchor] if anchor else []), *points]
        varied = sorted(
            k for k in baseline["config"] if len({json.dumps(p["config"][k]) for p in everything}) > 1
        )
        defaults = {k: baseline["config"][k] for k in varied}
        fixed = {k: v for k, v in baseline["config"].items() if k not in varied}
        by_build = {p["build"]: p for p in everything}
        configs: dict[str, RecordedConfig] = {}

        def entry(point: dict[str, Any]) -> RecordedConfig:
            config = {k: point["config"][k] for k in varied}
            key = config_key(config)
            if key not in configs:
                seconds = point.get("seconds") or {}
                configs[key] = RecordedConfig(
                    config, load_s=float(seconds.get("load", 0.0)), verify_s=float(seconds.get("verify", 0.0))
                )
            return configs[key]

        for point in everything:
            if point.get("status") != "passed":
                continue
            entry(point).passes.extend(float(x) for x in point.get("repeats") or [])
            against = by_build.get(point.get("against") or "")
            if against is not None:
                entry(against).passes.extend(float(x) for x in point.get("baselineRepeats") or [])
        timeout_values: dict[str, set[Any]] = {}
        seen_ok: set[tuple[str, str]] = {(k, str(v)) for c in configs.values() for k, v in c.config.items()}
        choices: dict[str, list[Any]] = {k: [] for k in varied}
        for c in configs.values():
            for k, v in c.config.items():
                if v not in choices[k]:
                    choices[k].append(v)
        for r in records:
            config = r.get("config") or {}
            if r.get("status") != "timeout" or any(
                config.get(k) != v for k, v in fixed.items() if k in config
            ):
                continue
            for k in varied:
                if (k, str(config.get(k))) not in seen_ok and k in config:
                    timeout_values.setdefault(k, set()).add(config[k])
                    if config[k] not in choices[k]:
                        choices[k].append(config[k])
        for k in varied:  # the defaults first, as in a build.toml
            choices[k].sort(key=lambda v: (v != defaults[k], str(v)))
        base_seconds = baseline["seconds"]
        measured = int(baseline.get("passes") or len(baseline.get("repeats") or [])) + int(
            baseline.get("warmup") or 0
        )
        tokens = float(base_seconds["bench"]) * float(baseline["tokS"]) / max(1, measured)
        timeouts = [
            float((r.get("seconds") or {}).get("total", 60.0))
            for r in records
            if r.get("status") == "timeout"
        ]
        spec = read_build(build)
        requires = {
            k: dict(spec.knobs[k].requires)
            for k in varied
            if k in spec.knobs and spec.knobs[k].requires and set(spec.knobs[k].requires) <= set(varied)
        }
        slow = {
            k: list(spec.knobs[k].slow_prepare)
            for k in varied
            if k in spec.knobs and spec.knobs[k].slow_prepare
        }
        return cls(
            requires=requires,
            slow_prepare=slow,
            knobs=choices,
            defaults=defaults,
            configs=configs,
            tokens_per_pass=tokens,
            timeout_values=timeout_values,
            timeout_prepare_s=max(timeouts) if timeouts else 60.0,
        )


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


class ReplayRunner:
    """A ``Runner`` answering from a ``RecordedSpace`` on a ``SimClock`` (see the module docstring)."""

    def __init__(
        self,
        space: RecordedSpace,
        clock: SimClock,
        *,
        seed: int = 0,
        policy: MeasurePolicy | None = None,
        experiment_timeout: float = 60.0,
        overhead_s: float = 0.05,
    ) -> None:
        self.space = space
        self.clock = clock
        self.rng = random.Random(seed)
        self.policy = policy or MeasurePolicy(target_half_width=GPU_TARGET, time_cap_s=GPU_TIME_CAP)
        self.experiment_timeout = experiment_timeout
        self.overhead_s = overhead_s
        self.verified: set[str] = set()
        self.prepared: dict[str, float] = {}
        self.warm_against: str | None = None
        self.ran: list[tuple[dict[str, Any], dict[str, Any] | None, bool]] = []
        """(configuration, paired-against configuration, screen) of every experiment, in order."""

    def _config(self, build_dir: Path) -> dict[str, Any]:
        return {name: knob.default for name, knob in read_build(build_dir).knobs.items()}

    def _pass(self, found: RecordedConfig) -> PassResult:
        tok_s = self.rng.choice(found.passes)
        seconds = self.space.tokens_per_pass / tok_s
        self.clock.advance(seconds)
        tokens = max(1, round(self.space.tokens_per_pass))
        return PassResult(
            duration_s=seconds,
            input_tokens=0,
            output_tokens=tokens,
            ttft_s=[seconds / tokens],
            itl_s=[seconds / tokens] * max(1, tokens - 1),
            wall_s=seconds,
        )

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        started = self.clock()
        config = self._config(Path(build_dir))
        base_config = self._config(Path(against)) if against is not None else None
        self.ran.append((config, base_config, screen))
        record = ExperimentRecord(
            build=build_id(Path(build_dir)),
            status="failed",
            description=description,
            knobs=config,
            screen=screen,
        )
        found = self.space.lookup(config)
        base = self.space.lookup(base_config) if base_config is not None else None
        timings = Timings()
        if found is None or (base_config is not None and (base is None or not base.passes)):
            record.error = "the recording holds no measurement of this configuration"
        else:
            key = config_key(config)
            left = found.prepare_s - self.prepared.get(key, 0.0)
            if left > self.experiment_timeout or math.isinf(left):
                self.prepared[key] = self.prepared.get(key, 0.0) + self.experiment_timeout
                self.clock.advance(self.experiment_timeout)
                self.warm_against = None  # the worker was killed: nothing stays loaded
                record.status = "timeout"
                record.error = f"the experiment ran past the {self.experiment_timeout:g} s timeout; the worker was killed"
                record.timings = Timings(totalS=self.clock() - started)
                return record
            self.prepared[key] = found.prepare_s
            self.clock.advance(found.load_s + max(0.0, left))
            timings.loadS, timings.prepareS = found.load_s, max(0.0, left)
            if record.build not in self.verified:
                self.clock.advance(found.verify_s)
                timings.verifyS = found.verify_s
                self.verified.add(record.build)
            record.verification = PASSED
            policy = self.policy.screening() if screen else self.policy
            t = self.clock()
            if base is None:
                one = measure_one(lambda: self._pass(found), policy, clock=self.clock)
                record.figures = figures_of(one.passes, one.warmup)
                record.passes, record.halfWidth = len(one.passes), one.estimate.half_width
            else:
                against_id = build_id(Path(against)) if against is not None else ""
                warm = self.warm_against == against_id
                paired = measure_paired(
                    lambda: self._pass(found),
                    lambda: self._pass(base),
                    policy,
                    clock=self.clock,
                    baseline_warm=warm,
                )
                self.warm_against = against_id
                record_paired(record, against_id, paired, "wall")
            timings.benchS = self.clock() - t
            record.status = "passed"
        self.clock.advance(self.overhead_s)
        timings.totalS = self.clock() - started
        record.timings = timings
        return record
