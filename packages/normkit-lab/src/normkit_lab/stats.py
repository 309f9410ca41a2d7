"""Statistics of a comparison: mean and standard error over seeds, paired differences, and the
tools of a verdict (Holm adjustment, two one-sided tests, minimum detectable effect, seeds needed).

Runs are paired by seed: the same seed gives every norm the same initialisation draw, data order
and augmentation, so the seed-to-seed noise they share cancels in the per-seed difference. The
paired interval is a Student t interval on those differences, and the p-value is the paired
(dependent-samples) t-test, i.e. `scipy.stats.ttest_rel`. When every seed gives the same difference
(zero spread) the t-test is undefined (it would say p = 0); the exact sign test takes its place: n
identical non-zero differences have two-sided p = 2 * 0.5^n. Planning numbers (MDE, seeds needed)
take the significance level they are used at (the verdicts pass alpha / m, see verdicts.py).
Everything here is plain scipy; the tests check it against statsmodels.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import integrate, optimize, special
from scipy import stats as sps

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8
N_TOO_SMALL = "n too small"


@dataclass(frozen=True)
class MeanSem:
    """Mean and standard error of the mean; `sem` is None with fewer than two values."""

    n: int
    mean: float | None
    sem: float | None


@dataclass(frozen=True)
class PairedDifference:
    """Mean of per-seed differences (norm - baseline) with a t interval and paired t-test p-value.

    `low`, `high` and `p_value` are None (and `note` says why) when fewer than two pairs exist.
    """

    n: int
    mean: float | None
    low: float | None
    high: float | None
    p_value: float | None
    note: str = ""
    sd: float | None = None  # sample standard deviation of the differences


def mean_sem(values: Sequence[float]) -> MeanSem:
    """Mean and s.e. (sample standard deviation / sqrt(n)) of finite values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return MeanSem(0, None, None)
    mean = float(x.mean())
    if x.size < 2:
        return MeanSem(1, mean, None)
    return MeanSem(int(x.size), mean, float(x.std(ddof=1) / math.sqrt(x.size)))


def paired_difference(values: Sequence[float], baseline: Sequence[float],
                      confidence: float = CONFIDENCE) -> PairedDifference:
    """Paired comparison of `values` against `baseline` (same length, element i = seed i).

    With identical differences on every seed (zero spread) the interval is that single value and
    the p-value is the exact sign test's (1 when the difference is 0, else 2 * 0.5^n; never 0).
    """
    a = np.asarray(values, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length ({a.size} vs {b.size})")
    d = a - b
    n = int(d.size)
    if n == 0:
        return PairedDifference(0, None, None, None, None, "no paired seeds")
    mean = float(d.mean())
    if n < 2:
        return PairedDifference(n, mean, None, None, None, N_TOO_SMALL)
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return PairedDifference(n, mean, mean, mean, sign_test_p(d), "no spread", 0.0)
    half = float(sps.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return PairedDifference(n, mean, mean - half, mean + half, paired_p(d), sd=sd)


def sign_test_p(differences: Sequence[float]) -> float:
    """Exact two-sided sign test of median 0 (zero differences dropped; 1.0 when none are left)."""
    d = np.asarray(differences, dtype=np.float64)
    positive, nonzero = int((d > 0).sum()), int((d != 0).sum())
    return 1.0 if nonzero == 0 else float(sps.binomtest(positive, nonzero, 0.5).pvalue)


def paired_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of mean difference 0: the paired t-test, or the exact sign test with zero spread.

    None with fewer than two differences. Near-identical differences make scipy warn about
    precision loss; the warning is silenced here because the result is still the t-test's.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2:
        return None
    if float(d.std(ddof=1)) == 0.0:
        return sign_test_p(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(sps.ttest_1samp(d, 0.0).pvalue)


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Student t interval of the mean (None with fewer than two values); used for plot error bars."""
    ms = mean_sem(values)
    if ms.sem is None or ms.mean is None:
        return None
    half = float(sps.t.ppf(0.5 + confidence / 2, ms.n - 1)) * ms.sem
    return ms.mean - half, ms.mean + half


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm step-down adjusted p-values (None stays None and is not counted in the family).

    With k p-values sorted ascending, the i-th (0-based) is multiplied by k - i, then made
    non-decreasing (running maximum) and capped at 1: `multipletests(method="holm")`.
    """
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    k = len(present)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (k - rank) * p))
        out[i] = running
    return out


def tost_p(differences: Sequence[float], margin: float) -> float | None:
    """Two one-sided tests of |mean difference| < margin: the larger of the two one-sided p-values.

    p < alpha means the (1 - 2 alpha) t interval of the mean lies inside (-margin, margin), i.e.
    the difference is shown to be smaller than the margin. None with fewer than two values.
    With zero spread each one-sided test is an exact sign test: n differences all inside the
    margin give p = 0.5^n (never 0).
    """
    d = np.asarray(differences, dtype=np.float64)
    n = int(d.size)
    if n < 2:
        return None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return 0.5 ** n if abs(mean) < margin else 1.0
    se = sd / math.sqrt(n)
    p_above_lower = float(sps.t.sf((mean + margin) / se, n - 1))  # H0: mean <= -margin
    p_below_upper = float(sps.t.cdf((mean - margin) / se, n - 1))  # H0: mean >= +margin
    return max(p_above_lower, p_below_upper)


def power(effect_size: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample (paired) t-test at standardized effect `effect_size`."""
    df = n - 1
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    nc = abs(effect_size) * math.sqrt(n)
    with warnings.catch_warnings():  # scipy warns (and gives NaN) where the far tail is ~1e-300
        warnings.simplefilter("ignore", RuntimeWarning)
        far_tail = float(sps.nct.cdf(-crit, df, nc))
        near = float(sps.nct.sf(crit, df, nc))
    return near + (0.0 if math.isnan(far_tail) else far_tail)


@functools.lru_cache(maxsize=4096)
def detectable_effect_size(n: int, alpha: float = ALPHA, target: float = POWER) -> float | None:
    """The standardized effect (mean / sd of the differences) detected with power `target` by n pairs."""
    if n < 2:
        return None
    high = 1.0
    while power(high, n, alpha) < target:
        high *= 2.0
    return float(optimize.brentq(_power_gap, 0.0, high, args=(n, alpha, target), xtol=1e-12))


def _power_gap(effect_size: float, n: int, alpha: float, target: float) -> float:
    return power(effect_size, n, alpha) - target


def minimum_detectable_effect(sd: float | None, n: int, alpha: float = ALPHA,
                              target: float = POWER) -> float | None:
    """The smallest true mean difference (in the metric's unit) found significant with 80% power,
    for n pairs whose differences have standard deviation `sd`. None with fewer than two pairs, and
    None with zero spread (sd 0 says nothing about the true spread: the MDE is unknown, not 0)."""
    es = detectable_effect_size(n, alpha, target)
    return None if es is None or sd is None or sd == 0.0 else es * sd


def seeds_needed(sd: float | None, margin: float, cap: int = 1000, alpha: float = ALPHA,
                 target: float = POWER) -> int | None:
    """The fewest pairs (at least 3) whose minimum detectable effect is at most `margin`, given the
    observed `sd` of the differences; None when even `cap` pairs are not enough (or sd unknown or 0)."""
    if sd is None or sd == 0.0 or margin <= 0:
        return None
    def fits(n: int) -> bool:
        return sd * detectable_effect_size(n, alpha, target) <= margin  # type: ignore[operator]

    if fits(3):
        return 3
    if not fits(cap):
        return None
    low, high = 3, cap  # fits(low) is False, fits(high) is True; the MDE falls as n grows
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


def tost_power(sd: float, n: int, margin: float, true_difference: float = 0.0, alpha: float = ALPHA) -> float:
    """Power of the paired TOST (|mean| < margin at level alpha) for n pairs with difference sd `sd`.

    Exact for normal differences: the mean and the sample sd are independent, so the power is the
    probability of the rejection region for the mean (a normal cdf difference), integrated over the
    chi-square law of the sample variance (on its quantile scale, so the peak is never missed). The
    region is empty once t * s / sqrt(n) >= margin.
    """
    if n < 2 or sd <= 0 or margin <= 0:
        return 0.0
    df = n - 1
    crit = float(sps.t.ppf(1 - alpha, df))
    se = sd / math.sqrt(n)

    def rejected_at(u: float) -> float:  # u: the chi-square(df) quantile of (n - 1) s^2 / sd^2
        # scipy.special's functions behind sps.chi2.ppf and sps.norm.cdf, called directly: the same
        # values without the distribution objects' argument checks (quad calls this ~400 times)
        half = crit * sd * math.sqrt(2.0 * special.gammaincinv(df / 2, u) / df) / math.sqrt(n)
        inside = special.ndtr((margin - half - true_difference) / se) - special.ndtr(
            (-margin + half - true_difference) / se)
        return max(0.0, float(inside))

    top = df * (margin * math.sqrt(n) / (crit * sd)) ** 2  # beyond it the interval is wider than 2 margins
    value, _ = integrate.quad(rejected_at, 0.0, float(special.chdtr(df, top)), limit=200, epsabs=1e-10)
    return min(1.0, max(0.0, float(value)))


def seeds_for_equivalence(sd: float | None, margin: float, cap: int = 1000, alpha: float = ALPHA,
                          target: float = POWER) -> int | None:
    """The fewest pairs (at least 3) whose TOST shows |difference| < margin with power `target` when
    the true difference is 0, given the observed `sd`; None when `cap` is not enough (or sd unknown or 0).

    Showing equivalence needs more seeds than detecting a difference of the margin: at a true
    difference of 0 both one-sided tests must reject.
    """
    if sd is None or sd == 0.0 or margin <= 0:
        return None

    def fits(n: int) -> bool:
        return tost_power(sd, n, margin, 0.0, alpha) >= target

    if fits(3):
        return 3
    if not fits(cap):
        return None
    low, high = 3, cap  # power grows with n
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high
