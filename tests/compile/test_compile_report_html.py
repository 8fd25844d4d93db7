"""``report.html``: the leaderboard and the speedup-over-time plot with intervals.

The pure renderer on ledgers chosen by the real ``selection.select_result``; the store write
beside ``result.json``; agent-written text escaped; the page opened in headless Chromium
(Debian's ``chromium``), where a script measures the drawn plot; and ``polymorph compile``
printing the path of the report it wrote on a real campaign (tiny model, CPU).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pairing_support import paired

from polymorph.compile import report_html
from polymorph.compile.ledger import CampaignPaths, Ledger
from polymorph.compile.selection import score, select_result
from polymorph.contract.api import ExperimentRecord, Figures, Gates, MeasuredShape, Objective
from polymorph.contract.api.build import Verification
from polymorph.contract.store import LocalStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
OBJECTIVE = Objective()
BASE = "sha256:" + "b" * 64
T0 = datetime(2026, 1, 1, tzinfo=UTC)
VER = Verification(tokenAgreement=1.0, logitError=0.0, finite=True, passed=True)
OFFSETS = (-1.0, 0.5, -0.25, 1.0, 0.0, -0.5, 0.25, 0.75)


def figures(tps: float, jitter: float = 0.01, shift: int = 0) -> Figures:
    n = len(OFFSETS)
    reps = [tps * (1 + jitter * OFFSETS[(i + shift) % n]) for i in range(n)]
    return Figures(
        outputTokensPerSecond=statistics.median(reps),
        totalTokensPerSecond=statistics.median(reps) * 2,
        ttftP50Ms=5,
        ttftP95Ms=6,
        itlP50Ms=10,
        itlP95Ms=10,
        noise=jitter,
        repeats=reps,
        ttftP95Repeats=[6.0] * len(reps),
        itlP95Repeats=[10.0] * len(reps),
    )


def record(
    build: str, minute: int, tps: float | None, against: str | None = BASE, **kw: Any
) -> ExperimentRecord:
    figs = figures(tps) if tps is not None else None
    comparison = paired(figs, figures(100.0, shift=3), against) if figs is not None and against else None
    status = kw.pop("status", "passed" if figs is not None else "failed")
    return ExperimentRecord(
        build=build, status=status, figures=figs, comparison=comparison, verification=VER if figs else None,
        startedAt=T0 + timedelta(minutes=minute), workloadHash="sha256:w", **kw,
    )  # fmt: skip


def build(n: int) -> str:
    return "sha256:" + f"{n:x}" * 64


def ledger() -> list[ExperimentRecord]:
    return [
        record(BASE, 0, 100.0, against=None, name="baseline"),
        record(build(1), 1, 112.0, name="decode-bs8", knobs={"decode_batch": 8}),
        record(build(2), 2, 96.0, name="slower", knobs={"kv_block": 32}),
        record(
            build(3),
            3,
            None,
            name="<script>alert('x')</script>",
            knobs={"attn": "<b>flash</b>"},
            error="verification failed: token agreement 0.42 < 0.99 <img src=x onerror=alert(1)>",
        ),
        record(build(4), 4, 130.0, name="fastest", knobs={"decode_batch": 16, "graphs": True}),
        record(build(5), 5, 104.0, against=build(4), name="vs-anchor", knobs={"graphs": True}),
    ]


def result_of(records: list[ExperimentRecord]) -> Any:
    return select_result({0: records}, BASE, OBJECTIVE, Gates(minSpeedup=1.05))


def test_points_are_scored_as_selection_scores_them() -> None:
    records = ledger()
    result = result_of(records)
    assert result.state == "improved" and result.best is not None and result.best.build == build(4)
    pts = report_html.points(records, result)
    assert [p.record.build for p in pts] == [build(n) for n in (1, 2, 3, 4, 5)], "the baseline is no point"
    by = {p.record.build: p for p in pts}
    for n in (1, 2, 4, 5):
        want = score(records[n], records[0], OBJECTIVE, 1.05)
        assert want is not None
        got = by[build(n)]
        assert (got.speedup, got.lo, got.hi, got.paired) == (want.estimate.value, want.estimate.lo,
                                                             want.estimate.hi, want.paired)  # fmt: skip
    assert by[build(4)].verdict == "better" and (by[build(4)].lo or 0.0) > 1.05
    assert (by[build(2)].speedup or 2.0) < 1.0
    assert not by[build(5)].paired, "paired with the anchor, not the baseline: an unpaired ratio"
    assert by[build(3)].speedup is None and by[build(3)].verdict == "failed"
    assert by[build(4)].seconds == 240.0


def test_page_has_the_summary_plot_and_leaderboard_best_first() -> None:
    records = ledger()
    result = result_of(records)
    page = report_html.render(records, result, title="inference/chat-1a2b")
    assert page.startswith("<!doctype html>") and "<script" not in page.lower()
    assert '<div class="state improved">improved</div>' in page
    svg = re.search(r'<svg id="speedup-plot".*?</svg>', page, re.S)
    assert svg is not None
    plot = svg.group(0)
    assert plot.count('<circle class="point"') == 4 and plot.count('class="ci"') == 4 * 3
    assert plot.count('class="experiment paired better"') == 2  # 112 and 130 tok/s paired: both clear 1.05x
    assert plot.count('class="experiment unpaired') == 1 and plot.count('<g class="no-figures">') == 1
    assert plot.count('class="best-ring"') == 1 and 'class="gate"' in plot and 'class="best-so-far"' in plot
    table = re.search(r'<table id="leaderboard">.*?</table>', page, re.S)
    assert table is not None
    names = re.findall(r'<div class="name">(.*?)</div>', table.group(0))
    # Paired with the baseline first, however an unpaired ratio reads; an unpaired one has no verdict.
    assert names == ["fastest", "decode-bs8", "slower", "vs-anchor"]
    assert re.findall(r'<td class="verdict (\w+)">', table.group(0))[-1] == "unpaired"
    assert table.group(0).count('<td class="verdict better">') == 2
    assert '<tr class="result"><td>1</td>' in table.group(0)
    assert "decode_batch=16" in table.group(0) and "graphs=True" in table.group(0)
    assert f"{result.best.speedup:.3f}x" in page  # the result's own (ranked) speedup in the summary


def test_page_names_the_shape_the_figures_were_measured_at() -> None:
    records = ledger()
    assert report_html.render(records, result_of(records)).count('class="shape"') == 0  # none recorded
    shape = MeasuredShape(
        method="sampledSteps", requests=64, concurrency=8, promptTokensP50=240, promptTokensMax=1913,
        outputTokensP50=63, outputTokensMax=948, cacheSlots=8, cacheLen=2476, decodeSteps=1858,
    )  # fmt: skip
    assert records[0].figures is not None
    records[0].figures.shape = shape
    page = report_html.render(records, result_of(records))
    assert f'<p class="shape">Measured at: {shape.summary()}</p>' in page
    assert "64 requests at concurrency 8" in shape.summary() and "(sampled steps)" in shape.summary()


def test_agent_written_text_is_escaped() -> None:
    page = report_html.render(ledger(), result_of(ledger()))
    for raw in ("<script>alert('x')</script>", "<b>flash</b>", "<img src=x onerror=alert(1)>"):
        assert raw not in page and html.escape(raw, quote=True) in page


def test_no_baseline_and_no_records_still_render() -> None:
    failed = [record(BASE, 0, None, against=None, error="baseline crashed")]
    result = result_of(failed)
    assert result.state == "noBaseline"
    page = report_html.render(failed, result)
    assert "no experiment could be compared with the baseline" in page and "<svg" in page
    assert report_html.points([], result) == []


def test_publish_writes_report_html_beside_result_json(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    paths = CampaignPaths("inference", "chat-1a2b", "uid1")
    records = ledger()
    sandbox_1 = record(build(6), 6, 120.0, against=None, sandbox=1)  # a second sandbox's ledger counts too
    for r in records:
        Ledger(store, paths.ledger(0)).append(r)
    Ledger(store, paths.ledger(1)).append(record(BASE, 0, 100.0, against=None, sandbox=1))
    Ledger(store, paths.ledger(1)).append(sandbox_1)
    result = select_result(
        {0: records, 1: [Ledger(store, paths.ledger(1)).records[0], sandbox_1]}, BASE, OBJECTIVE, Gates()
    )
    store.put_json(paths.result, result.model_dump(mode="json"))
    uri = report_html.publish(store, paths, result, sandboxes=2)
    assert uri == str(tmp_path / "compilejobs/inference/chat-1a2b-uid1/report.html")
    assert Path(uri).parent == Path(store.uri_for(paths.result)).parent
    page = Path(uri).read_text()
    assert page.count('<circle class="point"') == 5 and "<title>inference/chat-1a2b</title>" in page


# A script appended to a copy of the page measures what Chromium laid out and drew.
PROBE = """<script>
const svg = document.getElementById('speedup-plot');
const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
const inside = (el) => { const r = el.getBoundingClientRect();
  return r.width > 0 && r.height > 0 && r.left >= box.left - 1 && r.right <= box.right + 1
         && r.top >= box.top - 1 && r.bottom <= box.bottom + 1; };
const points = [...document.querySelectorAll('#speedup-plot circle.point')];
const bars = [...document.querySelectorAll('#speedup-plot line.ci')];
document.title = JSON.stringify({
  svg: svg instanceof SVGSVGElement, width: box.width, height: box.height,
  points: points.filter(inside).length,
  bars: bars.filter((b) => b.getTotalLength() > 0).length,
  fills: [...new Set(points.map((p) => getComputedStyle(p).fill))].length,
  rows: document.querySelectorAll('#leaderboard tbody tr').length,
});
</script>"""


def chromium_probe(page: str, folder: Path) -> dict[str, Any]:
    assert CHROMIUM, "no chromium on PATH: apt-get install -y chromium"
    path = folder / "probe.html"
    path.write_text(page.replace("</body>", PROBE + "</body>"))
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,1400", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", done.stdout, re.S)
    assert title is not None, done.stdout[:500]
    return dict(json.loads(html.unescape(title.group(1))))


def screenshot(page: Path, png: Path) -> None:
    assert CHROMIUM
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1000,1300",
         f"--screenshot={png}", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert png.stat().st_size > 10_000


def test_chromium_draws_the_plot_with_every_interval(tmp_path: Path) -> None:
    page = report_html.render(ledger(), result_of(ledger()))
    seen = chromium_probe(page, tmp_path)
    assert seen == {
        "svg": True,
        "width": 920,
        "height": 360,
        "points": 4,
        "bars": 12,
        "fills": 3,
        "rows": 4,
    }, seen
    broken = chromium_probe(page.replace('id="speedup-plot"', 'id="elsewhere"'), tmp_path)
    assert broken["svg"] is False and broken["points"] == 0  # the probe can fail


@pytest.mark.slow
def test_polymorph_compile_prints_the_report_chromium_opens(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "polymorph.cli", "compile", "--store", str(store), "--max-experiments", "3",
         "--repeats", "2", "--campaign", "report"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("report: ") and last.endswith("/report.html"), done.stdout[-2000:]
    report = Path(last.removeprefix("report: "))
    result = report.with_name("result.json")
    assert result.exists(), "beside result.json"
    records = [json.loads(line) for line in report.with_name("ledger-0.jsonl").read_text().splitlines()]
    # 3 experiments: the baseline, one screen, and the judgement's final pairing (kept for it,
    # unused when the baseline leads).
    assert len(records) in (2, 3)
    doc = json.loads(result.read_text())
    seen = chromium_probe(report.read_text(), tmp_path)
    scored = seen["points"]
    assert seen["svg"] and seen["width"] == 920 and scored == seen["rows"] >= 1, seen
    assert seen["bars"] == 3 * scored
    assert doc["experiments"]["total"] == len(records)
    if os.environ.get("POLYMORPH_REPORT_PNG"):  # for a person to look at
        screenshot(report, Path(os.environ["POLYMORPH_REPORT_PNG"]))


def test_the_result_ring_and_row_are_on_the_record_the_result_stands_on() -> None:
    """A build screened, then measured in full: two points; the result is marked once, on the
    record whose interval the result reports."""
    records = [
        record(BASE, 0, 100.0, against=None),
        record(build(7), 1, 125.0, screen=True, name="screened"),
        record(build(7), 2, 121.0, name="in-full"),
    ]
    result = result_of(records)
    assert result.best is not None and result.best.build == build(7) and result.best.speedupCi
    pts = report_html.points(records, result)
    (stands,) = [p for p in pts if [p.lo, p.hi] == result.best.speedupCi]
    page = report_html.render(records, result)
    assert page.count('class="best-ring"') == 1 and page.count('<tr class="result">') == 1
    row = re.search(r'<tr class="result">.*?</tr>', page, re.S)
    assert row is not None and f'<div class="name">{stands.record.name}</div>' in row.group(0)
    assert page.count("(screen)") == 1


def test_a_ledger_reloads_what_the_store_holds_beyond_its_memory(tmp_path: Path) -> None:
    """``Ledger.append`` writes the store first; a signal between the two writes leaves the store a
    record ahead, and an interrupted campaign's progress counts what the store holds."""
    store = LocalStore(tmp_path)
    first = Ledger(store, "compilejobs/ns/job-1/ledger-0.jsonl")
    first.append(record(BASE, 0, 100.0, against=None))
    behind = Ledger(store, first.key)
    first.append(record(build(1), 1, 120.0))
    assert len(behind) == 1
    assert behind.reload() == 1 and len(behind) == 2 and behind.find(build(1), "sha256:w") is not None
    assert behind.reload() == 0 and len(behind) == 2
