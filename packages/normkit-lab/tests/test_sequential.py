"""The sequential design's error rates, shown by simulation (no training): thousands of sequences of
paired seed differences drawn under the null, at the equivalence margin and under shifted alternatives,
decided by `sequential.analyze` exactly as `--seeds auto` decides real runs.

The Monte-Carlo tolerance (three standard errors of a rate of alpha) is tight enough that the naive
rule, a fixed-n test repeated at every look, fails it in the same setting.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from normkit_lab.analysis.verdicts import decide
from normkit_lab.sequential import (
    AT_BUDGET,
    AT_MAX_SEEDS,
    CONTINUE,
    EQUIVALENT,
    INCONCLUSIVE,
    OPEN,
    SHOWN_DIFFERENCE,
    TOO_FEW,
    Design,
    analyze,
    plan_looks,
    spent,
)

ALPHA = 0.05
SEQUENCES = 2000
TOLERANCE = 3 * math.sqrt(ALPHA * (1 - ALPHA) / SEQUENCES)  # 0.015: three Monte-Carlo standard errors
LOOKS = (3, 5, 8, 12)


def _rates(design: Design, draws: np.ndarray, margin: float) -> dict[str, float]:
    """Decide every sequence (draws: sequences x comparisons x seeds) and count its outcomes."""
    steps = [analyze(design, list(seq), [margin] * seq.shape[0], final=True) for seq in draws]
    flat = [s for family in steps for s in family]
    return {"any_difference": float(np.mean([any(s.verdict.startswith(("better", "worse")) for s in f)
                                             for f in steps])),
            "any_equivalent": float(np.mean([any(s.verdict == EQUIVALENT for s in f) for f in steps])),
            "difference": float(np.mean([s.verdict.startswith(("better", "worse")) for s in flat])),
            "better": float(np.mean([s.verdict.startswith("better") for s in flat])),
            "seeds": float(np.mean([s.n for s in flat]))}


def _naive_any_rejection(draws: np.ndarray, looks: tuple[int, ...], test: str, margin: float = 0.0) -> float:
    """The rule sequential testing replaces: the fixed-n test at level alpha repeated at every look."""
    hit = np.zeros(draws.shape[0], dtype=bool)
    for n in looks:
        d = draws[..., :n]
        mean, se = d.mean(-1), d.std(-1, ddof=1) / math.sqrt(n)
        if test == "difference":
            hit |= (np.abs(mean / se) > sps.t.isf(ALPHA / 2, n - 1)).any(-1)
        else:  # TOST: the (1 - 2 alpha) interval inside the margin
            half = sps.t.isf(ALPHA, n - 1) * se
            hit |= ((mean - half > -margin) & (mean + half < margin)).any(-1)
    return float(hit.mean())


def test_looks_and_spending() -> None:
    assert plan_looks(12) == (3, 5, 8, 12)
    assert plan_looks(10) == (3, 5, 8, 10)
    assert plan_looks(3) == (3,) and plan_looks(9) == (3, 5, 9)  # no last round of a single seed
    design = Design(LOOKS)
    assert spent(1.0, 0.025) == pytest.approx(0.025)
    assert sum(design.nominal(0.025)) == pytest.approx(0.025)  # every look's share adds up to the level
    assert design.nominal(0.025)[0] < 1e-4 < design.nominal(0.025)[-1]  # O'Brien-Fleming: little spent early
    for low, high in ((0.05 / 8, 0.05 / 7), (0.0125, 0.025), (0.025, 0.05)):  # Holm's step-up needs: a higher
        assert all(a < b for a, b in zip(design.nominal(low), design.nominal(high), strict=True))  # level spends more
    with pytest.raises(ValueError, match="increasing"):
        Design((5, 3))


def test_false_differences_under_the_null_stay_below_alpha_and_the_naive_rule_exceeds_it() -> None:
    draws = np.random.default_rng(7).standard_normal((SEQUENCES, 1, LOOKS[-1]))
    rates = _rates(Design(LOOKS), draws, margin=0.5)
    naive = _naive_any_rejection(draws, LOOKS, "difference")
    print(f"null, one comparison: sequential {rates['any_difference']:.4f}, naive repeated t-test {naive:.4f}")
    assert rates["any_difference"] <= ALPHA + TOLERANCE
    assert naive > ALPHA + TOLERANCE  # about 0.14: optional stopping without spending


def test_familywise_error_of_a_correlated_family_under_the_null() -> None:
    """Three norms against one baseline (differences share the baseline's noise: correlation 0.5);
    Holm across the family at every look keeps the chance of any false difference below alpha."""
    rng = np.random.default_rng(11)
    baseline = rng.standard_normal((2000, 1, LOOKS[-1]))
    draws = rng.standard_normal((2000, 3, LOOKS[-1])) - baseline
    rates = _rates(Design(LOOKS), draws / math.sqrt(2), margin=0.5)
    naive = _naive_any_rejection(draws, LOOKS, "difference")
    print(f"null, three comparisons: sequential FWER {rates['any_difference']:.4f}, naive {naive:.4f}")
    assert rates["any_difference"] <= ALPHA + TOLERANCE
    assert naive > 0.2


def test_false_equivalence_at_the_margin_stays_below_alpha() -> None:
    """A true difference of exactly the margin (the equivalence null's closest point): the sequential
    TOST calls it equivalent at most alpha of the time; repeating the fixed-n TOST at each look does not."""
    margin = 1.0
    draws = np.random.default_rng(3).standard_normal((SEQUENCES, 1, 20)) * 0.7 + margin
    looks = plan_looks(20)
    rates = _rates(Design(looks), draws, margin)
    naive = _naive_any_rejection(draws, looks, "equivalence", margin)
    print(f"at the margin: sequential false equivalence {rates['any_equivalent']:.4f}, naive {naive:.4f}")
    assert rates["any_equivalent"] <= ALPHA + TOLERANCE
    assert naive > ALPHA + TOLERANCE


@pytest.mark.parametrize(("shift", "least_power"), [(1.0, 0.8), (1.5, 0.97)])
def test_power_under_shifted_alternatives_and_seeds_saved(shift: float, least_power: float) -> None:
    """A true difference of `shift` standard deviations of the per-seed differences: the power the 12-seed
    budget reaches, with fewer seeds on average than the fixed design's 12."""
    draws = np.random.default_rng(5).standard_normal((SEQUENCES, 1, LOOKS[-1])) + shift
    rates = _rates(Design(LOOKS), draws, margin=0.25)
    print(f"shift {shift} sd: power {rates['better']:.3f}, mean seeds {rates['seeds']:.2f} of {LOOKS[-1]}")
    assert rates["better"] >= least_power
    assert rates["seeds"] < LOOKS[-1] - 0.5
    assert rates["difference"] - rates["better"] < 1e-3  # a wrong sign is (nearly) never called


def test_one_look_is_the_fixed_design_of_the_verdicts() -> None:
    """With a single look the procedure is the Holm-adjusted paired t-test and TOST that fixed seeds use."""
    rng = np.random.default_rng(2)
    for _ in range(12):  # decide() also plans seeds (slow): a dozen families of four
        draws = rng.standard_normal((4, 5)) * rng.uniform(0.2, 2.0) + rng.choice([0.0, 0.6, 2.0], size=(4, 1))
        fixed = decide(list(draws), 1.0)
        steps = analyze(Design((5,)), list(draws), [1.0] * 4, final=True)
        for v, s in zip(fixed, steps, strict=True):
            assert v.verdict.split(" (")[0] == s.verdict.split(" (")[0]


def test_decisions_made_at_a_look_do_not_change_when_later_looks_come_in() -> None:
    """A resumed or extended comparison replays the same looks: what was decided stays decided."""
    rng = np.random.default_rng(9)
    draws = rng.standard_normal((3, 12)) * 0.3 + np.array([[4.0], [0.0], [0.05]])
    design = Design(LOOKS)
    early = analyze(design, [d[:5] for d in draws], [1.0] * 3)
    late = analyze(design, list(draws), [1.0] * 3, final=True)
    assert early[0].verdict == "better" and early[0].stop == SHOWN_DIFFERENCE and early[0].n <= 5
    assert (late[0].verdict, late[0].n, late[0].look, late[0].low, late[0].high) == (
        early[0].verdict, early[0].n, early[0].look, early[0].low, early[0].high)
    assert all(s.verdict in (CONTINUE, EQUIVALENT) for s in early[1:])
    assert early[1].stop == OPEN or early[1].verdict == EQUIVALENT


def test_undecided_at_the_budget_reports_the_smallest_difference_it_could_show() -> None:
    noisy = np.random.default_rng(4).standard_normal((1, 12)) * 3.0
    design = Design(LOOKS)
    [at_max] = analyze(design, list(noisy), [0.1], final=True)
    assert at_max.verdict == INCONCLUSIVE and at_max.stop == AT_MAX_SEEDS and at_max.n == 12
    assert at_max.mde is not None and at_max.mde > 2.0  # sd 3 at 12 seeds: differences of ~1 sd only
    [cut] = analyze(design, [noisy[0][:5]], [0.1], final=True)  # the budget ended the rounds at look 2
    assert cut.verdict == INCONCLUSIVE and cut.stop == AT_BUDGET and cut.n == 5 and cut.mde is not None


def test_intervals_agree_with_the_decisions() -> None:
    """The interval each step reports excludes 0 exactly when a difference is shown, and the equivalence
    interval lies inside the margin exactly when equivalence is shown."""
    rng = np.random.default_rng(13)
    design = Design(LOOKS)
    for _ in range(300):
        draws = rng.standard_normal((3, 12)) * rng.uniform(0.1, 2.0) + rng.choice([0.0, 0.5, 1.5], size=(3, 1))
        for s in analyze(design, list(draws), [0.5] * 3, final=True):
            excludes_zero = s.low > 0 or s.high < 0
            assert excludes_zero == s.verdict.startswith(("better", "worse")), s
            if s.verdict == EQUIVALENT:
                assert -0.5 < s.eq_low and s.eq_high < 0.5


def test_every_decided_step_carries_the_p_it_was_decided_on() -> None:
    """The look's p and the alpha it spent (what tables print in place of a Holm p): a difference is shown
    exactly when p <= alpha at its look, equivalence when the TOST p <= its alpha; constant differences (the
    exact sign test) included."""
    rng = np.random.default_rng(29)
    design = Design(LOOKS)
    for _ in range(300):
        draws = rng.standard_normal((3, 12)) * rng.uniform(0.1, 2.0) + rng.choice([0.0, 0.5, 1.5], size=(3, 1))
        for s in analyze(design, [*draws, [0.7] * 12], [0.5] * 4, final=True):
            assert None not in (s.p, s.alpha, s.eq_p, s.eq_alpha), s
            assert (s.p <= s.alpha) == s.verdict.startswith(("better", "worse")), s
            if s.verdict == EQUIVALENT:
                assert s.eq_p <= s.eq_alpha, s
            if s.verdict == INCONCLUSIVE:
                assert s.eq_p > s.eq_alpha, s
    [one] = analyze(Design((5,)), [[0.4, 0.6, 0.5, 0.7, 0.3]], [0.1], final=True)  # one look: the fixed design
    assert one.p == pytest.approx(sps.ttest_1samp([0.4, 0.6, 0.5, 0.7, 0.3], 0.0).pvalue)
    assert one.alpha == pytest.approx(ALPHA)


def test_constant_and_tiny_differences_give_finite_decisions() -> None:
    design = Design(LOOKS)
    same = analyze(design, [[0.3] * 12, [0.0] * 12, [0.3, 0.3]], [0.5] * 3, final=True)
    assert same[0].verdict == EQUIVALENT and same[1].verdict == EQUIVALENT  # identical seeds: the sign test
    assert same[2].stop == AT_BUDGET and same[2].verdict == INCONCLUSIVE  # never reached the first look
    [failed] = analyze(design, [[0.3, 0.1]], [0.5], positions=[[0, 2]], reached=[1])  # seed 1 failed
    assert failed.stop == TOO_FEW and failed.verdict == CONTINUE
    big = analyze(design, [[2.0] * 12], [0.5], final=True)[0]
    assert big.verdict == "better" and big.n == 8  # 0.5^n reaches the spent alpha first at look 3 (8 seeds)
    assert all(math.isfinite(v) for s in same[:2] for v in (s.low, s.high, s.eq_low, s.eq_high))
