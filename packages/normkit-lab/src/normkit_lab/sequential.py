"""Sequential seeds: a group-sequential design for paired seed differences whose error rates hold
however early a comparison stops.

A comparison that adds seeds until its verdict looks decided, and then tests as if the number of
seeds had been fixed, inflates its false decisions (optional stopping). Here the looks are planned
(`Design.looks`: the cumulative number of seeds after each round, e.g. 3, 5, 8, 12) and each look may
spend only part of alpha: Lan-DeMets O'Brien-Fleming-like spending, alpha(t) = 2 - 2 Phi(z_{1-a/2} /
sqrt(t)) at information fraction t = seeds / max seeds, which spends almost nothing at the first
looks and most of it at the last. Each look tests with an exact paired t-test at the alpha that look
spends (the increment of the spending function), so by the union bound the chance of any false
crossing over all looks is at most alpha, whatever the dependence between looks and with no normal
approximation. The classical boundaries from the joint normal law of the cumulative statistics
(scipy's multivariate normal) turned into t boundaries with the same tail probability are not used:
at 3 to 12 seeds the t statistics' joint law is far from normal, and simulation of that rule gave
false decisions of 0.053 (looks 3, 5, 8, 12) to 0.057 (looks 3..8) at alpha 0.05 (400,000 sequences
each). The union bound gives about 0.044 at looks 3, 5, 8, 12, and packages/normkit-lab/tests/
test_sequential.py shows
the error rates and the power by simulation.

Several comparisons: Holm across the family, applied at every look (the sequentially rejective
procedure of Maurer and Bretz 2013): a comparison is tested at level alpha / (comparisons not yet
rejected), so every rejection raises the level of the rest. This keeps the familywise error: the
first true null rejected is tested at most at alpha / (true nulls), and each look's spent alpha grows
with the level (lower levels have higher boundaries at every look), so that rejection is a crossing
of the alpha / (true nulls) design, whose chance is at most that level per true null. Two families,
each at alpha:

    difference   two-sided: |t| beyond the boundary of one-sided level (level / 2)   -> better / worse
    equivalence  TOST: the whole look-adjusted (1 - 2 level) interval inside (-margin, margin) -> equivalent

A comparison stops at the first look where either is shown; the others continue to the next look,
and at the last look (or when the budget ends the rounds) an undecided one is `inconclusive`, with
the smallest difference the budget could have shown (80% power at the last look's nominal level).
One look is the fixed-n design: the decisions are then the ordinary Holm-adjusted paired t-test and
TOST of `analysis/verdicts.py`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from normkit_lab.stats import ALPHA, detectable_effect_size

SPENDING = "lan-demets-obrien-fleming"
FIRST_LOOK = 3  # fewest seeds a t-test with an estimated spread can use (and MIN_PAIRS of a verdict)
GROWTH = 1.6  # each look has about this many times the seeds of the one before: 3, 5, 8, 13, ...
BETTER, WORSE, EQUIVALENT, INCONCLUSIVE, CONTINUE = "better", "worse", "equivalent", "inconclusive", "continue"
WITHIN_MARGIN = " (within margin)"
# why a comparison stopped (or did not)
SHOWN_DIFFERENCE, SHOWN_EQUIVALENCE = "difference shown", "equivalence shown"
AT_MAX_SEEDS, AT_BUDGET, OPEN = "undecided at max seeds", "undecided at budget", "undecided, more looks to come"
TOO_FEW = "too few pairs (failed runs)"


def plan_looks(max_seeds: int, first: int = FIRST_LOOK) -> tuple[int, ...]:
    """The cumulative seeds at each look: `first`, then about GROWTH times more each round, up to `max_seeds`
    (3, 5, 8, 12 for 12; a single look when max_seeds <= first)."""
    if max_seeds < 1:
        raise ValueError(f"max_seeds must be at least 1, not {max_seeds}")
    looks = [min(first, max_seeds)]
    while looks[-1] < max_seeds:
        grown = max(looks[-1] + 1, round(looks[-1] * GROWTH))
        looks.append(grown if max_seeds - grown >= 2 else max_seeds)  # no last round of a single seed
    return tuple(looks)


def spent(fraction: float, level: float) -> float:
    """Lan-DeMets O'Brien-Fleming-like spending: the one-sided alpha spent by information `fraction` for a
    test of one-sided `level` (2 - 2 Phi(z_{1-level/2} / sqrt(t)), the level itself at t = 1)."""
    if fraction <= 0:
        return 0.0
    return float(2.0 * sps.norm.sf(sps.norm.isf(level / 2.0) / math.sqrt(min(fraction, 1.0))))


@functools.lru_cache(maxsize=4096)
def _nominal(fractions: tuple[float, ...], level: float) -> tuple[float, ...]:
    spending = [spent(t, level) for t in fractions]
    return tuple(b - a for a, b in zip([0.0, *spending], spending, strict=False))


@functools.lru_cache(maxsize=65536)
def _critical_t(fractions: tuple[float, ...], look: int, level: float, n: int) -> float:
    """The exact Student t boundary (n - 1 df) whose tail is the alpha the look spends."""
    return float(sps.t.isf(_nominal(fractions, level)[look], n - 1))


@dataclass(frozen=True)
class Design:
    """A group-sequential design: the cumulative seeds at each look, the familywise alpha of each family
    (difference and equivalence) and the spending function. Written into the results before any run."""

    looks: tuple[int, ...]
    alpha: float = ALPHA
    spending: str = SPENDING

    def __post_init__(self) -> None:
        if not self.looks or any(b <= a for a, b in zip(self.looks, self.looks[1:], strict=False)) or self.looks[0] < 1:
            raise ValueError(f"looks must be increasing seed counts, not {self.looks}")

    @property
    def max_seeds(self) -> int:
        return self.looks[-1]

    @functools.cached_property
    def fractions(self) -> tuple[float, ...]:
        return tuple(n / self.max_seeds for n in self.looks)

    def nominal(self, level: float) -> tuple[float, ...]:
        """The one-sided tail probability each look's boundary has for a test of one-sided `level`: the alpha
        that look spends (the increments of `spent`, summing to `level` over all looks)."""
        return _nominal(self.fractions, level)

    def critical_t(self, look: int, level: float, n: int) -> float:
        """The t boundary at look `look` (0-based) for a one-sided test at `level`, with n pairs (n - 1 df)."""
        return _critical_t(self.fractions, look, level, n)

    def as_dict(self) -> dict[str, object]:
        return {"looks": list(self.looks), "alpha": self.alpha, "spending": self.spending,
                "max_seeds": self.max_seeds}


@dataclass(frozen=True)
class Step:
    """One comparison after the looks analyzed so far (differences oriented: + = better).

    verdict: better / worse (maybe " (within margin)"), equivalent, continue (more looks to come) or
    inconclusive; look: the 1-based look it was last analyzed at; stop: why it stopped or goes on;
    level: the Holm level its difference test was last tested at (two-sided); low/high: the interval
    that test implies (excludes 0 exactly when a difference is shown), eq_low/eq_high: the (1 - 2 level)
    interval of the equivalence test (inside the margin exactly when equivalence is shown); mde: for an
    undecided comparison, the smallest true difference its seeds detect with 80% power at the last look's
    nominal level. p/alpha: the two-sided p of the difference test at that look and the two-sided alpha the
    look spends at its Holm level (a difference is shown exactly when p < alpha); eq_p/eq_alpha: the same for
    the equivalence test (TOST p, one-sided alpha spent), so a verdict always shows the p it was decided on.
    """

    verdict: str
    n: int
    look: int
    stop: str
    level: float
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    eq_level: float | None = None
    eq_low: float | None = None
    eq_high: float | None = None
    mde: float | None = None
    p: float | None = None
    alpha: float | None = None
    eq_p: float | None = None
    eq_alpha: float | None = None

    @property
    def decided(self) -> bool:
        return self.verdict not in (CONTINUE, INCONCLUSIVE)


class _Sums:
    """Running sums of one comparison's differences: the mean and sd of any prefix in O(1), so replaying
    the looks (and the simulations of tests/test_sequential.py) stay cheap."""

    def __init__(self, d: np.ndarray) -> None:
        self.size = int(d.size)
        self.total = np.concatenate([[0.0], np.cumsum(d)]).tolist()
        self.centred = np.concatenate([[0.0], np.cumsum((d - (d[0] if d.size else 0.0)) ** 2)]).tolist()
        self.shift = float(d[0]) if d.size else 0.0
        self.d = d

    def moments(self, n: int) -> tuple[float, float]:
        """Mean and sample sd of the first n differences (sums shifted by the first value, for precision)."""
        mean = self.total[n] / n
        shifted = mean - self.shift
        var = max(0.0, (self.centred[n] - n * shifted * shifted) / (n - 1))
        sd = math.sqrt(var)
        if sd <= 1e-12 * max(1.0, abs(mean)):  # exactly equal differences leave rounding, not spread
            sd = float(self.d[:n].std(ddof=1))
        if sd <= 1e-9 * max(1.0, abs(mean)):  # equal differences up to float rounding (e.g. two test images on
            sd = 0.0  # every seed, from differently rounded accuracies): zero spread, the exact sign test decides
        return mean, sd


def _crosses(sums: _Sums, n: int, design: Design, look: int, one_sided: float) -> tuple[bool, float, float]:
    """Whether the mean of the first n differences is beyond the look's two-sided boundary (one-sided level
    each side), and the interval mean -/+ boundary * se. With zero spread the exact sign test takes the
    t-test's place: n identical non-zero differences cross when 0.5^n is below the look's nominal level."""
    mean, sd = sums.moments(n)
    if sd == 0.0:
        crossed = mean != 0.0 and 0.5 ** n <= design.nominal(one_sided)[look]
        return crossed, mean, mean
    half = design.critical_t(look, one_sided, n) * sd / math.sqrt(n)
    return abs(mean) > half, mean - half, mean + half


def _equivalent(sums: _Sums, n: int, design: Design, look: int, level: float,
                margin: float) -> tuple[bool, float, float]:
    """TOST at one-sided `level` with the look's boundary: the whole interval inside (-margin, margin)."""
    mean, sd = sums.moments(n)
    if sd == 0.0:
        inside = abs(mean) < margin and 0.5 ** n <= design.nominal(level)[look]
        return inside, mean, mean
    half = design.critical_t(look, level, n) * sd / math.sqrt(n)
    return -margin < mean - half and mean + half < margin, mean - half, mean + half


def look_p(sums: _Sums, n: int) -> float:
    """The two-sided p of the first n differences' mean, on the scale `_crosses` decides on: the paired t-test,
    or with zero spread the exact sign test (2 * 0.5^n for n equal non-zero differences)."""
    mean, sd = sums.moments(n)
    if sd == 0.0:
        return 1.0 if mean == 0.0 else min(1.0, 2.0 * 0.5 ** n)
    return float(2.0 * sps.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def look_tost_p(sums: _Sums, n: int, margin: float) -> float:
    """The TOST p of the first n differences (the larger one-sided p), on the scale `_equivalent` decides on."""
    mean, sd = sums.moments(n)
    if sd == 0.0:
        return 0.5 ** n if abs(mean) < margin else 1.0
    se = sd / math.sqrt(n)
    return float(max(sps.t.sf((mean + margin) / se, n - 1), sps.t.sf((margin - mean) / se, n - 1)))


def looks_reached(design: Design, positions: Sequence[int]) -> int:
    """How many looks a comparison's seeds cover when its seeds are the plan's first ones in order
    (positions: the plan indices of the seeds it has, e.g. range(n)): the looks whose seeds it has all."""
    have = len(set(positions))
    return sum(1 for seeds in design.looks if seeds <= have)


def analyze(design: Design, differences: Sequence[Sequence[float]], margins: Sequence[float], *,
            positions: Sequence[Sequence[int]] | None = None, reached: Sequence[int] | None = None,
            final: bool = False, min_pairs: int = FIRST_LOOK) -> list[Step]:
    """Replay the looks over each comparison's differences and decide every comparison.

    positions[i]: the plan index (0-based, in the order seeds are added) of each of comparison i's
    differences (default 0, 1, 2, ...; a seed missing because a run failed leaves a gap); reached[i]:
    how many looks' runs it has completed (default: the looks its differences cover). At look k a
    comparison uses its differences of plan index < looks[k], and takes part only if it reached that
    look and was not decided before (a decided comparison gets no more seeds: data past its stop are
    ignored). An undecided comparison that reached the last look is `inconclusive` (at max seeds);
    `final` (the budget ended the rounds) makes the others inconclusive too. A comparison with fewer
    than `min_pairs` pairs at its looks gets no test and is not counted in the family.
    """
    ds = [np.asarray(d, dtype=np.float64) for d in differences]
    pos = [np.asarray(range(d.size) if positions is None else positions[i], dtype=np.int64) for i, d in enumerate(ds)]
    order = [np.argsort(p, kind="stable") for p in pos]
    sums = [_Sums(d[o]) for d, o in zip(ds, order, strict=True)]
    pos = [p[o] for p, o in zip(pos, order, strict=True)]
    reach = [looks_reached(design, p.tolist()) for p in pos] if reached is None else list(reached)

    def pairs_at(i: int, k: int) -> int:
        return int(np.searchsorted(pos[i], design.looks[k]))

    members = [i for i in range(len(ds)) if any(pairs_at(i, k) >= min_pairs for k in range(reach[i]))]
    m = max(1, len(members))
    rejected: dict[int, Step] = {}  # difference shown
    equivalent: dict[int, Step] = {}
    last: dict[int, tuple[int, int]] = {}  # the last look each comparison took part in, and its pairs there
    for k in range(len(design.looks)):
        active = [i for i in members if reach[i] > k and i not in rejected and i not in equivalent
                  and pairs_at(i, k) >= min_pairs]
        for i in active:
            last[i] = (k, pairs_at(i, k))
        changed = bool(active)
        while changed:  # Holm: every rejection raises the level of the rest, tested again at this look
            changed = False
            level = design.alpha / max(1, m - len(rejected))
            for i in active:
                if i in rejected:
                    continue
                n = last[i][1]
                crossed, low, high = _crosses(sums[i], n, design, k, level / 2)
                if crossed:
                    mean = (low + high) / 2
                    rejected[i] = Step(BETTER if mean > 0 else WORSE, n, k + 1, SHOWN_DIFFERENCE, level, mean,
                                       low, high)
                    changed = True
        changed = bool(active)
        while changed:
            changed = False
            eq_level = design.alpha / max(1, m - len(equivalent))
            for i in active:
                if i in equivalent or i in rejected:
                    continue
                n = last[i][1]
                inside, low, high = _equivalent(sums[i], n, design, k, eq_level, margins[i])
                if inside:
                    equivalent[i] = Step(EQUIVALENT, n, k + 1, SHOWN_EQUIVALENCE, 0.0, (low + high) / 2,
                                         eq_level=eq_level, eq_low=low, eq_high=high)
                    changed = True
    level, eq_level = design.alpha / max(1, m - len(rejected)), design.alpha / max(1, m - len(equivalent))
    out = []
    for i, d in enumerate(ds):
        if i not in last:
            undecided = INCONCLUSIVE if final or reach[i] == len(design.looks) else CONTINUE
            why = TOO_FEW if reach[i] else AT_BUDGET if final else OPEN
            out.append(Step(undecided, int(d.size), 0, why, level))
            continue
        k, n = last[i]

        def tested(diff_level: float, tost_level: float, i: int = i, k: int = k, n: int = n) -> dict[str, float]:
            """The p-values of look k and the alpha it spends at these Holm levels (see Step)."""
            return {"p": look_p(sums[i], n), "alpha": 2.0 * design.nominal(diff_level / 2)[k],
                    "eq_p": look_tost_p(sums[i], n, margins[i]), "eq_alpha": design.nominal(tost_level)[k]}

        if i in rejected:
            step = rejected[i]
            _, eq_low, eq_high = _equivalent(sums[i], n, design, k, eq_level, margins[i])
            within = -margins[i] < step.low and step.high < margins[i]  # type: ignore[operator]
            out.append(Step(step.verdict + (WITHIN_MARGIN if within else ""), step.n, step.look, step.stop,
                            step.level, step.mean, step.low, step.high, eq_level, eq_low, eq_high,
                            **tested(step.level, eq_level)))
            continue
        _, low, high = _crosses(sums[i], n, design, k, level / 2)
        if i in equivalent:
            step = equivalent[i]
            out.append(Step(EQUIVALENT, step.n, step.look, step.stop, level, step.mean, low, high, step.eq_level,
                            step.eq_low, step.eq_high, **tested(level, step.eq_level)))  # type: ignore[arg-type]
            continue
        _, eq_low, eq_high = _equivalent(sums[i], n, design, k, eq_level, margins[i])
        at_max = k + 1 == len(design.looks)
        more = not final and not at_max
        out.append(Step(CONTINUE if more else INCONCLUSIVE, n, k + 1, OPEN if more else AT_MAX_SEEDS if at_max
                        else AT_BUDGET, level, (low + high) / 2, low, high, eq_level, eq_low, eq_high,
                        None if more else budget_mde(design, sums[i].moments(n)[1], level),
                        **tested(level, eq_level)))
    return out


def budget_mde(design: Design, sd: float, level: float) -> float | None:
    """The smallest true difference the whole budget (max seeds) detects with 80% power at the last look's
    nominal two-sided level, given the observed sd of the differences (None without a spread to go by)."""
    if sd == 0.0:
        return None
    nominal = 2.0 * design.nominal(level / 2)[-1]
    effect = detectable_effect_size(design.max_seeds, nominal)
    return None if effect is None else effect * sd
