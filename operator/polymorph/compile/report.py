"""What ``polymorph compile`` shows: live progress while a campaign runs, then its report.

``Display`` draws a rich progress bar and a live leaderboard when stdout is a terminal, and
prints one plain line per experiment otherwise (to stderr under ``--json``, so stdout holds
only the final object). ``final_json`` and ``render_report`` turn a ``CampaignOutcome`` plus
the supervisor's stats into the final JSON object or the human report. ``overhead`` computes
the cold-start versus hot-swap comparison.

Every figure is shown with its uncertainty: a value as ``value ±CI (n passes)`` (the relative
half-width of the median's 95% interval), a speedup as the paired ratio with its 95% interval
and the pairs behind it. In ``--json``, ``baseline.ci`` is the baseline value's interval and
``best.ci`` the speedup's (``[lo, hi]``); ``noise`` fields are relative half-widths.

It knows nothing about how campaigns run; it only formats what they return.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar
from rich.table import Table

from polymorph.compile.ledger import CampaignPaths
from polymorph.compile.outcome import CampaignOutcome
from polymorph.compile.selection import objective_value
from polymorph.contract.api import ExperimentRecord, Objective, measured_shape_of
from polymorph.contract.documents import Progress
from polymorph.contract.store import Store

__all__ = ["Display", "experiments_per_hour", "final_json", "overhead", "render_report"]


def _short(build: str) -> str:
    return build[:19] if build.startswith("sha256:") else build


class WorkerStats(Protocol):
    """What a local engine worker spent (``polymorph_engine``'s ``SupervisorStats`` has these)."""

    starts: int
    restarts: int
    experiment_seconds: list[float]

    @property
    def mean_load_s(self) -> float: ...


def overhead(records: list[ExperimentRecord], stats: WorkerStats | None) -> dict[str, float | int]:
    """Cold start (worker spawn, imports, weights, golden) versus the hot swap each experiment paid."""
    loads = [r.timings.loadS for r in records if r.timings.totalS > 0]
    totals = list((stats.experiment_seconds if stats else []) or [r.timings.totalS for r in records])
    cold = stats.mean_load_s if stats else 0.0
    swap = sum(loads) / len(loads) if loads else 0.0
    return {
        "coldStartS": round(cold, 3),
        "hotSwapS": round(swap, 4),
        "experimentS": round(sum(totals) / len(totals), 3) if totals else 0.0,
        "workerStarts": stats.starts if stats else 0,
        "restarts": stats.restarts if stats else 0,
        "savedS": round(max(0.0, cold - swap) * len(totals), 1),
    }


def experiments_per_hour(outcome: CampaignOutcome) -> float:
    """Experiments per hour of wall time: this run's, or the whole campaign's when this run only replayed the ledger."""
    if outcome.ranThisSession > 0 and outcome.sessionSeconds > 0:
        return round(outcome.ranThisSession * 3600.0 / outcome.sessionSeconds, 1)
    elapsed = outcome.progress.elapsedS
    return round(len(outcome.records) * 3600.0 / elapsed, 1) if elapsed > 0 else 0.0


def final_json(
    outcome: CampaignOutcome, stats: WorkerStats | None, store: Store, paths: CampaignPaths
) -> dict[str, Any]:
    """The ``--json`` object: baseline, best (build, value, speedup, noise), experiments, experimentsPerHour."""
    result = outcome.result
    best, baseline, cand = result.best, result.baseline, result.bestCandidate
    confirmed = result.confirmation.speedup if result.confirmation is not None else None
    return {
        "state": result.state,
        "message": result.message,
        "stopReason": outcome.stopReason,
        "stopMessage": outcome.message,
        "objective": result.objective.metric,
        "campaign": {"prefix": paths.prefix, "store": store.uri, "result": store.uri_for(paths.result)},
        "measuredShape": shape.model_dump(mode="json")
        if (shape := measured_shape_of(outcome.records))
        else None,
        "baseline": {
            "build": baseline.build,
            "value": baseline.value,
            "noise": baseline.noise,
            "ci": baseline.valueCi,
            "passes": baseline.passes,
        }
        if baseline
        else None,
        "best": (
            {
                "build": best.build,
                "value": best.value,
                "speedup": best.speedup,
                "noise": best.speedupNoise,
                "ci": best.speedupCi,
                "pairs": best.pairs,
                "uri": best.uri,
                "knobs": best.knobs,
                "confirmedSpeedup": confirmed,
                "confirmedCi": result.confirmation.speedupCi if result.confirmation is not None else None,
                "confirmedPairs": result.confirmation.pairs if result.confirmation is not None else 0,
            }
            if best
            else None
        ),
        "bestCandidate": (
            {
                "build": cand.build,
                "value": cand.value,
                "speedup": cand.speedup,
                "speedupNoise": cand.speedupNoise,
                "ci": cand.speedupCi,
                "pairs": cand.pairs,
            }
            if cand
            else None
        ),
        "experiments": result.experiments.model_dump(mode="json")
        | {"ranThisRun": outcome.ranThisSession, "fromLedger": outcome.fromLedger},
        "experimentsPerHour": experiments_per_hour(outcome),
        "overhead": overhead(outcome.records, stats),
        "tokens": outcome.progress.tokens.model_dump(mode="json"),
    }


def render_report(
    outcome: CampaignOutcome,
    stats: WorkerStats | None,
    store: Store,
    paths: CampaignPaths,
    rerun: Callable[[str], str] | None = None,
) -> None:
    """Print the human report on stdout. ``rerun(build)`` is the command line that measures
    ``build`` again as the campaign did, paired with its baseline (the "run again" line)."""
    doc = final_json(outcome, stats, store, paths)
    out = sys.stdout
    metric = doc["objective"]
    print("", file=out)
    print(f"campaign   {paths.prefix} in {store.uri}", file=out)
    print(f"stopped    {outcome.stopReason}: {outcome.message}", file=out)
    e = doc["experiments"]
    print(
        f"experiments {e['total']} ({e['passed']} passed, {e['rejected']} rejected, {e['failed']} failed, "
        f"{e['crashed']} crashed, {e['timeout']} timed out); {e['ranThisRun']} ran now, {e['fromLedger']} from the ledger",
        file=out,
    )
    if (shape := measured_shape_of(outcome.records)) is not None:
        print(f"measured   {shape.summary()}", file=out)
    if doc["baseline"]:
        b = doc["baseline"]
        print(f"baseline   {_value(b['value'], b['noise'], b['passes'])} {metric}", file=out)
    best = doc["best"]
    if best:
        print(
            f"best       {best['value']:.1f} {metric}: {_ratio(best['speedup'], best['ci'], best['pairs'])}"
            " paired with the baseline",
            file=out,
        )
        if best["confirmedSpeedup"] is not None:
            print(
                f"confirmed  {_ratio(best['confirmedSpeedup'], best['confirmedCi'], best['confirmedPairs'])}"
                f" when re-measured paired with the baseline (gate {result_gate(outcome)})",
                file=out,
            )
        print(f"build      {best['build']}", file=out)
        print(f"stored     {best['uri']}", file=out)
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(best["knobs"].items()))
        print(f"knobs      {knobs}", file=out)
        if rerun is not None:
            print(f"run again  {rerun(best['build'])}", file=out)
    else:
        print(f"result     {doc['message']}", file=out)
    o = doc["overhead"]
    print(f"throughput {doc['experimentsPerHour']:.0f} experiments/hour", file=out)
    print(
        f"hot reload cold start {o['coldStartS']:.2f}s (spawn, imports, weights, golden) vs hot swap {o['hotSwapS'] * 1000:.1f}ms "
        f"per build; experiments took {o['experimentS']:.2f}s each; restarting instead would have cost ~{o['savedS']:.0f}s more",
        file=out,
    )


def _value(value: float, noise: float, passes: int) -> str:
    """``2899.1 ±1.2% (9 passes)``."""
    return f"{value:.1f} ±{noise * 100:.1f}% ({passes} passes)"


def _ratio(speedup: float, ci: list[float] | None, pairs: int) -> str:
    """``1.43x [1.40, 1.46] (9 pairs)``."""
    interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    return f"{speedup:.2f}x{interval} ({pairs} pairs)" if pairs else f"{speedup:.2f}x{interval} (unpaired)"


def result_gate(outcome: CampaignOutcome) -> str:
    """The minSpeedup gate, as ``1.05x``."""
    return f"{outcome.result.minSpeedup:g}x"


class Display:
    """Live campaign progress: rich on a terminal, plain lines otherwise."""

    def __init__(
        self, total: int, objective: Objective, json_mode: bool = False, stream: TextIO | None = None
    ) -> None:
        self.total = total
        self.objective = objective
        self.stream = stream or (sys.stderr if json_mode else sys.stdout)
        self.rich = not json_mode and self.stream.isatty()
        self.count = 0
        self._ordinals: dict[tuple[str, str | None, str, bool], int] = {}
        self._shape_shown = False
        self._live: Live | None = None
        self._progress: Bar | None = None
        self._task: TaskID | None = None
        self._board: dict[str, tuple[float, str, str, str]] = {}
        self._baseline: float | None = None

    def __enter__(self) -> Display:
        if self.rich:
            self._progress = Bar(
                TextColumn("[bold]compiling"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
            )
            self._task = self._progress.add_task("", total=self.total)
            self._live = Live(self._render(), console=Console(file=self.stream), refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def begin(self, prefix: str, recorded: int) -> None:
        note = f"resuming: {recorded} experiments already in the ledger" if recorded else "new campaign"
        self.total = max(self.total, recorded)  # a resumed ledger may outnumber this run's budget
        self.log(f"campaign {prefix} ({note})")

    def log(self, message: str) -> None:
        if self._live is not None:
            self._live.console.print(message)
        else:
            print(message, file=self.stream, flush=True)

    def on_record(self, record: ExperimentRecord, cached: bool, progress: Progress) -> None:
        # Number each ledger entry by the order it was first shown, not by the ledger's total, so
        # that records replayed from the ledger on resume count up too; a record shown again (an
        # agent asking for a pairing it already ran, by the same protocol) keeps its number.
        key = (
            record.build,
            record.comparison.against if record.comparison is not None else None,
            record.workloadHash,
            record.screen,
        )
        ordinal = self._ordinals.setdefault(key, len(self._ordinals) + 1)
        if not self._shape_shown and record.figures is not None and record.figures.shape is not None:
            self._shape_shown = True  # once: every experiment of a campaign measures one shape
            self.log(f"measured at: {record.figures.shape.summary()}")
        self.count = len(self._ordinals)
        value = objective_value(record.figures, self.objective) if record.figures is not None else None
        if progress.baseline is not None:
            self._baseline = progress.baseline.value
        ratio: float | None = None
        paired = record.comparison
        if paired is not None and record.figures is not None:
            ratio = paired.ratio if self.objective.maximize else 1.0 / paired.ratio
        elif value is not None and self._baseline:
            ratio = value / self._baseline if self.objective.maximize else self._baseline / value
        shown = (
            _value(value, record.figures.noise, record.passes or len(record.figures.repeats))
            if value is not None and record.figures is not None
            else ""
        )
        base_build = progress.baseline.build if progress.baseline is not None else None
        if (
            ratio is not None
            and record.status == "passed"
            and paired is not None
            and paired.against == base_build
        ):
            # The board ranks speedups over the baseline; a pairing with an intermediate best is a step.
            self._board[record.build] = (ratio, shown, _short(record.build), record.description[:48])
        speed = ""
        if ratio is not None and paired is not None:
            speed = f"{ratio:.2f}x [{paired.lo:.2f}, {paired.hi:.2f}] vs {_short(paired.against)}"
        figure = shown if value is not None else (record.error or "")[:60]
        label: str = record.status
        if record.status == "passed" and paired is not None and ratio is not None:
            # Passed verification and benchmark; what a person reads first is how it compared.
            lo, hi = (paired.lo, paired.hi) if self.objective.maximize else (1 / paired.hi, 1 / paired.lo)
            label = "faster" if lo > 1 else "slower" if hi < 1 else "even"
        line = f"[{ordinal:>3}/{max(self.total, self.count)}] {label:<8} {_short(record.build)} {figure} {speed} {record.description}"
        if cached:
            line += " (from ledger)"
        if self._live is not None and self._progress is not None and self._task is not None:
            self._progress.update(
                self._task, completed=min(self.count, self.total), description=record.description[:40]
            )
            self._live.update(self._render())
        else:
            print(line.rstrip(), file=self.stream, flush=True)

    def _render(self) -> Group:
        table = Table(title="leaderboard", expand=False)
        for col in ("#", "value ±CI (n passes)", "paired ratio", "build", "change"):
            table.add_column(col)
        for i, (ratio, shown, build, desc) in enumerate(
            sorted(self._board.values(), key=lambda x: -x[0])[:5], 1
        ):
            table.add_row(str(i), shown, f"{ratio:.2f}x", build, desc)
        return Group(*([self._progress] if self._progress is not None else []), table)
