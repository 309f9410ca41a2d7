"""Statistics of a comparison: mean and standard error over seeds, and paired differences.

Runs are paired by seed: the same seed gives every norm the same initialisation draw, data order
and augmentation, so the seed-to-seed noise they share cancels in the per-seed difference. The
paired interval is a Student t interval on those differences, and the p-value is the paired
(dependent-samples) t-test, i.e. `scipy.stats.ttest_rel`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
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
    the p-value is 1 when the difference is 0 and 0 otherwise (the limits of the t-test).
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
        return PairedDifference(n, mean, mean, mean, 1.0 if mean == 0.0 else 0.0, "no spread")
    half = float(sps.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    p_value = float(sps.ttest_rel(a, b).pvalue)
    return PairedDifference(n, mean, mean - half, mean + half, p_value)


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Student t interval of the mean (None with fewer than two values); used for plot error bars."""
    ms = mean_sem(values)
    if ms.sem is None or ms.mean is None:
        return None
    half = float(sps.t.ppf(0.5 + confidence / 2, ms.n - 1)) * ms.sem
    return ms.mean - half, ms.mean + half
