"""Statistics on known numbers: hand computations, scipy and statsmodels agree with stats.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from normkit_lab.stats import (
    N_TOO_SMALL,
    detectable_effect_size,
    holm,
    mean_sem,
    minimum_detectable_effect,
    paired_difference,
    power,
    seeds_needed,
    t_interval,
    tost_p,
)

A = [0.90, 0.85, 0.88]
B = [0.80, 0.82, 0.87]


def test_mean_sem_by_hand():
    ms = mean_sem([1.0, 2.0, 3.0, 4.0])
    assert ms.n == 4
    assert ms.mean == pytest.approx(2.5)
    # sample sd = sqrt(5/3) = 1.2909944; s.e. = sd / 2
    assert ms.sem == pytest.approx(math.sqrt(5 / 3) / 2)


def test_mean_sem_one_and_none():
    assert mean_sem([0.7]) == mean_sem([0.7]).__class__(1, 0.7, None)
    assert mean_sem([]).mean is None and mean_sem([]).sem is None


def test_paired_difference_by_hand():
    d = paired_difference(A, B)
    # differences 0.10, 0.03, 0.01: mean 0.046667, sd 0.047258, s.e. 0.027285,
    # t(0.975, df=2) = 4.302653, half width 0.117396, t = 1.710372, two-sided p = 0.229325
    assert d.n == 3
    assert d.mean == pytest.approx(0.14 / 3)
    assert d.low == pytest.approx(0.14 / 3 - 0.117396, abs=1e-6)
    assert d.high == pytest.approx(0.14 / 3 + 0.117396, abs=1e-6)
    assert d.p_value == pytest.approx(0.229325, abs=1e-6)
    assert d.note == ""


def test_paired_difference_matches_scipy_ttest_rel():
    a = [71.2, 74.9, 69.8, 73.3, 72.0, 75.1]
    b = [70.1, 73.2, 70.0, 71.9, 70.4, 73.0]
    ref = sps.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    d = paired_difference(a, b)
    assert d.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    assert (d.low, d.high) == (pytest.approx(ci.low, rel=1e-12), pytest.approx(ci.high, rel=1e-12))


def test_one_pair_says_n_too_small_and_gives_no_interval():
    d = paired_difference([0.9], [0.8])
    assert d.n == 1 and d.mean == pytest.approx(0.1)
    assert d.low is None and d.high is None and d.p_value is None
    assert d.note == N_TOO_SMALL


def test_no_pairs():
    d = paired_difference([], [])
    assert d.n == 0 and d.mean is None and d.note == "no paired seeds"


def test_zero_spread_is_finite():
    same = paired_difference([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert (same.mean, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    shifted = paired_difference([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])  # exact binary fractions
    assert (shifted.mean, shifted.low, shifted.high) == (0.5, 0.5, 0.5)
    # the exact sign test, not the t-test's limit p = 0: 3 of 3 positive gives 2 * 0.5^3
    assert shifted.p_value == pytest.approx(0.25) and shifted.note == "no spread"


def test_unequal_lengths_refused():
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0, 2.0], [1.0])


def test_t_interval_matches_scipy():
    values = [1.0, 2.0, 4.0, 7.0]
    low, high = t_interval(values)
    ref = sps.t.interval(0.95, df=3, loc=3.5, scale=sps.sem(values))
    assert (low, high) == (pytest.approx(ref[0]), pytest.approx(ref[1]))
    assert t_interval([1.0]) is None


# -- Holm, TOST, power: against statsmodels where it is installed, and against hand-computed values.

P_VALUES = [0.01, 0.04, 0.03, 0.20, 0.005]


def test_holm_by_hand():
    # sorted: 0.005 x5 = 0.025, 0.01 x4 = 0.04, 0.03 x3 = 0.09, 0.04 x2 = 0.08 -> 0.09 (monotone), 0.2 x1 = 0.2
    assert holm(P_VALUES) == pytest.approx([0.04, 0.09, 0.09, 0.20, 0.025])
    assert holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02, None, 0.04]) == [pytest.approx(0.04), None, pytest.approx(0.04)]  # None not counted
    assert holm([]) == []


def test_holm_matches_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 7):
        p = list(rng.uniform(0, 0.2, size=k))
        assert holm(p) == pytest.approx(list(multitest.multipletests(p, method="holm")[1]), rel=1e-12)


DIFFS = [0.31, -0.12, 0.22, 0.05, 0.40, -0.02]


@pytest.mark.parametrize("margin", [0.1, 0.3, 0.5, 2.0])
def test_tost_is_the_larger_of_two_one_sided_ttests(margin):
    lower = sps.ttest_1samp(DIFFS, -margin, alternative="greater").pvalue
    upper = sps.ttest_1samp(DIFFS, margin, alternative="less").pvalue
    assert tost_p(DIFFS, margin) == pytest.approx(max(lower, upper), rel=1e-10)


def test_tost_agrees_with_the_90_percent_interval():
    low, high = sps.ttest_1samp(DIFFS, 0.0).confidence_interval(0.90)
    inside = max(abs(low), abs(high))
    assert tost_p(DIFFS, inside + 1e-6) < 0.05 < tost_p(DIFFS, inside - 1e-6)


def test_tost_limits():
    assert tost_p([0.1], 0.5) is None
    # zero spread: each one-sided test is an exact sign test, 3 of 3 inside gives 0.5^3 (never 0)
    assert tost_p([0.25, 0.25, 0.25], 0.5) == 0.125 and tost_p([0.75, 0.75, 0.75], 0.5) == 1.0


def _noncentral_t_power(es: float, n: int) -> float:
    """Power of the two-sided one-sample t-test from scipy's noncentral t (the textbook formula)."""
    crit = sps.t.ppf(0.975, n - 1)
    far_tail = sps.nct.cdf(-crit, n - 1, es * math.sqrt(n))  # NaN from scipy where it is ~0
    return sps.nct.sf(crit, n - 1, es * math.sqrt(n)) + np.nan_to_num(far_tail)


@pytest.mark.parametrize("n", [2, 3, 5, 10, 30])
def test_detectable_effect_has_80_percent_power(n):
    es = detectable_effect_size(n)
    assert _noncentral_t_power(es, n) == pytest.approx(0.8, abs=1e-9)
    assert minimum_detectable_effect(2.0, n) == pytest.approx(2.0 * es)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_detectable_effect_matches_statsmodels(n):
    power_mod = pytest.importorskip("statsmodels.stats.power")
    ref = power_mod.TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8,
                                             alternative="two-sided")
    assert detectable_effect_size(n) == pytest.approx(ref, rel=1e-6)
    assert power(0.7, n) == pytest.approx(power_mod.TTestPower().power(0.7, n, 0.05), rel=1e-9)


def test_known_detectable_effect_sizes():
    # Cohen's tables for the two-sided one-sample t at alpha 0.05, power 0.8: n=10 -> d = 0.996
    assert detectable_effect_size(10) == pytest.approx(0.996, abs=1e-3)
    assert detectable_effect_size(1) is None and minimum_detectable_effect(None, 5) is None


def test_seeds_needed():
    # effect 0.5 sd: statsmodels gives nobs = 33.37, so 34 seeds; scipy alone gives the same bracket
    assert seeds_needed(1.0, 0.5) == 34
    assert minimum_detectable_effect(1.0, 34) <= 0.5 < minimum_detectable_effect(1.0, 33)
    assert seeds_needed(0.01, 0.5) == 3  # the minimum for a verdict
    assert seeds_needed(0.0, 0.5) is None  # zero spread says nothing about the true spread
    assert minimum_detectable_effect(0.0, 5) is None  # unknown, never 0
    assert seeds_needed(100.0, 0.5) is None  # more than the cap
    assert seeds_needed(None, 0.5) is None


def test_seeds_needed_matches_statsmodels():
    power_mod = pytest.importorskip("statsmodels.stats.power")
    nobs = power_mod.TTestPower().solve_power(effect_size=0.8, nobs=None, alpha=0.05, power=0.8)
    assert seeds_needed(1.0, 0.8) == math.ceil(nobs)


def test_paired_difference_reports_sd():
    assert paired_difference(A, B).sd == pytest.approx(float(np.std(np.subtract(A, B), ddof=1)))
