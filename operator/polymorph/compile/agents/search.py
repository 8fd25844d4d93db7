"""The offline search agent: explores the knobs the base build declares, by paired comparisons.

Plan (pure functions below, the agent only walks it):
1. the baseline (the campaign runs it on every sandbox, because figures only compare
   within one engine);
2. sweep: every knob set to each of its non-default choices, one knob at a time, each
   benchmarked paired with the sweep's *anchor*: the baseline at first, then the first change
   that beats the anchor by the paired rule (the interval of change / anchor lies above 1),
   and so on. A change's *gain* is its speedup over the baseline through the chain of anchors
   (change / anchor x anchor / baseline ...). Pairing with a fast anchor instead of a slow
   baseline is what keeps experiments short: half of every paired experiment's passes are the
   anchor's, and the reference build is often several times slower than the first capture or
   fusion knob. The ranking only needs a common comparator, and every kept step is still a
   direct paired verdict (the final configuration is measured against the baseline itself);
3. greedy combination: from the last anchor (the baseline when none beat it), add the sweep's
   changes that measured a gain > 1, one at a time in order of gain (a change only of knobs
   the current configuration already sets, such as another value of the same knob, is left to
   refinement). Each combination is benchmarked paired with the *current best* configuration
   in one engine, and kept only when it still helps by the paired rule (the interval of
   combination / current lies above 1: ``campaign.compare(...).significant``); so knobs
   accumulate, and a knob whose gain another already delivered is dropped;
4. local refinement: from the current configuration, try each knob's neighbouring choices
   (one step along its declared list), each paired with the current best; move to the first
   that helps by the same rule, and repeat until a full pass finds nothing;
5. the final configuration, when its last measurement was against an intermediate best, is
   benchmarked paired with the baseline, so that the campaign's selection (which judges every
   candidate by its paired ratio to the baseline against ``minSpeedup``) can see it. One
   experiment of the budget is kept for this.

A configuration is a full assignment ``{knob: value}``; its key is its canonical JSON. Every
configuration the plan makes is completed with what its knobs ``require`` (build.toml: a knob
whose non-default values change nothing without another knob's value, such as
``decode_capture`` without ``kv_cache = "static"``), so interacting knobs are tried together
rather than each alone as a no-op.
The agent never runs the same (configuration, paired-against) twice. Sandbox ``i`` of ``n``
owns the configurations whose key hashes (sha256) to ``i`` mod ``n``, and runs only those
(plus the shared baseline), so sandboxes explore disjoint shares. Combinations and refinements
a sandbox does not own are skipped by it. The result itself is chosen by the campaign's paired
rule, never by the agent. Budget and deadline are the campaign's: ``run_experiment`` raises
when spent.

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
    """Baseline, one knob at a time, greedy paired combination, local paired refinement."""

    name = "search"

    def __init__(self) -> None:
        self.tried: dict[tuple[str, str], ExperimentRecord] = {}
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
        base = ctx.baseline
        self.tried[(config_key(defaults), "")] = base

        # 2. Sweep one knob at a time, each paired with the anchor; rank by gain over the baseline.
        singles: list[tuple[float, Config, ExperimentRecord]] = []
        anchor, anchor_rec, anchor_gain = defaults, base, 1.0
        for config in sweep(defaults, choices, requires):
            if not self._against_base(anchor_rec) and not self._room(ctx, anchor_rec, base):
                break  # keep the last experiment for the final paired measurement
            against = None if anchor_rec is base else anchor_rec
            vs = f" vs {_diff(defaults, anchor)}" if against is not None else ""
            record = self._attempt(ctx, config, f"sweep: {_diff(defaults, config)}{vs}", against)
            cmp = ctx.compare(record, anchor_rec) if record is not None else None
            if record is None or cmp is None:
                continue
            gain = cmp.speedup * anchor_gain
            if gain > 1:
                singles.append((gain, config, record))
            if cmp.significant and cmp.speedup > 1:
                anchor, anchor_rec, anchor_gain = config, record, gain
        singles.sort(key=lambda s: -s[0])

        # 3. Greedy combination: add each gain to the current best; keep it if it still helps, paired.
        current, current_rec = anchor, anchor_rec
        for _, config, record in singles:
            if config == anchor:
                continue
            if not self._room(ctx, current_rec, base):
                break  # keep the last experiment for the final paired measurement
            changed = {k: v for k, v in config.items() if v != defaults[k]}
            if changed.keys() <= {k for k, v in current.items() if v != defaults[k]}:
                continue  # another value of knobs already set: refinement's job, not a new gain
            candidate = with_requirements(current | changed, requires, defaults)
            if candidate == current:
                continue
            if current_rec is base and candidate == config:
                cand_rec: ExperimentRecord | None = record  # already paired with the baseline
            else:
                desc = f"combine: {_diff(defaults, candidate)} vs {_diff(defaults, current) or 'baseline'}"
                cand_rec = self._attempt(ctx, candidate, desc, current_rec)
            if cand_rec is not None and self._helps(ctx, cand_rec, current_rec):
                current, current_rec = candidate, cand_rec

        # 4. Local refinement around the current configuration, paired with it.
        improved = True
        while improved:
            improved = False
            for candidate in neighbours(current, choices, requires, defaults):
                if candidate == current:
                    continue  # a move that its requirements undo
                if not self._room(ctx, current_rec, base):
                    break
                desc = f"refine: {_diff(defaults, candidate) or 'baseline'} vs {_diff(defaults, current) or 'baseline'}"
                cand_rec = self._attempt(ctx, candidate, desc, None if current_rec is base else current_rec)
                if cand_rec is not None and self._helps(ctx, cand_rec, current_rec):
                    current, current_rec = candidate, cand_rec
                    improved = True
                    break

        # 5. The final configuration, paired with the baseline (what the selection judges).
        final = current_rec
        if current_rec is not base and not self._against_base(current_rec):
            measured = self._attempt(ctx, current, f"final: {_diff(defaults, current)} vs baseline", None)
            final = measured if measured is not None else current_rec
        cmp = ctx.compare(final)
        found = f"{cmp.speedup:.2f}x ±{cmp.noise * 100:.1f}%" if cmp is not None else "no gain"
        return (
            f"search finished after {len(self.tried)} experiments; best "
            f"{_diff(defaults, current) or 'baseline'} ({found} paired with the baseline)"
        )

    @staticmethod
    def _room(ctx: CampaignContext, current: ExperimentRecord, base: ExperimentRecord) -> bool:
        """Whether an experiment paired with ``current`` may start: one that is not the baseline
        leaves room for the final measurement against the baseline should the candidate be kept."""
        return current is base or ctx.experiments_left() >= 2

    def _against_base(self, record: ExperimentRecord) -> bool:
        return record.comparison is not None and record.comparison.against == self._base_id

    def _helps(self, ctx: CampaignContext, candidate: ExperimentRecord, current: ExperimentRecord) -> bool:
        """The paired rule at a factor of 1: the interval of candidate / current lies above 1."""
        cmp = ctx.compare(candidate, current)
        return cmp is not None and cmp.significant

    def _attempt(
        self, ctx: CampaignContext, config: Config, description: str, against: ExperimentRecord | None
    ) -> ExperimentRecord | None:
        """Run ``config`` paired with ``against`` (None: the baseline) unless that ran already or
        another sandbox owns the configuration."""
        if against is not None and against.build == self._base_id:
            against = None  # the campaign's default pairing
        key = (config_key(config), "" if against is None else against.build)
        if key in self.tried:
            return self.tried[key]
        if owner(config, ctx.sandboxes) != ctx.sandbox:
            return None
        digest = hashlib.sha256(key[0].encode()).hexdigest()[:16]
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
        record = ctx.run_experiment(dest, description=description, against=against)
        self.tried[key] = record
        return record


def _diff(defaults: Config, config: Config) -> str:
    return ", ".join(f"{k}={config[k]}" for k in sorted(config) if config[k] != defaults.get(k))
