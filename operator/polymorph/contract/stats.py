"""Robust statistics for benchmark verdicts: medians, ratios with confidence intervals, better/worse calls.

Owns the arithmetic that turns repeated measurements into a claim that holds up: a median
with a distribution-free confidence interval, a paired A/B ratio (compile loop: interleaved
candidate/baseline passes in one engine), an unpaired ratio (rollout analysis: canary vs
stable samples), the verdict rule, the warm-up steady-state test and the adaptive-repeat
stopping test. It is pure stdlib (no numpy, no torch) and knows nothing about engines,
builds, workloads, Prometheus or Kubernetes: callers pass plain numbers (tok/s, latencies)
and get plain data back. A spread is never taken from the range (max - min) of passes.

Methods, and why
----------------
``median_ci``: the classic binomial order-statistic interval. For sorted ``x(1) <= ... <= x(n)``
the interval ``[x(l), x(n+1-l)]`` covers the population median with probability
``1 - 2 P(B <= l-1)``, ``B ~ Binomial(n, 1/2)``, for *any* continuous distribution. The
narrowest symmetric such interval whose coverage reaches ``confidence`` is returned, and
``Estimate.confidence`` is its exact coverage (>= the requested one). Below n = 6 no
interval reaches 95% (min..max covers with ``1 - 2**(1-n)``: 93.75% at n = 5); then the
widest interval, min..max, is returned and ``Estimate.confidence`` says what it really
covers (0.0 for n = 1, 0.5 for n = 2), so a caller can see that it asked for too much.

``paired_ratio``: per-pair log ratios ``d_i = log(candidate_i / baseline_i)``, summarised by
the 20%-trimmed mean with Yuen's (Tukey-McLaughlin) trimmed-t interval, then exponentiated.
- Pairing cancels anything common to the two passes of a pair (drift in clocks, thermal
  state, other tenants), because only the within-pair ratio is used.
- Trimming ``g = max(1, floor(0.2 n))`` values from each end (n >= 4) makes both the centre
  and the interval immune to up to g wild pairs per side: an outlier pass is *winsorized*
  (pulled in to the nearest kept value) in the variance, so it can neither move the centre
  nor blow up the spread. Its breakdown point is 20%, and never less than one pair from n = 4.
- The interval is ``centre +- t(df) * se`` with ``se**2 = (n-1) s_w**2 / (h (h-1))``,
  ``h = n - 2g`` kept values, ``df = h - 1`` and ``s_w`` the winsorized standard deviation
  (Yuen 1974; Wilcox, *Introduction to Robust Estimation*, section 4.4). Its coverage is near
  nominal for symmetric noise, light- or heavy-tailed, and stays close under mild skew; the
  t quantile with few degrees of freedom makes small n honest but wide (n = 4 keeps 2 values,
  df = 1; n = 5 keeps 3, df = 2). n = 2..3 cannot be trimmed: a plain t interval on the log
  ratios (not outlier-proof, nothing at that n is). n = 1 gives ``[0, inf)``: one pair says
  nothing about noise.
- Why not the alternatives: a sign-test or Wilcoxon (Hodges-Lehmann) interval cannot reach
  95% below n = 6, and at n = 6..11 its 95% bound is a Walsh average involving the most
  extreme pair, so one 3x-slow pass flips the verdict; a bootstrap of the median puts the outlier in
  the median of ~6% of resamples at n = 5 (so in the 2.5% tail), and undercovers at small n.
- The centre is the trimmed mean, not the median, so that the interval is centred on the
  estimator it is for; for n = 1, 2 and 4 the two coincide, and otherwise they differ only
  by the averaging of the kept middle values. The method is deterministic: ``seed`` is validated and
  otherwise unused, kept in the signature so that callers need not change with the method.

``ratio`` (unpaired): the ratio of medians with a seeded percentile bootstrap (each sample
resampled independently, ``resamples`` times). It makes no pairing assumption, so drift
inside either sample widens its interval instead of cancelling. For small samples (n < 10)
percentile intervals of medians undercover, and at n = 5 one outlier in the candidate lands
in the 2.5% tail; the compile loop should use ``paired_ratio``. Cost: O(resamples n log n).

``verdict``: see its docstring for the exact rule. A ratio is candidate / baseline throughout.
"""

from __future__ import annotations

import functools
import math
import numbers
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "Estimate",
    "Verdict",
    "median",
    "median_ci",
    "paired_ratio",
    "precise_enough",
    "ratio",
    "steady_state",
    "t_quantile",
    "verdict",
]

TRIM = 0.2
"""Fraction trimmed from each end of the paired log ratios (at least one value from n = 4)."""

_EPS = 1e-12  # tolerance when comparing an exact coverage with the requested confidence
_MAX_LOG = 709.0  # math.exp overflows just above 709.78


class Verdict(StrEnum):
    BETTER = "better"
    WORSE = "worse"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Estimate:
    """A location with a confidence interval ``lo <= value <= hi``.

    ``n`` is the number of observations behind it (pairs for a paired ratio, the smaller
    sample for an unpaired one). ``confidence`` is the coverage the interval is constructed
    to have: the nominal level for t and bootstrap intervals, the exact coverage for
    order-statistic intervals (which may be below the requested level for tiny n).
    """

    value: float
    lo: float
    hi: float
    n: int
    confidence: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError(f"An estimate's value must be finite, got {self.value}.")
        if math.isnan(self.lo) or math.isnan(self.hi) or not self.lo <= self.value <= self.hi:
            raise ValueError(f"An estimate needs lo <= value <= hi, got {self.lo}, {self.value}, {self.hi}.")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"An estimate's n must be a positive integer, got {self.n!r}.")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"An estimate's confidence must lie in [0, 1], got {self.confidence}.")

    @property
    def half_width(self) -> float:
        """The interval's half-width relative to the value: ``(hi - lo) / 2 / |value|``; inf if value is 0."""
        if self.value == 0:
            return math.inf
        return (self.hi - self.lo) / 2 / abs(self.value)

    def __str__(self) -> str:
        return f"{self.value:.4g} ±{self.half_width:.1%} (n={self.n})"


# ---------------------------------------------------------------------------------------
# Input validation: every public function checks its arguments and fails with one sentence.


def _sample(xs: Sequence[float], name: str, *, positive: bool = False) -> list[float]:
    if isinstance(xs, str | bytes):
        raise ValueError(f"{name} must be a sequence of numbers, got a string.")
    try:
        values = list(xs)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of numbers, got {type(xs).__name__}.") from None
    if not values:
        raise ValueError(f"{name} must hold at least one measurement, got an empty sequence.")
    out: list[float] = []
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise ValueError(f"{name}[{i}] must be a number, got {x!r}.")
        f = float(x)
        if not math.isfinite(f):
            raise ValueError(f"{name}[{i}] must be finite, got {f}.")
        if positive and f <= 0:
            raise ValueError(f"{name}[{i}] must be positive to take a ratio, got {f}.")
        out.append(f)
    return out


def _real(x: object, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be a finite number, got {x!r}.")
    return float(x)


def _confidence(confidence: object) -> float:
    c = _real(confidence, "confidence")
    if not 0.0 < c < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1 (such as 0.95), got {c}.")
    return c


def _integer(x: object, name: str, minimum: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}.")
    return x


def _exp(x: float) -> float:
    return math.inf if x > _MAX_LOG else math.exp(x)


# ---------------------------------------------------------------------------------------
# Student's t quantile (stdlib has only the normal distribution).


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Lentz's continued fraction for the incomplete beta function (Numerical Recipes, betacf)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (bisection on the exact CDF)."""
    return _t_quantile(_real(p, "p"), _real(df, "df"))


@functools.lru_cache(maxsize=4096)
def _t_quantile(p: float, df: float) -> float:
    """``t_quantile`` on checked floats, remembered: intervals ask for a few (p, df) over and over."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}.")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}.")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-13 * hi:
        mid = (lo + hi) / 2.0
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


# ---------------------------------------------------------------------------------------
# Locations and intervals.


def median(xs: Sequence[float]) -> float:
    """The sample median (the mean of the two middle values for even n)."""
    return statistics.median(_sample(xs, "xs"))


def _binomial_half_pmf(n: int, k: int) -> float:
    """P(B = k) for B ~ Binomial(n, 1/2), in log space so that large n neither overflows nor stalls."""
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0))


def _order_statistic_rank(n: int, confidence: float) -> tuple[int, float]:
    """The largest l with coverage of [x(l), x(n+1-l)] >= confidence, and that coverage (l = 1 if none)."""
    rank, tail = 1, _binomial_half_pmf(n, 0)
    coverage = max(0.0, 1.0 - 2.0 * tail)
    while rank + 1 <= (n + 1) // 2:
        next_tail = tail + _binomial_half_pmf(n, rank)
        next_coverage = 1.0 - 2.0 * next_tail
        if next_coverage < confidence - _EPS:
            break
        rank, tail, coverage = rank + 1, next_tail, next_coverage
    return rank, coverage


def median_ci(xs: Sequence[float], confidence: float = 0.95) -> Estimate:
    """The median with a distribution-free order-statistic interval (see the module docstring).

    When no order-statistic interval reaches ``confidence`` (n <= 5 at 95%), the widest one,
    min..max, is returned and its ``confidence`` field holds the coverage it actually has.
    """
    values = sorted(_sample(xs, "xs"))
    conf = _confidence(confidence)
    n = len(values)
    rank, coverage = _order_statistic_rank(n, conf)
    return Estimate(statistics.median(values), values[rank - 1], values[n - rank], n, coverage)


def _variance(xs: Sequence[float]) -> float:
    """The sample variance in floats, two-pass (``statistics.variance`` is exact, in fractions, and
    about 30x slower; a ranking computes it for every paired record, often)."""
    mean = math.fsum(xs) / len(xs)
    return math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


def _trimmed_t(xs: Sequence[float]) -> tuple[float, float, int]:
    """Yuen's trimmed mean of ``xs``, its standard error and degrees of freedom (n >= 2)."""
    n = len(xs)
    s = sorted(xs)
    g = max(1, math.floor(TRIM * n)) if n >= 4 else 0
    h = n - 2 * g
    kept = s[g : n - g]
    centre = math.fsum(kept) / h
    winsorized = [s[g]] * g + kept + [s[n - g - 1]] * g
    se = math.sqrt((n - 1) * _variance(winsorized) / (h * (h - 1)))
    return centre, se, h - 1


def paired_ratio(
    candidate: Sequence[float], baseline: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> Estimate:
    """candidate/baseline from paired passes (i-th with i-th), by a trimmed-t interval on log ratios.

    See the module docstring for the method, its guarantees and its behaviour for n < 4.
    """
    c = _sample(candidate, "candidate", positive=True)
    b = _sample(baseline, "baseline", positive=True)
    conf = _confidence(confidence)
    _integer(seed, "seed", 0)
    if len(c) != len(b):
        raise ValueError(
            f"candidate and baseline must have the same number of passes to pair them, got {len(c)} and {len(b)}."
        )
    logs = [math.log(x) - math.log(y) for x, y in zip(c, b, strict=True)]
    if len(logs) == 1:
        return Estimate(_exp(logs[0]), 0.0, math.inf, 1, conf)
    centre, se, df = _trimmed_t(logs)
    q = t_quantile(0.5 + conf / 2.0, df)
    return Estimate(_exp(centre), _exp(centre - q * se), _exp(centre + q * se), len(logs), conf)


def ratio(
    candidate: Sequence[float],
    baseline: Sequence[float],
    confidence: float = 0.95,
    seed: int = 0,
    resamples: int = 2000,
) -> Estimate:
    """median(candidate) / median(baseline), unpaired, with a seeded percentile-bootstrap interval.

    The interval is widened, if needed, to contain the point estimate. With fewer than two
    observations in either sample it is ``[0, inf)``: a single pass says nothing about noise.
    """
    c = _sample(candidate, "candidate", positive=True)
    b = _sample(baseline, "baseline", positive=True)
    conf = _confidence(confidence)
    rng = random.Random(_integer(seed, "seed", 0))
    draws = _integer(resamples, "resamples", 100)
    value = statistics.median(c) / statistics.median(b)
    n = min(len(c), len(b))
    if n < 2:
        return Estimate(value, 0.0, math.inf, n, conf)
    boot = sorted(
        statistics.median(rng.choices(c, k=len(c))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(draws)
    )
    alpha = 1.0 - conf
    lo_index = min(draws - 1, math.floor(alpha / 2.0 * draws))
    hi_index = max(0, math.ceil((1.0 - alpha / 2.0) * draws) - 1)
    return Estimate(value, min(boot[lo_index], value), max(boot[hi_index], value), n, conf)


# ---------------------------------------------------------------------------------------
# Decisions.


def verdict(est: Estimate, min_ratio: float, higher_is_better: bool = True) -> Verdict:
    """Judge a candidate/baseline ratio estimate against ``min_ratio`` (>= 1).

    The exact rule, with strict inequalities on the interval bounds:
    - higher_is_better (throughput): BETTER if ``lo > min_ratio``; else WORSE if ``hi < 1``.
    - lower is better (latency): BETTER if ``hi < 1 / min_ratio``; else WORSE if ``lo > 1``.
    - INCONCLUSIVE otherwise. With ``min_ratio >= 1`` BETTER and WORSE are disjoint; a
      candidate that is faster but not by ``min_ratio`` beyond noise is INCONCLUSIVE, as is
      one whose interval straddles 1.
    """
    if not isinstance(est, Estimate):
        raise ValueError(f"est must be an Estimate, got {type(est).__name__}.")
    floor = _real(min_ratio, "min_ratio")
    if floor < 1.0:
        raise ValueError(f"min_ratio must be >= 1 (the smallest ratio that counts as a win), got {floor}.")
    if higher_is_better:
        if est.lo > floor:
            return Verdict.BETTER
        if est.hi < 1.0:
            return Verdict.WORSE
    else:
        if est.hi < 1.0 / floor:
            return Verdict.BETTER
        if est.lo > 1.0:
            return Verdict.WORSE
    return Verdict.INCONCLUSIVE


def steady_state(passes: Sequence[float], tolerance: float) -> bool:
    """True when the last two passes agree within ``tolerance``: ``|a - b| <= tolerance * max(a, b)``.

    Passes must be positive (throughputs or latencies). A single pass is not yet steady.
    """
    xs = _sample(passes, "passes", positive=True)
    tol = _real(tolerance, "tolerance")
    if tol < 0:
        raise ValueError(f"tolerance must be >= 0 (a relative difference such as 0.05), got {tol}.")
    if len(xs) < 2:
        return False
    a, b = xs[-2], xs[-1]
    return abs(a - b) <= tol * max(a, b)


def precise_enough(est: Estimate, target_half_width: float) -> bool:
    """True when the estimate's relative half-width is at most ``target_half_width`` (such as 0.02).

    The comparison forgives float rounding (a relative 1e-9), so an interval of exactly ±2% meets 0.02.
    """
    if not isinstance(est, Estimate):
        raise ValueError(f"est must be an Estimate, got {type(est).__name__}.")
    target = _real(target_half_width, "target_half_width")
    if target <= 0:
        raise ValueError(f"target_half_width must be positive (such as 0.02 for ±2%), got {target}.")
    return est.half_width <= target * (1.0 + 1e-9)
