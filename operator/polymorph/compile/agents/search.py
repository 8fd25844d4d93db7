"""The offline search agent: model-guided screening of the knob space, by short paired experiments.

The space is every combination of the knobs the base build declares, less those whose
non-default values lack what they ``require`` (build.toml: a knob whose values change nothing
without another knob's value, such as ``decode_capture`` without ``kv_cache = "static"``),
which would only duplicate another configuration, and less every value but the default of the
knobs the baseline's record names inert for the model (``inertKnobs``: the MoE knobs on a
dense model). Thirteen knobs make thousands of combinations, and knobs interact (a fused
step's ``prefill`` pays only on the fused step), so neither trying them all nor moving one knob
at a time finds the best under a deadline.

Plan (the agent only screens; the campaign's judgement settles the result):
1. **Screen** by Thompson sampling over a model of the knob effects: log throughput is
   additive in each non-default knob value plus each pair of them (the interactions), with a
   Gaussian prior, fitted by Bayesian linear regression to every paired measurement (a paired
   record observes ``f(build) - f(against)``, so comparisons with any comparator inform one
   model). Each step draws one model from the posterior and measures the configuration it
   ranks best among those not yet measured; an uncertain region is tried exactly as often as
   it may hold the best. Every ``EXPLOIT_EVERY``-th pick takes the posterior mean's best
   instead: what the model believes best gets measured, so small effects
   learnt from many screens reach the leader. The first draws come from the prior alone, so the search starts
   from configurations spread over the whole space rather than from one-knob changes of the
   defaults (a default step is usually the slowest, and a change that pays only with
   another, such as ``prefill`` on the fused step, shows nothing there). Measurements are
   **screening** experiments (``screen=True``: a few ABBA pairs, a wider target interval).
2. **Comparator.** Every screening experiment is paired with the current *comparator*: the
   baseline at first, then the fastest build measured when the whole evidence (the campaign's
   ``ranking``) puts it at least ``SWITCH_GAIN`` above the comparator. Half of a paired
   experiment's passes are the comparator's, and the reference build is often many times
   slower than a fused one, so a fast comparator makes screening several times cheaper. The
   ranking composes the comparators' links with their uncertainty: nothing is ranked by a
   chain of point ratios.
3. **Stop** when fewer than ``STOP_PROBABILITY`` of the posterior's draws put any unmeasured
   configuration ``MIN_GAIN`` above the leader, or the agent's budget ends (the campaign keeps
   a reserve of experiments and seconds for its judgement: races of the contenders by the
   full protocol, and the leader paired with the baseline).
4. On an accelerator, a configuration holding a value its knob declares ``slow_prepare`` (a
   torch.compile: tens of seconds to prepare the first time there) is screened only while the agent's
   seconds left hold ``SLOW_PREPARE_SHARE`` experiment timeouts. Under a short deadline (five
   minutes and a 30 s timeout, ``polymorph compile --device cuda``'s defaults) the search screens
   only the builds that prepare in a second or two; a campaign of 15 minutes screens the slow
   ones in its first ten.
5. A screening experiment that **timed out** (a torch.compile candidate still preparing: "not
   ready yet", not "slow") is tried once more after the rest, when the persistent compile
   cache has its artifacts. Until then, a configuration is deferred when it holds every value
   of a timed-out one that no passed configuration held, or, when each of those values passed
   in some configuration (the combination is what timed out), all of them: the timeout says
   nothing about speed, and each such try would cost a whole timeout again. Default values
   count as values here, and the base build is not a passed configuration (it runs under the
   baseline's longer timeout): on an MoE model every candidate keeping ``moe_experts = loop``
   runs its prompts through the reference's host loop and times out, which only the default
   value they share tells (qwen3-30b-a3b on an H100: two such timeouts cost a 5-minute
   campaign 60 s).

The model only proposes; every decision about the result is the campaign's paired rule. The
agent never runs the same (configuration, paired-against) twice. Sandbox ``i`` of ``n`` owns
the configurations whose key hashes (sha256) to ``i`` mod ``n`` and screens only those, so
sandboxes explore disjoint shares. Draws come from a generator seeded by the sandbox, so a
resumed campaign replays its path from the ledger for free.

It knows nothing about the store, the ledger or how builds run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polymorph.compile.campaign import Campaign
from polymorph.compile.ranking import Ranking, log_se
from polymorph.compile.selection import EdgeMemo, rank
from polymorph.contract.api import ExperimentRecord
from polymorph.contract.api.common import parse_duration
from polymorph.contract.builds import knob_variant, read_build
from polymorph.contract.store import build_id

__all__ = [
    "KnobModel",
    "SearchAgent",
    "config_key",
    "consistent",
    "neighbours",
    "owner",
    "space",
    "sweep",
    "with_requirements",
]

Config = dict[str, Any]
Requires = Mapping[str, Mapping[str, Any]]

MAX_SPACE = 50_000
"""Configurations enumerated at most; a larger space is sampled (seeded) to this many."""
SWITCH_GAIN = 1.25
"""The comparator moves to a build the ranking puts at least this much above it (its lower bound)."""
MIN_GAIN = 0.01
"""Screening ends when no unmeasured configuration is likely to beat the leader by this much."""
STOP_PROBABILITY = 0.05
"""... where "likely" is this share of the posterior's draws."""
STOP_DRAWS = 64
EXPLOIT_EVERY = 3
"""Every this many picks, the configuration the posterior mean ranks best (not a draw). A
function of the picks alone, so a resumed campaign replays its path from the ledger."""
PRIOR_MAIN = 0.7
"""Prior standard deviation of one knob value's effect on log throughput (about ×2)."""
PRIOR_PAIR = 0.35
"""Prior standard deviation of one pair's interaction on log throughput."""
MISFIT = 0.03
"""Added in quadrature to each measurement's standard error: what two-knob effects cannot explain."""
SLOW_PREPARE_SHARE = 10
"""A configuration holding a value its knob declares ``slow_prepare`` (a torch.compile) is screened
only while the agent's seconds left hold this many experiment timeouts. A cold compilation runs
into the timeout and is tried again warm: on llama-8b (H100, the chat profile, a 30 s timeout)
the two took 44 s, the time of 14 typical screens, so such a try costs at most about a sixth of
what is left. At four timeouts, a 5-minute campaign spent 16% of its time on one."""


def config_key(config: Config) -> str:
    """The canonical JSON of a configuration."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def owner(config: Config, sandboxes: int) -> int:
    """The sandbox that owns ``config``: a stable hash of its key, mod ``sandboxes``."""
    digest = hashlib.sha256(config_key(config).encode()).hexdigest()
    return int(digest[:12], 16) % sandboxes


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


def consistent(config: Config, requires: Requires, defaults: Config) -> bool:
    """Whether every non-default knob of ``config`` has what it requires (checked directly: two
    knobs that require different values of a third can never both hold, and completing such a
    configuration would only alternate between them)."""
    return all(
        config.get(other) == value
        for name, needs in requires.items()
        if config.get(name) != defaults.get(name)
        for other, value in needs.items()
    )


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


def space(
    defaults: Config,
    choices: Mapping[str, Sequence[Any]],
    requires: Requires | None = None,
    *,
    limit: int = MAX_SPACE,
    seed: int = 0,
) -> list[Config]:
    """The distinct consistent configurations (``consistent``), the defaults first; at most
    ``limit``, sampled with ``seed`` when there are more combinations than that."""
    names = sorted(choices)
    requires = requires or {}
    total = math.prod(len(choices[n]) for n in names)
    if total <= limit:
        combos: Any = itertools.product(*(choices[n] for n in names))
    else:
        rng = random.Random(seed)
        combos = (tuple(rng.choice(list(choices[n])) for n in names) for _ in range(limit))
    seen: dict[str, Config] = {config_key(defaults): dict(defaults)}
    for one in sweep(defaults, choices, requires):
        seen.setdefault(config_key(one), one)
    for values in combos:
        config = dict(zip(names, values, strict=True))
        if consistent(config, requires, defaults):
            seen.setdefault(config_key(config), config)
    return list(seen.values())


class KnobModel:
    """Bayesian linear regression of log throughput on knob values and their pairs.

    Features of a configuration: one per non-default knob value, one per pair of non-default
    values of two knobs. A paired measurement observes ``phi(build) - phi(against)`` times the
    weights, with its standard error (plus ``MISFIT``). ``draw`` samples weights from the
    posterior; ``predict`` scores configurations under some weights.
    """

    def __init__(self, defaults: Config, choices: Mapping[str, Sequence[Any]]) -> None:
        self.defaults = defaults
        self.mains = [(k, v) for k in sorted(choices) for v in choices[k] if v != defaults[k]]
        index = {m: i for i, m in enumerate(self.mains)}
        self.index = index
        self.pairs = [(index[a], index[b]) for a, b in itertools.combinations(self.mains, 2) if a[0] != b[0]]
        self.pair_index = {p: len(self.mains) + i for i, p in enumerate(self.pairs)}
        self.size = len(self.mains) + len(self.pairs)
        prior = np.array([PRIOR_MAIN] * len(self.mains) + [PRIOR_PAIR] * len(self.pairs))
        self.prior_precision = np.diag(1.0 / prior**2)
        self.mean = np.zeros(self.size)
        self.cov = np.diag(prior**2)

    def features(self, config: Config) -> np.ndarray:
        on = sorted(self.index[(k, v)] for k, v in config.items() if (k, v) in self.index)
        x = np.zeros(self.size)
        x[on] = 1.0
        for a, b in itertools.combinations(on, 2):
            j = self.pair_index.get((a, b))
            if j is not None:
                x[j] = 1.0
        return x

    def matrix(self, configs: Sequence[Config]) -> np.ndarray:
        return np.stack([self.features(c) for c in configs]) if configs else np.zeros((0, self.size))

    def fit(self, rows: Sequence[tuple[Config, Config, float, float]]) -> None:
        """Posterior from ``(config, against, log ratio, se)`` observations."""
        precision = self.prior_precision.copy()
        rhs = np.zeros(self.size)
        for config, against, y, se in rows:
            x = self.features(config) - self.features(against)
            w = 1.0 / (se * se + MISFIT * MISFIT)
            precision += w * np.outer(x, x)
            rhs += w * y * x
        self.cov = np.linalg.inv(precision)
        self.cov = (self.cov + self.cov.T) / 2
        self.mean = self.cov @ rhs

    def draw(self, rng: np.random.Generator, n: int = 1) -> np.ndarray:
        """``n`` weight vectors from the posterior (rows)."""
        return rng.multivariate_normal(self.mean, self.cov, size=n, method="cholesky")


class SearchAgent:
    """Model-guided screening of the knob space; the campaign's judgement settles the result."""

    name = "search"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.tried: dict[tuple[str, str], ExperimentRecord] = {}
        self._base_name = "base"
        self._base_id = ""
        self._defaults: Config = {}
        self._configs: dict[str, Config] = {}  # build id -> configuration
        self._edges: EdgeMemo = {}

    def run(self, campaign: Campaign) -> str:
        spec = read_build(campaign.settings.base_dir)
        self._base_name, self._base_id = spec.name, build_id(campaign.settings.base_dir)
        base = campaign.standings.measured_baseline()
        inert = set(base.inertKnobs)  # knobs the build says change nothing for this model
        choices = {
            name: [knob.default] if name in inert else list(knob.choices_on(campaign.settings.hardware))
            for name, knob in spec.knobs.items()
        }
        for name, knob in spec.knobs.items():  # a value that needs one this device leaves out is out too
            if any(not any(v == c for c in choices[other]) for other, v in knob.requires.items()):
                choices[name] = [knob.default]
        defaults: Config = {name: knob.default for name, knob in spec.knobs.items()}
        requires = {name: knob.requires for name, knob in spec.knobs.items() if knob.requires}
        if not choices:
            return "the base build declares no knobs, so there is nothing to search"
        self._defaults = defaults
        self._configs[self._base_id] = defaults
        rng = np.random.default_rng([self.seed, campaign.settings.sandbox])
        everything = space(defaults, choices, requires, seed=self.seed)
        mine = [
            c
            for c in everything[1:]
            if owner(c, campaign.settings.budget.sandboxes) == campaign.settings.sandbox
        ]
        model = KnobModel(defaults, choices)
        comparator = base
        screened: set[str] = set()
        retry: list[Config] = []

        timed_out: list[frozenset[tuple[str, str]]] = []  # the values of each configuration that timed out
        passed: set[tuple[str, str]] = set()  # values seen in a screened configuration that passed
        slow = {
            (name, json.dumps(v))
            for name, knob in spec.knobs.items()
            for v in knob.slow_on(campaign.settings.hardware)
        }
        slow_after = SLOW_PREPARE_SHARE * parse_duration(campaign.settings.budget.experimentTimeout)

        def values(config: Config) -> frozenset[tuple[str, str]]:
            """Every (knob, value) of ``config``, defaults included."""
            return frozenset((k, json.dumps(v)) for k, v in config.items())

        def deferred(i: int) -> bool:
            """``mine[i]`` holds every value of a timed-out configuration that no passed one held
            (or, when each of them passed somewhere, so that the combination is what timed out,
            every value of it)."""
            return bool(timed_out) and any(((t - passed) or t) <= held[i] for t in timed_out)

        def screen(config: Config, why: str) -> None:
            nonlocal comparator
            key = config_key(config)
            screened.add(key)
            record = self._attempt(campaign, config, why, comparator)
            if record is not None and record.status == "timeout":
                retry.append(config)
                timed_out.append(values(config))
            elif record is not None and campaign.standings.eligible(record):
                passed.update(values(config))
            comparator = self._comparator(campaign, comparator)

        # 1.-4. Thompson sampling over the knob model until no configuration is likely to gain.
        features = model.matrix(mine)
        keys = [config_key(c) for c in mine]
        held = [values(c) for c in mine]
        picks = 0
        while True:
            cheap_only = campaign.budget.seconds_left() < slow_after
            open_ = [
                i
                for i, k in enumerate(keys)
                if k not in screened and not deferred(i) and not (cheap_only and held[i] & slow)
            ]
            if not open_:
                break
            model.fit(self._observations(campaign))
            candidates = features[open_]
            leader = model.features(self._leader_config(campaign))
            gains = (candidates - leader) @ model.draw(rng, STOP_DRAWS).T
            if float(np.mean(gains.max(axis=0) > math.log1p(MIN_GAIN))) < STOP_PROBABILITY:
                break
            picks += 1
            # Mostly a posterior draw (explore where the best may be); every EXPLOIT_EVERY-th pick,
            # the posterior mean's best (measure what the model believes best).
            exploit = picks % EXPLOIT_EVERY == 0
            weights = model.mean if exploit else model.draw(rng, 1)[0]
            pick = mine[open_[int(np.argmax(candidates @ weights))]]
            screen(pick, f"{'exploit' if exploit else 'screen'}: {_diff(defaults, pick)}")

        # 5. What timed out preparing gets one more try, warm.
        for config in retry:
            spent = max(r.timings.totalS for r in self.tried.values() if r.status == "timeout")
            if campaign.budget.seconds_left() < spent:
                break  # no time for another try that long
            why = f"retry (it timed out preparing): {_diff(defaults, config)}"
            record = self._attempt(campaign, config, why, comparator)
            if record is not None and campaign.standings.eligible(record):
                passed.update(values(config))

        lead = self._leader_config(campaign)
        return f"screening ended; the leader is {_diff(defaults, lead) or 'the baseline'}"

    # --- helpers ------------------------------------------------------------------------------

    def _observations(self, campaign: Campaign) -> list[tuple[Config, Config, float, float]]:
        """Every paired, eligible record between two configurations the agent knows."""
        rows = []
        for record in self.tried.values():
            cmp = record.comparison
            if cmp is None or not campaign.standings.eligible(record):
                continue
            config, against = self._configs.get(record.build), self._configs.get(cmp.against)
            if config is None or against is None or not (cmp.lo > 0 and math.isfinite(cmp.hi)):
                continue
            se = max(log_se(cmp.lo, cmp.hi), 1e-4)
            y = math.log(cmp.ratio) if campaign.settings.objective.maximize else -math.log(cmp.ratio)
            rows.append((config, against, y, se))
        return rows

    def _ranking(self, campaign: Campaign) -> Ranking:
        """The agent's own records so far, ranked by all their pairings (``selection.rank``, each
        record's edge computed once).

        Not the campaign's ledger: on resume the ledger already holds what comes later, and a
        comparator or leader chosen from it would change the path the agent replays."""
        base = campaign.standings.measured_baseline()
        return rank((base, *self.tried.values()), self._base_id, campaign.settings.objective, self._edges)

    def _leader_config(self, campaign: Campaign) -> Config:
        return self._configs.get(self._ranking(campaign).leader(), self._defaults)

    def _comparator(self, campaign: Campaign, current: ExperimentRecord) -> ExperimentRecord:
        """The fastest build when the evidence puts it ``SWITCH_GAIN`` above ``current`` (else ``current``)."""
        ranking = self._ranking(campaign)
        lead = ranking.leader()
        if lead == current.build or lead not in self._configs:
            return current
        versus = ranking.versus(lead, current.build)
        records = [r for r in self.tried.values() if r.build == lead and campaign.standings.eligible(r)]
        if versus is None or versus.lo < SWITCH_GAIN or not records:
            return current
        return records[-1]

    def _attempt(
        self, campaign: Campaign, config: Config, description: str, against: ExperimentRecord | None
    ) -> ExperimentRecord | None:
        """Screen ``config`` paired with ``against`` (None: the baseline) unless that ran already or
        another sandbox owns the configuration."""
        if against is not None and against.build == self._base_id:
            against = None  # the campaign's default pairing
        key = (config_key(config), "" if against is None else against.build)
        if key in self.tried and self.tried[key].status != "timeout":
            return self.tried[key]
        if owner(config, campaign.settings.budget.sandboxes) != campaign.settings.sandbox:
            return None
        digest = hashlib.sha256(key[0].encode()).hexdigest()[:16]
        dest = Path(campaign.workdir) / f"search-{digest}"
        if not dest.exists():
            # Name, parent and description are functions of the configuration, so the same
            # configuration always makes the same build id (which is what resuming relies on).
            knob_variant(
                campaign.settings.base_dir,
                config,
                dest,
                name=f"{self._base_name}-{digest[:8]}",
                parent=self._base_id,
                description=f"{self._base_name} with {_diff(self._defaults, config) or 'its defaults'}",
            )
        vs = (
            ""
            if against is None
            else f" vs {_diff(self._defaults, self._configs.get(against.build, {})) or 'the comparator'}"
        )
        record = campaign.run_experiment(dest, description=description + vs, against=against, screen=True)
        self._configs[record.build] = config
        self.tried[key] = record
        return record


def _diff(defaults: Config, config: Config) -> str:
    return ", ".join(f"{k}={config[k]}" for k in sorted(config) if config[k] != defaults.get(k))
