"""``report.html``: the compile campaign as people read it, next to ``result.json`` in the store.

``render(records, result)`` is pure: the experiment records of every sandbox's ledger and the
campaign's ``CampaignResult`` in, one self-contained HTML page out (inline CSS and SVG, no
script, no external resource, so it opens from a bucket, a file or a mail attachment alike):

- a header: the result's state and message, the gate, the baseline and the best build with its
  speedup and interval, the experiment counts and why the campaign stopped;
- the plot: each experiment's speedup over its sandbox's baseline against the time it started,
  with its 95% confidence interval as an error bar (``selection.score``, the same estimate the
  result is chosen by: paired when the record was benchmarked interleaved with the baseline,
  drawn filled; an unpaired ratio of medians drawn hollow, never a win), the gate
  (``minSpeedup``) and 1.0 as lines, the best winner so far as a step line, the result's best
  ringed, and experiments that failed, were rejected or crashed as crosses on the axis;
- the leaderboard: every scored experiment, best first, with value, speedup, interval, pairs,
  verdict and knobs; then the experiments without figures and why.

Build names, descriptions, knobs and errors come from agents, so every text is escaped.
``publish(store, paths, result, sandboxes)`` reads every sandbox's ledger back from the store,
renders, and writes ``report.html`` beside ``result.json``; it returns the report's URI. It knows nothing about how
the campaign ran.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from polymorph.compile.ledger import CampaignPaths, Ledger
from polymorph.compile.selection import eligible, objective_value, score
from polymorph.contract.api import ExperimentRecord, Objective, measured_shape_of
from polymorph.contract.documents import CampaignResult
from polymorph.contract.store import Store

__all__ = ["Point", "points", "publish", "render"]

WIDTH, HEIGHT = 920, 360
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 20, 16, 46
UNITS = {"outputTokensPerSecond": "tok/s", "totalTokensPerSecond": "tok/s", "ttftP95": "ms", "itlP95": "ms"}


@dataclass(frozen=True)
class Point:
    """One experiment on the plot: its speedup over its sandbox's baseline with a 95% interval."""

    record: ExperimentRecord
    seconds: float
    """Seconds from the campaign's first experiment to this one's start."""
    speedup: float | None
    lo: float | None
    hi: float | None
    paired: bool
    verdict: str
    """``better``, ``worse``, ``inconclusive`` at minSpeedup when paired with the baseline, ``unpaired``
    otherwise; the status for an experiment without figures."""
    pairs: int


def _baselines(
    records: Sequence[ExperimentRecord], base: str, objective: Objective
) -> dict[int, ExperimentRecord]:
    found: dict[int, ExperimentRecord] = {}
    for r in records:
        if r.build == base and eligible(r, objective) and r.sandbox not in found:
            found[r.sandbox] = r
    return found


def points(records: Sequence[ExperimentRecord], result: CampaignResult) -> list[Point]:
    """Every experiment but the baselines, in start order, scored as ``selection`` scores them."""
    ordered = sorted(records, key=lambda r: r.startedAt)
    if not ordered:
        return []
    t0 = ordered[0].startedAt
    baselines = _baselines(ordered, result.baseBuild, result.objective)
    out = []
    for r in ordered:
        base = baselines.get(r.sandbox)
        if base is not None and r is base:
            continue
        seconds = (r.startedAt - t0).total_seconds()
        scored = (
            score(r, base, result.objective, result.minSpeedup)
            if base is not None and eligible(r, result.objective)
            else None
        )
        if scored is None:
            out.append(Point(r, seconds, None, None, None, False, r.status, 0))
            continue
        est = scored.estimate
        hi = est.hi if math.isfinite(est.hi) else None
        verdict = str(scored.verdict) if scored.paired else "unpaired"  # only a paired ratio is a verdict
        out.append(Point(r, seconds, est.value, est.lo, hi, scored.paired, verdict, est.n))
    return out


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _short(build: str) -> str:
    return build.removeprefix("sha256:")[:12] if build.startswith("sha256:") else build


def _clock(seconds: float, span: float | None = None) -> str:
    """``12m05s`` (``3.4s`` on a plot spanning under two minutes, ``1.5h`` past an hour)."""
    if (span if span is not None else seconds) < 120:
        return f"{seconds:.1f}s" if seconds < 100 else f"{seconds:.0f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds < 3600 else f"{seconds / 3600:.1f}h"


def _result_point(pts: Sequence[Point], result: CampaignResult) -> Point | None:
    """The experiment the result's best build stands on: of its records, the one whose interval
    the result reports, else the one with the most pairs (a build may run screened, then in full)."""
    if result.best is None:
        return None
    mine = [p for p in pts if p.record.build == result.best.build and p.speedup is not None]
    ci = result.best.speedupCi
    for p in mine:
        if (
            ci is not None
            and p.lo is not None
            and p.hi is not None
            and math.isclose(p.lo, ci[0])
            and math.isclose(p.hi, ci[1])
        ):
            return p
    return max(mine, key=lambda p: (p.pairs, p.seconds), default=None)


def _plot(pts: Sequence[Point], result: CampaignResult) -> str:
    """The SVG plot of speedup over time, with intervals."""
    scored = [p for p in pts if p.speedup is not None]
    gate = result.minSpeedup
    values = [gate, 1.0] + [v for p in scored for v in (p.lo, p.hi, p.speedup) if v is not None]
    lo, hi = min(values), max(values)
    span = max(hi - lo, 0.05)
    lo, hi = max(0.0, lo - span * 0.08), hi + span * 0.08
    last = max([p.seconds for p in pts] + [1.0])
    t_end = last * 1.04  # room for the last point's marker
    w, h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM

    def x(seconds: float) -> float:
        return PAD_LEFT + seconds / t_end * w

    def y(v: float) -> float:
        return PAD_TOP + h - (min(max(v, lo), hi) - lo) / (hi - lo) * h

    best = _result_point(pts, result)
    parts = [
        f'<svg id="speedup-plot" class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="speedup of each experiment over time">',
        f'<rect x="{PAD_LEFT}" y="{PAD_TOP}" width="{w}" height="{h}" class="frame"/>',
    ]
    for i in range(6):
        v = lo + (hi - lo) * i / 5
        parts.append(
            f'<line class="grid" x1="{PAD_LEFT}" x2="{PAD_LEFT + w}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{PAD_LEFT - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}x</text>'
        )
    for i in range(6):
        t = t_end * i / 5
        parts.append(
            f'<text class="tick" x="{x(t):.1f}" y="{PAD_TOP + h + 18}" text-anchor="middle">{_clock(t, t_end)}</text>'
        )
    parts.append(
        f'<text class="axis" x="{PAD_LEFT + w / 2}" y="{HEIGHT - 6}" text-anchor="middle">time since the first experiment</text>'
    )
    parts.append(
        f'<text class="axis" transform="translate(14 {PAD_TOP + h / 2}) rotate(-90)" text-anchor="middle">speedup over baseline</text>'
    )
    parts.append(
        f'<line class="baseline" x1="{PAD_LEFT}" x2="{PAD_LEFT + w}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}"/>'
    )
    parts.append(
        f'<line class="gate" x1="{PAD_LEFT}" x2="{PAD_LEFT + w}" y1="{y(gate):.1f}" y2="{y(gate):.1f}"/>'
    )
    parts.append(
        f'<text class="gate-label" x="{PAD_LEFT + w - 4}" y="{y(gate) - 5:.1f}" text-anchor="end">gate {gate:g}x</text>'
    )
    # The best winner so far: a paired experiment whose interval cleared the gate.
    path, running = [], None
    for p in scored:
        if (
            p.paired
            and p.verdict == "better"
            and p.speedup is not None
            and (running is None or p.speedup > running)
        ):
            path.append(
                f"M{x(p.seconds):.1f},{y(p.speedup):.1f}"
                if running is None
                else f"H{x(p.seconds):.1f}V{y(p.speedup):.1f}"
            )
            running = p.speedup
    if path:
        path.append(f"H{x(last):.1f}")
        parts.append(f'<path class="best-so-far" d="{" ".join(path)}"/>')
    for p in pts:
        title = _e(f"{p.record.name or _short(p.record.build)}: {p.record.status}")
        if p.speedup is None:
            cx, cy = x(p.seconds), float(PAD_TOP + h)
            parts.append(
                f'<g class="no-figures"><title>{title}{_e(" - " + p.record.error) if p.record.error else ""}</title>'
                f'<path d="M{cx - 4:.1f},{cy - 4:.1f}l8,8m0,-8l-8,8"/></g>'
            )
            continue
        cx, cy = x(p.seconds), y(p.speedup)
        ci = ""
        if p.lo is not None and p.hi is not None:
            ci = (
                f'<line class="ci" x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(p.lo):.1f}" y2="{y(p.hi):.1f}"/>'
                f'<line class="ci" x1="{cx - 3:.1f}" x2="{cx + 3:.1f}" y1="{y(p.lo):.1f}" y2="{y(p.lo):.1f}"/>'
                f'<line class="ci" x1="{cx - 3:.1f}" x2="{cx + 3:.1f}" y1="{y(p.hi):.1f}" y2="{y(p.hi):.1f}"/>'
            )
        kind = f"{'paired' if p.paired else 'unpaired'} {p.verdict}"
        interval = f" [{p.lo:.3f}, {p.hi:.3f}]" if p.lo is not None and p.hi is not None else ""
        parts.append(
            f'<g class="experiment {kind}"><title>{title}, {p.speedup:.3f}x{interval}</title>{ci}'
            f'<circle class="point" cx="{cx:.1f}" cy="{cy:.1f}" r="4.5"/></g>'
        )
        if p is best:
            parts.append(f'<circle class="best-ring" cx="{cx:.1f}" cy="{cy:.1f}" r="9"/>')
    parts.append("</svg>")
    return "".join(parts)


def _legend() -> str:
    return (
        '<div class="legend"><span><i class="dot paired better"></i>paired, cleared the gate</span>'
        '<span><i class="dot paired"></i>paired</span><span><i class="dot unpaired"></i>unpaired (never a win)</span>'
        '<span><i class="bar"></i>95% interval</span><span><i class="line best"></i>best winner so far</span>'
        '<span><i class="line gate"></i>gate</span><span><i class="ring"></i>result</span>'
        '<span class="x">&#x2715;</span> no figures (rejected, failed, crashed, timeout)</div>'
    )


def _knobs(knobs: dict[str, object]) -> str:
    return (
        " ".join(f"<code>{_e(k)}={_e(v)}</code>" for k, v in sorted(knobs.items()))
        or "<code>(reference)</code>"
    )


def _leaderboard(pts: Sequence[Point], result: CampaignResult) -> str:
    # Paired results first: an unpaired ratio is never a win (the legend says so), so it never
    # ranks above one, however high it reads.
    scored = sorted(
        (p for p in pts if p.speedup is not None),
        key=lambda p: (not p.paired, -(p.speedup or 0.0), p.seconds),
    )
    unit = UNITS.get(result.objective.metric, "")
    best = _result_point(pts, result)
    span = max((p.seconds for p in pts), default=0.0)
    rows = []
    for n, p in enumerate(scored, 1):
        assert p.record.figures is not None and p.speedup is not None
        value = objective_value(p.record.figures, result.objective)
        interval = f"[{p.lo:.3f}, {p.hi:.3f}]" if p.lo is not None and p.hi is not None else "[unbounded]"
        mark = ' class="result"' if p is best else ""
        pairs = (str(p.pairs) if p.paired else "unpaired") + (" (screen)" if p.record.screen else "")
        rows.append(
            f'<tr{mark}><td>{n}</td><td title="{_e(p.record.build)}"><code>{_e(_short(p.record.build))}</code>'
            f'<div class="name">{_e(p.record.name)}</div></td><td>{value:,.1f} {unit}</td>'
            f"<td><b>{p.speedup:.3f}x</b></td><td>{interval}</td><td>{pairs}</td>"
            f'<td class="verdict {_e(p.verdict)}">{_e(p.verdict)}</td><td>{p.record.sandbox}</td>'
            f"<td>{_clock(p.seconds, span)}</td><td>{_knobs(p.record.knobs)}</td></tr>"
        )
    others = [p for p in pts if p.speedup is None]
    other_rows = "".join(
        f'<tr><td><code>{_e(_short(p.record.build))}</code><div class="name">{_e(p.record.name)}</div></td>'
        f'<td class="verdict {_e(p.record.status)}">{_e(p.record.status)}</td><td>{_clock(p.seconds, span)}</td>'
        f"<td>{_e(p.record.error or '')}</td><td>{_knobs(p.record.knobs)}</td></tr>"
        for p in others
    )
    table = (
        '<table id="leaderboard"><thead><tr><th>#</th><th>build</th><th>value</th><th>speedup</th>'
        "<th>95% interval</th><th>pairs</th><th>verdict</th><th>sandbox</th><th>started</th><th>knobs</th>"
        f"</tr></thead><tbody>{''.join(rows) or '<tr><td colspan=10>no experiment could be compared with the baseline</td></tr>'}</tbody></table>"
    )
    if others:
        table += (
            f'<h2>Experiments without figures ({len(others)})</h2><table id="unscored"><thead><tr><th>build</th>'
            f"<th>status</th><th>started</th><th>why</th><th>knobs</th></tr></thead><tbody>{other_rows}</tbody></table>"
        )
    return table


def _summary(result: CampaignResult) -> str:
    unit = UNITS.get(result.objective.metric, "")
    c = result.experiments
    lines = [
        f'<div class="state {_e(result.state)}">{_e(result.state)}</div><p class="message">{_e(result.message)}</p>',
        "<dl>",
        f"<dt>objective</dt><dd>{_e(result.objective.metric)} ({'higher' if result.objective.maximize else 'lower'} is better); "
        f"gate: the 95% interval's lower end above {result.minSpeedup:g}x, paired with the baseline</dd>",
        f"<dt>base build</dt><dd><code>{_e(result.baseBuildName or result.baseBuild)}</code></dd>",
    ]
    if result.baseline is not None:
        lines.append(
            f"<dt>baseline</dt><dd>{result.baseline.value:,.1f} {unit} ±{result.baseline.noise * 100:.1f}%</dd>"
        )
    shown = result.best or result.bestCandidate
    if shown is not None:
        ci = f" [{shown.speedupCi[0]:.3f}, {shown.speedupCi[1]:.3f}]" if shown.speedupCi else ""
        what = "best" if result.best is not None else "closest miss"
        behind = f"{shown.pairs} pairs" if shown.pairs else "unpaired"
        lines.append(
            f"<dt>{what}</dt><dd><b>{shown.speedup:.3f}x</b>{ci} ({behind}), {shown.value:,.1f} {unit}, "
            f"<code>{_e(shown.build)}</code>{' at ' + _e(shown.uri) if shown.uri else ''}</dd>"
        )
    if result.confirmation is not None and result.confirmation.speedup is not None:
        conf = result.confirmation
        ci = f" [{conf.speedupCi[0]:.3f}, {conf.speedupCi[1]:.3f}]" if conf.speedupCi else ""
        lines.append(
            f"<dt>re-measured</dt><dd>{conf.speedup:.3f}x{ci} ({conf.pairs} pairs): {'confirmed' if conf.confirmed else 'not confirmed'}</dd>"
        )
    lines.append(
        f"<dt>experiments</dt><dd>{c.total}: {c.passed} passed, {c.rejected} rejected, {c.failed} failed, "
        f"{c.crashed} crashed, {c.timeout} timed out</dd>"
    )
    if result.stopReason:
        lines.append(
            f"<dt>stopped</dt><dd>{_e(result.stopReason)}{': ' + _e(result.stopMessage) if result.stopMessage else ''}</dd>"
        )
    lines.append("</dl>")
    return "".join(lines)


STYLE = """
body { font: 14px/1.45 system-ui, 'DejaVu Sans', sans-serif; color: #1d232a; margin: 24px auto; max-width: 980px; padding: 0 12px; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.state { display: inline-block; padding: 2px 10px; border-radius: 10px; font-weight: 600; background: #e8ecf0; }
.state.improved { background: #d9f2dc; color: #185c25; } .state.noBaseline { background: #fbe0e0; color: #8a1c1c; }
.message { margin: 6px 0 10px; } dl { display: grid; grid-template-columns: 130px 1fr; gap: 2px 12px; margin: 0; }
dt { color: #5b6570; } dd { margin: 0; overflow-wrap: anywhere; } code { font: 12px ui-monospace, 'DejaVu Sans Mono', monospace; }
.plot .frame { fill: #fbfcfd; stroke: #d5dbe1; } .plot .grid { stroke: #e6eaee; }
.plot .tick, .plot .gate-label { fill: #5b6570; font-size: 11px; } .plot .axis { fill: #39424b; font-size: 12px; }
.plot .baseline { stroke: #8b949e; stroke-width: 1; } .plot .gate { stroke: #d1242f; stroke-dasharray: 6 4; stroke-width: 1.2; }
.plot .gate-label { fill: #d1242f; }
.plot .best-so-far { fill: none; stroke: #1a7f37; stroke-width: 2; opacity: .75; }
.plot .ci { stroke: #57606a; stroke-width: 1.2; }
.plot .point { fill: #0969da; stroke: #0969da; stroke-width: 1.5; }
.plot .better .point { fill: #1a7f37; stroke: #1a7f37; } .plot .better .ci { stroke: #1a7f37; }
.plot .unpaired .point { fill: #fff; stroke: #8b949e; } .plot .unpaired .ci { stroke: #afb8c1; stroke-dasharray: 2 2; }
.plot .best-ring { fill: none; stroke: #bf8700; stroke-width: 2.5; }
.plot .no-figures path { stroke: #cf222e; stroke-width: 2; }
.legend { font-size: 12px; color: #39424b; margin: 4px 0 0 64px; } .legend span { margin-right: 14px; white-space: nowrap; }
.legend i { display: inline-block; vertical-align: middle; margin-right: 4px; }
.legend .dot { width: 9px; height: 9px; border-radius: 50%; background: #0969da; border: 1.5px solid #0969da; }
.legend .dot.better { background: #1a7f37; border-color: #1a7f37; } .legend .dot.unpaired { background: #fff; border-color: #8b949e; }
.legend .bar { width: 2px; height: 12px; background: #57606a; } .legend .line { width: 16px; height: 2px; background: #1a7f37; }
.legend .line.gate { background: repeating-linear-gradient(90deg, #d1242f 0 6px, transparent 6px 10px); }
.legend .ring { width: 12px; height: 12px; border-radius: 50%; border: 2.5px solid #bf8700; } .legend .x { color: #cf222e; }
table { border-collapse: collapse; width: 100%; font-size: 13px; } th, td { text-align: left; padding: 4px 6px; border-bottom: 1px solid #e6eaee; vertical-align: top; }
th { color: #5b6570; font-weight: 600; } tr.result { background: #fff8c5; } .name { color: #5b6570; font-size: 12px; }
.verdict.better { color: #1a7f37; font-weight: 600; } .verdict.worse, .verdict.failed, .verdict.crashed { color: #cf222e; }
footer { color: #8b949e; font-size: 12px; margin-top: 18px; }
"""


def _shape(records: Sequence[ExperimentRecord]) -> str:
    shape = measured_shape_of(records)
    return f'<p class="shape">Measured at: {_e(shape.summary())}</p>' if shape is not None else ""


def render(
    records: Iterable[ExperimentRecord],
    result: CampaignResult,
    title: str = "",
    generated: datetime | None = None,
) -> str:
    """The whole report page for ``result`` and the experiment records behind it."""
    recs = list(records)
    pts = points(recs, result)
    heading = title or "Compile campaign"
    when = f" at {generated.isoformat(timespec='seconds')}" if generated is not None else ""
    scored = sum(p.speedup is not None for p in pts)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(heading)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{_e(heading)}</h1>{_summary(result)}{_shape(recs)}"
        f"<h2>Speedup of each experiment over time ({scored} compared with the baseline, {len(pts) - scored} without figures)</h2>"
        f"{_plot(pts, result)}{_legend()}<h2>Leaderboard</h2>{_leaderboard(pts, result)}"
        f"<footer>polymorph compile report{_e(when)}: {len(recs)} experiment records, "
        f"workload {_e(result.workloadHash or 'unknown')}; speedups and 95% intervals as "
        "polymorph.compile.selection scores them.</footer></body></html>"
    )


def publish(
    store: Store,
    paths: CampaignPaths,
    result: CampaignResult,
    sandboxes: int = 1,
    generated: datetime | None = None,
) -> str:
    """Render ``result`` with every sandbox's ledger from ``store``; write ``report.html``; its URI."""
    records = [r for i in range(sandboxes) for r in Ledger(store, paths.ledger(i)).records]
    page = render(records, result, title=f"{paths.namespace}/{paths.name}", generated=generated)
    store.put_bytes(paths.report, page.encode())
    return store.uri_for(paths.report)
