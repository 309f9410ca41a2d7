"""Statistics on known numbers: a hand computation and scipy.stats.ttest_rel agree with stats.py."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sps

from normkit_lab.stats import N_TOO_SMALL, mean_sem, paired_difference, t_interval

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
    assert shifted.p_value == 0.0 and shifted.note == "no spread"


def test_unequal_lengths_refused():
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0, 2.0], [1.0])


def test_t_interval_matches_scipy():
    values = [1.0, 2.0, 4.0, 7.0]
    low, high = t_interval(values)
    ref = sps.t.interval(0.95, df=3, loc=3.5, scale=sps.sem(values))
    assert (low, high) == (pytest.approx(ref[0]), pytest.approx(ref[1]))
    assert t_interval([1.0]) is None
