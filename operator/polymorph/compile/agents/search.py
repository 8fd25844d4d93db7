"""The offline search agent: explores the knobs the base build declares, noise-aware.

Plan (pure functions below, the agent only walks it):
1. the baseline (the campaign runs it on every sandbox, because figures only compare
   within one engine);
2. sweep: every knob set to each of its non-default choices, one knob at a time;
3. greedy combination: starting from the baseline, apply the sweep's faster single-knob
   changes in order of their noise-discounted speedup (speedup / (1 + noise)), keeping a
   change when the combination measures faster than the current configuration;
4. local refinement: from the current configuration, try each knob's neighbouring choices
   (one step along its declared list), move to the first that beats it *beyond noise*
   (so refinement never chases noise), and repeat until a full pass finds nothing.

A configuration is a full assignment ``{knob: value}``; its key is its canonical JSON. Every
configuration the plan makes is completed with what its knobs ``require`` (build.toml: a knob
whose non-default values change nothing without another knob's value, such as
``decode_capture`` without ``kv_cache = "static"``), so interacting knobs are tried together
rather than each alone as a no-op.
The agent never runs a key twice. Sandbox ``i`` of ``n`` owns the configurations whose
key hashes (sha256) to ``i`` mod ``n``, and runs only those (plus the shared baseline),
so sandboxes explore disjoint shares. Combinations and refinements a sandbox does not own
are skipped by it. The result itself is chosen by the campaign's noise-aware rule, never
by the agent. "Beats beyond noise" is ``campaign.compare(...).significant`` with a
factor of 1: better even when both measurements sit at the unfavourable edge of their
spread. Budget and deadline are the campaign's: ``run_experiment`` raises when spent.

It knows nothing about the store, the ledger or how builds run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polymorph.api import ExperimentRecord
from polymorph.builds import knob_variant, read_build
from polymorph.compile.agents.base import CampaignContext
from polymorph.store import build_id

__all__ = ["SearchAgent", "config_key", "neighbours", "owner", "sweep", "with_requirements"]

Config = dict[str, Any]


def config_key(config: Config) -> str:
    """The canonical JSON of a configuration."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def owner(config: Config, sandboxes: int) -> int:
    """The sandbox that owns ``config``: a stable hash of its key, mod ``sandboxes``."""
    digest = hashlib.sha256(config_key(config).encode()).hexdigest()
    return int(digest[:12], 16) % sandboxes


Requires = Mapping[str, Mapping[str, Any]]


def with_requirements(config: Config, requires: Requires, defaults: Config) -> Config:
    """``config`` plus the values that its non-default knobs require, until nothing changes."""
    out = dict(config)
    for _ in range(len(out) + 1):
        extra = {
            other: value
            for name, needs in requires.items()
            if out.get(name) != defaults.get(name)
            for other, value in needs.items()
            if out.get(other) != value
        }
        if not extra:
            break
        out |= extra
    return out


def sweep(
    defaults: Config, choices: Mapping[str, Sequence[Any]], requires: Requires | None = None
) -> list[Config]:
    """Every configuration that differs from ``defaults`` in one knob (plus what it requires)."""
    out = []
    for name in sorted(choices):
        for value in choices[name]:
            if value != defaults[name]:
                out.append(with_requirements(defaults | {name: value}, requires or {}, defaults))
    return out


def neighbours(
    config: Config,
    choices: Mapping[str, Sequence[Any]],
    requires: Requires | None = None,
    defaults: Config | None = None,
) -> list[Config]:
    """Configurations one step away along one knob's declared list (plus what they require)."""
    out = []
    for name in sorted(choices):
        values = list(choices[name])
        if config[name] not in values:
            continue
        i = values.index(config[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                moved = config | {name: values[j]}
                out.append(with_requirements(moved, requires or {}, defaults or config))
    return out


class SearchAgent:
    """Baseline, one knob at a time, greedy combination, local refinement."""

    name = "search"

    def __init__(self) -> None:
        self.tried: dict[str, ExperimentRecord] = {}
        self._base_name = "base"
        self._base_id = ""
        self._defaults: Config = {}

    def run(self, ctx: CampaignContext) -> str:
        spec = read_build(ctx.base_dir)
        self._base_name, self._base_id = spec.name, build_id(ctx.base_dir)
        choices = {name: list(knob.choices) for name, knob in spec.knobs.items()}
        defaults: Config = {name: knob.default for name, knob in spec.knobs.items()}
        requires = {name: knob.requires for name, knob in spec.knobs.items() if knob.requires}
        if not choices:
            return "the base build declares no knobs, so there is nothing to search"
        self._defaults = defaults
        base_key = config_key(defaults)
        self.tried[base_key] = ctx.baseline

        # 2. Sweep one knob at a time; rank the changes that measured faster by their
        # noise-discounted speedup (speedup / (1 + noise)).
        singles: list[tuple[float, Config, ExperimentRecord]] = []
        for config in sweep(defaults, choices, requires):
            record = self._attempt(ctx, config, f"sweep: {_diff(defaults, config)}")
            cmp = ctx.compare(record) if record is not None else None
            if record is not None and cmp is not None and cmp.speedup > 1:
                singles.append((cmp.speedup / (1 + cmp.noise), config, record))
        singles.sort(key=lambda s: -s[0])

        # 3. Greedy combination of the winners: keep a change when the combination measures
        # faster than the current configuration (the noise-aware gate is the final selection's).
        current, current_rec = defaults, ctx.baseline
        for _, config, record in singles:
            changed = {k: v for k, v in config.items() if v != defaults[k]}
            candidate = current | changed
            if candidate == current:
                continue
            cand_rec = (
                record
                if candidate == config
                else self._attempt(ctx, candidate, f"combine: {_diff(defaults, candidate)}")
            )
            cmp = ctx.compare(cand_rec, current_rec) if cand_rec is not None else None
            if cand_rec is not None and cmp is not None and cmp.speedup > 1:
                current, current_rec = candidate, cand_rec

        # 4. Local refinement around the current configuration.
        improved = True
        while improved:
            improved = False
            for candidate in neighbours(current, choices, requires, defaults):
                cand_rec = self._attempt(ctx, candidate, f"refine: {_diff(defaults, candidate)}")
                if cand_rec is not None and self._improves(ctx, cand_rec, current_rec):
                    current, current_rec = candidate, cand_rec
                    improved = True
                    break
        cmp = ctx.compare(current_rec)
        found = f"{cmp.speedup:.2f}x" if cmp is not None else "no gain"
        return f"search space exhausted after {len(self.tried)} configurations; best {_diff(defaults, current) or 'baseline'} ({found})"

    def _improves(self, ctx: CampaignContext, candidate: ExperimentRecord, current: ExperimentRecord) -> bool:
        cmp = ctx.compare(candidate, current)
        return cmp is not None and cmp.significant

    def _attempt(self, ctx: CampaignContext, config: Config, description: str) -> ExperimentRecord | None:
        """Run ``config`` unless it ran already or another sandbox owns it."""
        key = config_key(config)
        if key in self.tried:
            return self.tried[key]
        if owner(config, ctx.sandboxes) != ctx.sandbox:
            return None
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        dest = Path(ctx.workdir) / f"search-{digest}"
        if not dest.exists():
            # Name, parent and description are functions of the configuration, so the same
            # configuration always makes the same build id (which is what resuming relies on).
            knob_variant(
                ctx.base_dir,
                config,
                dest,
                name=f"{self._base_name}-{digest[:8]}",
                parent=self._base_id,
                description=f"{self._base_name} with {_diff(self._defaults, config) or 'its defaults'}",
            )
        build_dir = dest
        record = ctx.run_experiment(build_dir, description=description)
        self.tried[key] = record
        return record


def _diff(defaults: Config, config: Config) -> str:
    return ", ".join(f"{k}={config[k]}" for k in sorted(config) if config[k] != defaults.get(k))
