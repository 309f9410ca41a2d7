"""Planning numbers at the decision rule, checked against independent computations.

MDE and seeds-to-detect: statsmodels' TTestPower at the Bonferroni level alpha / m (the strictest
Holm step). TOST power and seeds-to-show-equivalence: a direct simulation of normal differences.
Zero spread: the exact sign test, never p = 0 or an MDE of 0. Labels inside the margin.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as sps
from statsmodels.stats.power import TTestPower

from normkit_lab.analysis.verdicts import WITHIN_MARGIN, WORSE, decide, reading
from normkit_lab.stats import paired_p, seeds_for_equivalence, tost_power

NOISY = [2.0, -3.0, 1.5, -2.5, 3.0]
OTHER = [0.4, -0.9, 1.1, 0.2, -0.3]
THIRD = [1.0, 0.1, -0.6, 0.8, 0.3]


def test_mde_and_seeds_needed_equal_statsmodels_at_the_bonferroni_level():
    verdicts = decide([NOISY, OTHER, THIRD], margin=0.5)
    level = 0.05 / 3
    solver = TTestPower()
    for d, v in zip((NOISY, OTHER, THIRD), verdicts, strict=True):
        sd = float(np.std(d, ddof=1))
        assert v.planning_alpha == pytest.approx(level)
        effect = solver.solve_power(effect_size=None, nobs=5, alpha=level, power=0.8, alternative="two-sided")
        assert v.mde == pytest.approx(effect * sd, rel=1e-4)
        # the fewest n (>= 3) with power >= 0.8 at effect margin / sd, by statsmodels
        n_ref = next(n for n in range(3, 2000)
                     if solver.power(effect_size=0.5 / sd, nobs=n, alpha=level, alternative="two-sided") >= 0.8)
        assert v.seeds_needed == n_ref


def _simulated_tost_power(sd: float, n: int, margin: float, true: float, alpha: float, rng) -> float:
    x = rng.normal(true, sd, size=(200_000, n))
    mean, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    crit = sps.t.ppf(1 - alpha, n - 1)
    return float(((mean - crit * se > -margin) & (mean + crit * se < margin)).mean())


@pytest.mark.parametrize(("n", "true"), [(24, 0.0), (24, -0.25), (10, 0.1)])
def test_tost_power_equals_a_simulation(n, true):
    rng = np.random.default_rng(n)
    simulated = _simulated_tost_power(1.0, n, 0.5, true, 0.05, rng)
    assert tost_power(1.0, n, 0.5, true, 0.05) == pytest.approx(simulated, abs=0.005)  # 200k draws: se < 0.0012


def _tost_power_on_the_variance_scale(sd: float, n: int, margin: float, true: float, alpha: float) -> float:
    """The same power written another way: over the chi-square variable itself, with scipy.stats'
    distribution objects, in 50 pieces each integrated to 1e-12 (slow, so only a reference)."""
    df, se = n - 1, sd / math.sqrt(n)
    crit = sps.t.ppf(1 - alpha, df)
    top = df * (margin * math.sqrt(n) / (crit * sd)) ** 2

    def density(x: float) -> float:
        half = crit * sd * math.sqrt(x / df) / math.sqrt(n)
        inside = sps.norm.cdf((margin - half - true) / se) - sps.norm.cdf((-margin + half - true) / se)
        return max(0.0, inside) * sps.chi2.pdf(x, df)

    edges = np.linspace(0.0, top, 51)
    return sum(integrate.quad(density, a, b, epsabs=1e-13, epsrel=1e-12, limit=500)[0]
               for a, b in itertools.pairwise(edges))


@pytest.mark.parametrize(("sd", "n", "margin", "true", "alpha"), [
    (1.0, 2, 2.0, 0.0, 0.05), (0.3, 4, 2.0, 0.3, 0.0125), (1.0, 10, 2.0, 0.0, 0.0125),
    (1.0, 24, 0.5, -0.25, 0.05), (3.0, 50, 1.0, 0.3, 0.025), (10.0, 300, 1.0, 0.0, 0.05)])
def test_tost_power_equals_the_integral_on_the_variance_scale(sd, n, margin, true, alpha):
    reference = _tost_power_on_the_variance_scale(sd, n, margin, true, alpha)
    assert tost_power(sd, n, margin, true, alpha) == pytest.approx(reference, abs=1e-9)


def test_seeds_for_equivalence_is_more_than_to_detect_and_reaches_80_percent():
    verdicts = decide([NOISY, OTHER], margin=0.5)
    v = verdicts[1]
    sd = float(np.std(OTHER, ddof=1))
    n = v.seeds_equivalence
    assert n == seeds_for_equivalence(sd, 0.5, alpha=0.025) and n > v.seeds_needed
    rng = np.random.default_rng(1)
    assert _simulated_tost_power(sd, n, 0.5, 0.0, 0.025, rng) >= 0.79
    assert _simulated_tost_power(sd, n - 1, 0.5, 0.0, 0.025, rng) < 0.81


def test_zero_spread_uses_the_exact_sign_test():
    (v,) = decide([[0.5] * 6], margin=1.0)
    assert v.p == pytest.approx(sps.binomtest(6, 6).pvalue) == pytest.approx(2 * 0.5 ** 6)
    assert v.mde is None and v.seeds_needed is None and "no spread" in v.seeds_note
    (few,) = decide([[0.5] * 3], margin=1.0)
    assert few.p == pytest.approx(0.25) and few.verdict != WORSE


def test_worse_within_margin_when_the_interval_lies_inside():
    d = [-0.33, -0.49 + 0.15, -0.2, -0.4, -0.3, -0.28, -0.36]  # all inside (-0.5, 0.5), clearly < 0
    (v,) = decide([d], margin=0.5)
    assert v.verdict == WORSE + WITHIN_MARGIN and -0.5 < v.low < v.high < 0
    assert "inside the margin" in reading(v, "bnn", "bn", "test accuracy", "%", (v.low, v.high))
    (beyond,) = decide([[x - 1.0 for x in d]], margin=0.5)
    assert beyond.verdict == WORSE


def test_no_library_warnings_on_near_identical_differences():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paired_p([1.0, 1.0 + 1e-15, 1.0])
        decide([[1.0, 1.0 + 1e-15, 1.0, 1.0]], margin=0.5)
