"""Analysis verdicts: values beside thresholds, noDataPolicy, builtin canary/stable ratios through stats."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from polymorph.contract.api import AnalysisSpec
from polymorph.contract.api.modeldeployment import AnalysisMetric, ThresholdRange
from polymorph.core.analysis import builtin_estimate, judge, run_analysis
from polymorph.core.promql import TrackSamples

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def spec(*metrics: AnalysisMetric, policy: str = "Inconclusive") -> AnalysisSpec:
    return AnalysisSpec(metrics=list(metrics), noDataPolicy=policy)  # type: ignore[arg-type]


THROUGHPUT = AnalysisMetric(
    name="throughput", builtin="outputTokensPerSecondRatio", thresholdRange=ThresholdRange(min=0.98)
)
ITL = AnalysisMetric(
    name="itl-p95", builtin="interTokenLatencyP95Ratio", thresholdRange=ThresholdRange(max=1.1)
)
TTFT = AnalysisMetric(
    name="ttft-p95", builtin="timeToFirstTokenP95Ratio", thresholdRange=ThresholdRange(max=1.2)
)
ERRORS = AnalysisMetric(name="errors", builtin="errorRate", thresholdRange=ThresholdRange(max=0.01))
CUSTOM = AnalysisMetric(name="custom", query="sum(x)", thresholdRange=ThresholdRange(min=0, max=5))


def tracks(canary_itl: list[float], stable_itl: list[float], errors: float = 0.0) -> dict[str, TrackSamples]:
    return {
        "canary": TrackSamples(itl_mean_s=canary_itl, itl_p95_s=[x * 2 for x in canary_itl],
                               ttft_p95_s=[0.1] * len(canary_itl), requests=100, errors=errors),
        "stable": TrackSamples(itl_mean_s=stable_itl, itl_p95_s=[x * 2 for x in stable_itl],
                               ttft_p95_s=[0.1] * len(stable_itl), requests=300),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("value", "lo", "hi", "threshold", "expected"),
    [
        (1.0, 0.9, 1.1, ThresholdRange(min=0.98), "Pass"),
        (0.98, None, None, ThresholdRange(min=0.98), "Pass"),  # bounds are included
        (0.97, None, None, ThresholdRange(min=0.98), "Fail"),  # no interval: the value decides
        (0.90, 0.85, 0.95, ThresholdRange(min=0.98), "Fail"),  # violation beyond noise
        (0.95, 0.90, 1.02, ThresholdRange(min=0.98), "Inconclusive"),  # within noise of the bound
        (1.3, 1.2, 1.4, ThresholdRange(max=1.1), "Fail"),
        (1.15, 1.05, 1.3, ThresholdRange(max=1.1), "Inconclusive"),
        (3.0, None, None, ThresholdRange(min=0, max=5), "Pass"),
        (6.0, None, None, ThresholdRange(min=0, max=5), "Fail"),
    ],
)
def test_judge_table(
    value: float, lo: float | None, hi: float | None, threshold: ThresholdRange, expected: str
) -> None:
    assert judge(value, lo, hi, threshold) == expected


def test_throughput_is_per_request_decode_speed() -> None:
    # canary decodes each request twice as fast (half the inter-token latency): ratio 2.
    est, value, n = builtin_estimate(
        "outputTokensPerSecondRatio", *tracks([0.01, 0.01], [0.02, 0.02]).values()
    )
    assert value == pytest.approx(2.0)
    assert est is not None and est.n == 2 and n == (2, 2)


def test_error_rate_is_the_canarys_share() -> None:
    _, value, _ = builtin_estimate("errorRate", *tracks([0.01], [0.01], errors=5).values())
    assert value == pytest.approx(0.05)


def test_faster_canary_passes_every_builtin() -> None:
    run = run_analysis(spec(THROUGHPUT, ITL, TTFT, ERRORS), tracks([0.010, 0.0101], [0.012, 0.0121]), {}, NOW)
    assert run.verdict == "Pass", run.describe()
    assert [m.verdict for m in run.metrics] == ["Pass"] * 4
    assert run.metrics[0].value == pytest.approx(1.2, rel=0.01)


def test_slower_canary_fails_with_values_beside_thresholds() -> None:
    run = run_analysis(spec(THROUGHPUT, ITL), tracks([0.020, 0.0201], [0.010, 0.0101]), {}, NOW)
    assert run.verdict == "Fail"
    text = run.describe()
    assert text.startswith("throughput 0.5") and "(min 0.98): Fail" in text
    value = run.metrics[0].status(NOW)
    assert (
        value.min == 0.98
        and value.max is None
        and value.verdict == "Fail"
        and value.value == pytest.approx(0.5, rel=0.01)
    )
    # The interval and the pods behind it sit beside the value, as the verdict used them.
    assert value.lo is not None and value.hi is not None and value.lo <= value.value <= value.hi < 0.98
    assert value.samples is not None and (value.samples.canary, value.samples.stable) == (2, 2)


def test_custom_query_status_has_no_interval_or_samples() -> None:
    run = run_analysis(spec(CUSTOM), None, {"custom": 3.0}, NOW)
    value = run.metrics[0].status(NOW)
    assert value.value == 3.0 and value.lo is None and value.hi is None and value.samples is None


@pytest.mark.parametrize(
    ("policy", "expected"), [("Inconclusive", "Inconclusive"), ("Pass", "Pass"), ("Fail", "Fail")]
)
def test_no_data_policy(policy: str, expected: str) -> None:
    run = run_analysis(spec(THROUGHPUT, CUSTOM, policy=policy), None, {"custom": None}, NOW)
    assert run.verdict == expected
    assert all(m.no_data and m.value is None for m in run.metrics)
    assert "throughput no data (min 0.98)" in run.describe()


def test_missing_stable_track_is_no_data() -> None:
    only_canary = {"canary": tracks([0.01], [0.01])["canary"]}
    run = run_analysis(spec(THROUGHPUT), only_canary, {}, NOW)
    assert run.metrics[0].no_data and run.verdict == "Inconclusive"


def test_custom_query_value_and_one_failure_fails_the_run() -> None:
    run = run_analysis(spec(THROUGHPUT, CUSTOM), tracks([0.01, 0.01], [0.01, 0.01]), {"custom": 7.0}, NOW)
    assert [m.verdict for m in run.metrics] == ["Pass", "Fail"]
    assert run.verdict == "Fail"


def test_no_metrics_passes() -> None:
    assert run_analysis(spec(), None, {}, NOW).verdict == "Pass"
