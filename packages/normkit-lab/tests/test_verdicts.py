"""Verdicts: the decision rule, Holm over the run's comparisons, TOST with the margin, MDE, n < 3."""

from __future__ import annotations

import pytest
from scipy import stats as sps

from normkit_lab.analysis.verdicts import BETTER, EQUIVALENT, INCONCLUSIVE, NO_VERDICT, WORSE, decide, reading
from normkit_lab.stats import holm, minimum_detectable_effect

CLEAR_GAIN = [1.9, 2.1, 2.0, 2.2, 1.8]  # mean 2.0, sd 0.16
TINY = [0.05, -0.04, 0.02, -0.01, 0.03]  # mean 0.01, sd 0.036: inside a 0.5 margin
NOISY = [2.0, -3.0, 1.5, -2.5, 3.0]  # mean 0.2, sd 2.7


def test_each_verdict():
    better, worse, equivalent, inconclusive = decide(
        [CLEAR_GAIN, [-v for v in CLEAR_GAIN], TINY, NOISY], margin=0.5)
    assert [v.verdict for v in (better, worse, equivalent, inconclusive)] == [BETTER, WORSE, EQUIVALENT,
                                                                             INCONCLUSIVE]
    # planning numbers at the strictest Holm step: 4 comparisons -> alpha / 4
    assert inconclusive.planning_alpha == pytest.approx(0.05 / 4)
    assert inconclusive.mde == pytest.approx(minimum_detectable_effect(sps.tstd(NOISY), 5, alpha=0.05 / 4))
    assert inconclusive.seeds_needed is not None and inconclusive.seeds_needed > 5


def test_fewer_than_three_pairs_get_no_verdict_and_leave_the_family():
    few, one = decide([[2.0, 2.1], CLEAR_GAIN], margin=0.5)
    assert few.verdict == NO_VERDICT and few.p_holm is None and few.p is not None
    assert one.p_holm == pytest.approx(one.p)  # a family of one: no adjustment
    assert decide([[]], margin=0.5)[0].verdict == NO_VERDICT


def test_holm_over_every_comparison_can_remove_a_difference():
    # alone, p = 0.034 (< 0.05); beside a second comparison Holm doubles the smaller p
    d = [0.9, 0.1, 0.6, 1.2, -0.1, 0.8]
    (alone,) = decide([d], margin=0.1)
    assert alone.p == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue) and alone.p < 0.05
    assert alone.verdict == BETTER
    first, _ = decide([d, NOISY], margin=0.1)
    assert first.p_holm == pytest.approx(holm([alone.p, sps.ttest_1samp(NOISY, 0.0).pvalue])[0])
    assert first.p_holm > 0.05 and first.verdict == INCONCLUSIVE


def test_equivalence_is_holm_adjusted_too():
    (alone,) = decide([TINY], margin=0.08)
    assert alone.verdict == EQUIVALENT and alone.p_tost_holm == alone.p_tost
    tiny_again = [v * 1.4 for v in TINY]
    both = decide([TINY, tiny_again], margin=0.08)
    assert both[0].p_tost_holm == pytest.approx(holm([both[0].p_tost, both[1].p_tost])[0])


def test_single_comparison_equivalence_is_the_90_percent_interval_inside_the_margin():
    low, high = sps.ttest_1samp(TINY, 0.0).confidence_interval(0.90)
    edge = max(abs(low), abs(high))
    assert decide([TINY], margin=edge * 1.01)[0].verdict == EQUIVALENT
    assert decide([TINY], margin=edge * 0.99)[0].verdict == INCONCLUSIVE


def test_seeds_needed_is_capped_with_a_note():
    (v,) = decide([[50.0, -60.0, 40.0, -45.0]], margin=0.01)
    assert v.verdict == INCONCLUSIVE and v.seeds_needed is None and v.seeds_note == "more than 1000"


def test_readings_are_plain_sentences():
    better, _, equivalent, inconclusive = decide([CLEAR_GAIN, [-v for v in CLEAR_GAIN], TINY, NOISY], 0.5)
    assert reading(better, "bnn", "bn", "test accuracy", "%").startswith("bnn is better than bn on test accuracy")
    assert "may still be smaller than the margin" in reading(better, "bnn", "bn", "test accuracy", "%", (0.2, 1.0))
    assert "lies beyond the margin of 0.5%" in reading(better, "bnn", "bn", "test accuracy", "%", (0.6, 1.0))
    assert "smaller than the margin of 0.5%" in reading(equivalent, "ln", "bn", "test accuracy", "%")
    text = reading(inconclusive, "gn", "bn", "test accuracy", "%")
    assert f"about {inconclusive.seeds_needed} seeds" in text
    (few,) = decide([[1.0, 2.0]], 0.5)
    assert "at least 3 are needed" in reading(few, "gn", "bn", "test accuracy", "%")


def test_reading_when_the_run_already_has_the_power_for_the_margin():
    # mean 0.2, sd 0.31, n 10: p 0.074, TOST p 0.082, MDE 0.31 < margin 0.35
    (v,) = decide([[0.6, -0.2, 0.5, -0.1, 0.55, -0.15, 0.45, 0.0, 0.3, 0.05]], margin=0.35)
    assert v.verdict == INCONCLUSIVE and v.seeds_needed <= v.n
    assert "already below the margin" in reading(v, "gn", "bn", "test accuracy", "%")


def test_one_family_with_a_margin_per_comparison():
    """Metrics in different units share one Holm family, each equivalence test at its own margin."""
    tiny = [0.001, -0.002, 0.0015, -0.001, 0.0005]  # a loss difference (nats): well inside 0.01
    same_in_points = [0.1, -0.2, 0.15, -0.1, 0.05]  # an accuracy difference (points): inside 0.5, not 0.01
    loss, acc = decide([tiny, same_in_points], [0.01, 0.5])
    assert loss.verdict == acc.verdict == "equivalent" and (loss.margin, acc.margin) == (0.01, 0.5)
    assert decide([tiny, same_in_points], 0.01)[1].verdict == "inconclusive"  # one margin for both: wrong unit


def test_an_inconclusive_never_shows_an_interval_that_excludes_zero():
    """The issue's case: raw p below 0.05, Holm p above it. The unadjusted 95% interval excludes 0; the
    interval a verdict carries is the one at its Holm level, which includes 0 beside `inconclusive`, and
    excludes 0 beside every `better` / `worse`."""
    import numpy as np

    from normkit_lab.analysis.verdicts import interval95

    rng = np.random.default_rng(0)
    near = np.array([1.0, 3.4, 2.1, 0.6, 4.5])  # raw paired p 0.034; Holm over 4 comparisons: above 0.05
    noise = [rng.normal(0, 1, 5) for _ in range(3)]
    verdicts = decide([near, *noise], 0.5)
    raw_low, _ = interval95(near)
    assert verdicts[0].p < 0.05 < verdicts[0].p_holm and raw_low > 0  # today's 95% interval excludes 0
    assert verdicts[0].verdict == INCONCLUSIVE and verdicts[0].low < 0 < verdicts[0].high
    for v in decide([near + 3, *noise], 0.5):
        assert (v.low > 0 or v.high < 0) == v.verdict.startswith(("better", "worse"))
