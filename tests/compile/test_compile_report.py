"""The compile display (rich on a terminal, plain lines otherwise) and trace profiles."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from polymorph.compile.report import Display
from polymorph.contract.api import ExperimentRecord, Figures, Objective, Verification
from polymorph.contract.api.build import PairedComparison, TokenUsage
from polymorph.contract.documents import Counts, Progress, ProgressBudget, Standing
from polymorph.contract.workload import parse_trace, profile_of


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _figures(tps: float) -> Figures:
    return Figures(
        outputTokensPerSecond=tps,
        totalTokensPerSecond=tps,
        ttftP50Ms=1,
        ttftP95Ms=1,
        itlP50Ms=1,
        itlP95Ms=1,
        noise=0.02,
        repeats=[tps] * 7,
    )


def _record(build: str, tps: float, description: str, paired_with: float | None = None) -> ExperimentRecord:
    ver = Verification(tokenAgreement=1, logitError=0, finite=True, passed=True)
    comparison = None
    if paired_with is not None:
        ratio = tps / paired_with
        comparison = PairedComparison(
            against="sha256:" + "a" * 64,
            ratio=ratio,
            lo=ratio * 0.98,
            hi=ratio * 1.02,
            pairs=7,
            halfWidth=0.02,
            baseline=_figures(paired_with),
        )
    return ExperimentRecord(
        build=build,
        status="passed",
        verification=ver,
        figures=_figures(tps),
        description=description,
        comparison=comparison,
        passes=7,
    )


def _progress(n: int) -> Progress:
    now = datetime.now(UTC)
    figures = _record("sha256:" + "a" * 64, 100.0, "baseline").figures
    assert figures is not None
    return Progress(
        sandbox=0,
        sandboxes=1,
        agent="search",
        state="running",
        stopReason=None,
        message="",
        counts=Counts(passed=n, total=n),
        baseline=Standing(build="sha256:" + "a" * 64, value=100.0, noise=0.0, sandbox=0, figures=figures),
        best=None,
        startedAt=now,
        updatedAt=now,
        elapsedS=1.0,
        budget=ProgressBudget(maxExperiments=3, experimentsLeft=3 - n, deadlineS=60.0, secondsLeft=59.0),
        tokens=TokenUsage(),
        workloadHash="sha256:" + "c" * 64,
    )


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Display(total=3, objective=Objective(), stream=out) as d:
        d.on_record(_record("sha256:" + "a" * 64, 100.0, "baseline"), False, _progress(1))
        d.on_record(_record("sha256:" + "b" * 64, 150.0, "sweep: x=1", paired_with=100.0), True, _progress(2))
    lines = out.getvalue().splitlines()
    # A value is shown as value ±CI (n passes); a paired ratio with its interval and its baseline.
    assert lines[0].startswith("[  1/3] passed") and "100.0 ±2.0% (7 passes)" in lines[0]
    assert "1.50x [1.47, 1.53] vs sha256:aaaaaaaaaaaa sweep: x=1 (from ledger)" in lines[1]
    # A paired experiment says how it compared, not only that it passed: a 0.66x one is slower.
    assert lines[1].startswith("[  2/3] faster")


def test_a_slower_paired_experiment_reads_slower_and_a_resumed_ledger_counts_against_itself() -> None:
    out = io.StringIO()
    with Display(total=3, objective=Objective(), stream=out) as d:
        d.begin("compilejobs/local/x", 25)
        d.on_record(_record("sha256:" + "a" * 64, 100.0, "baseline"), True, _progress(1))
        d.on_record(_record("sha256:" + "b" * 64, 66.0, "sweep: x=2", paired_with=100.0), True, _progress(2))
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("[  2/25] slower") and "0.66x" in lines[-1], lines


def test_replayed_ledger_lines_count_up() -> None:
    # On resume the campaign replays its ledger with progress already at the ledger's total;
    # each line still shows its own number, and a record shown again keeps its number.
    out = io.StringIO()
    base = _record("sha256:" + "a" * 64, 100.0, "baseline")
    swept = _record("sha256:" + "b" * 64, 150.0, "sweep: x=1", paired_with=100.0)
    with Display(total=30, objective=Objective(), stream=out) as d:
        for record in (base, swept, _record("sha256:" + "c" * 64, 120.0, "sweep: y=1", paired_with=100.0)):
            d.on_record(record, True, _progress(3))
        d.on_record(swept, True, _progress(3))
        d.on_record(
            _record("sha256:" + "d" * 64, 130.0, "sweep: z=1", paired_with=100.0), False, _progress(4)
        )
    assert [line[:8] for line in out.getvalue().splitlines()] == [
        "[  1/30]",
        "[  2/30]",
        "[  3/30]",
        "[  2/30]",
        "[  4/30]",
    ]
    assert d.count == 4


def test_rich_progress_and_leaderboard_on_a_terminal() -> None:
    out = Terminal()
    with Display(total=3, objective=Objective(), stream=out) as d:
        assert d.rich
        d.on_record(_record("sha256:" + "a" * 64, 100.0, "baseline"), False, _progress(1))
        d.on_record(
            _record("sha256:" + "b" * 64, 180.0, "sweep: fast=yes", paired_with=100.0), False, _progress(2)
        )
    text = out.getvalue()
    assert "leaderboard" in text and "1.80x" in text and "sweep: fast=yes" in text and "2/3" in text
    assert "180.0 ±2.0%" in text


def test_a_trace_gets_a_power_of_two_profile() -> None:
    lines = [f'{{"inputTokens": {n}, "outputTokens": 8}}' for n in (3, 30, 33, 100)]
    profile = profile_of(parse_trace(lines, concurrency=4))
    assert profile.inputTokens.bounds == [4, 32, 64, 128] and profile.inputTokens.counts == [1, 1, 1, 1]
    assert profile.outputTokens.bounds == [8] and profile.concurrency == 4
