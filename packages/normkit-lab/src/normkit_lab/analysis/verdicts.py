"""One verdict per compared norm: better, worse, equivalent, inconclusive, or no verdict (n<3).

Input: for each (cell, norm) comparison of a run, the per-seed paired differences oriented so that
positive = better (norm - baseline, sign flipped for lower-is-better metrics). Rule, per comparison:

    n < 3                                       -> "no verdict (n<3)"
    Holm-adjusted two-sided paired t p < 0.05   -> "better" / "worse" by the sign of the mean, with
                                                   " (within margin)" when the adjusted interval lies
                                                   inside (-m, m): real, but smaller than the margin
    Holm-adjusted TOST p < 0.05 (margin m)      -> "equivalent"
    otherwise                                   -> "inconclusive" (with the MDE and seeds needed)

Both families (difference tests and equivalence tests) are Holm-adjusted over the comparisons that
can get a verdict (n >= 3), so each kind of claim keeps a familywise error of at most 5% however
many norms and cells are compared. With one comparison the TOST rule is exactly "the 90% t interval
lies inside (-m, m)". With zero spread the p-values come from the exact sign test (stats.py).

The interval shown with a verdict is the one the decision implies: the t interval at the Holm level
the comparison was last tested at (alpha / (comparisons not yet rejected)), so it excludes 0 exactly
when a difference is shown and an `inconclusive` never sits beside an interval that excludes 0.
Sequential seeds (`design`, normkit_lab.sequential) decide look by look with alpha spending; a
comparison still getting seeds is "continue", and an undecided one at the budget "inconclusive" with
the smallest difference the budget could have shown.

Planning numbers are given at the decision rule: with m comparisons in the family the strictest Holm
step tests at alpha / m (Bonferroni), so the MDE, the seeds needed to detect the margin and the
seeds needed to show equivalence (TOST, 80% power at a true difference of 0) all use alpha / m. At
the other Holm steps the level is larger, so these numbers are conservative.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from normkit_lab.sequential import (  # the verdict names are the sequential module's; the analysis imports them here
    BETTER,
    CONTINUE,
    EQUIVALENT,
    INCONCLUSIVE,
    WITHIN_MARGIN,
    WORSE,
    Design,
    analyze,
)
from normkit_lab.stats import (
    ALPHA,
    holm,
    minimum_detectable_effect,
    paired_p,
    seeds_for_equivalence,
    seeds_needed,
    tost_p,
)

BASELINE, NO_VERDICT = "baseline", "no verdict (n<3)"
MIN_PAIRS = 3
SEEDS_CAP = 1000


@dataclass(frozen=True)
class Verdict:
    """A comparison's verdict and the numbers behind it (p-values None where undefined).

    mde: the true difference (metric unit) this n detects with 80% power at two-sided level
    `planning_alpha` (alpha / m, the strictest Holm step), from the observed sd of the differences;
    seeds_needed: fewest pairs whose MDE is at most the margin; seeds_equivalence: fewest pairs
    whose TOST shows equivalence with 80% power when the true difference is 0 (None with
    `seeds_note` saying why).
    """

    verdict: str
    n: int
    p: float | None
    p_holm: float | None
    p_tost: float | None
    p_tost_holm: float | None
    margin: float
    mde: float | None
    seeds_needed: int | None
    seeds_note: str = ""
    seeds_equivalence: int | None = None
    planning_alpha: float = ALPHA
    # the interval the decision implies (oriented: + = better), adjusted for the family (Holm: the level this
    # comparison was last tested at) and, with sequential seeds, for the looks: it excludes 0 exactly when a
    # difference is shown; eq_low/eq_high: the equivalence test's (1 - 2 level) interval, inside the margin
    # exactly when equivalence is shown
    low: float | None = None
    high: float | None = None
    level: float | None = None
    eq_low: float | None = None
    eq_high: float | None = None
    # sequential seeds only (see normkit_lab.sequential): the look it was last analyzed at and why it stopped
    look: int | None = None
    stop: str = ""
    # sequential seeds only: at that look, the difference test's two-sided p and the two-sided alpha the look
    # spends at its Holm level (shown exactly when p <= alpha), and the same for the equivalence test (TOST p,
    # one-sided alpha): the p-values such a verdict is decided on (Holm p-values belong to one fixed look)
    look_p: float | None = None
    look_alpha: float | None = None
    look_tost_p: float | None = None
    look_tost_alpha: float | None = None


__all__ = ["BASELINE", "BETTER", "CONTINUE", "EQUIVALENT", "INCONCLUSIVE", "NO_VERDICT", "WITHIN_MARGIN", "WORSE",
           "LOOK_P", "Verdict", "decide", "decision_p", "interval95", "is_difference", "oriented_to_metric",
           "p_column", "reading"]


def interval95(d: np.ndarray) -> tuple[float | None, float | None]:
    """The 95% t interval of the mean of `d` (the single value with zero spread; None for n < 2)."""
    if d.size < 2:
        return None, None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = 0.0 if sd == 0.0 else float(sps.t.ppf(0.975, d.size - 1)) * sd / np.sqrt(d.size)
    return mean - half, mean + half


def decide(differences: Sequence[Sequence[float]], margin: float | Sequence[float], alpha: float = ALPHA, *,
           design: Design | None = None, positions: Sequence[Sequence[int]] | None = None,
           reached: Sequence[int] | None = None, final: bool = True) -> list[Verdict]:
    """The verdict of every comparison, Holm-adjusted over those with at least three pairs. `margin`: one
    for all, or one per comparison (a family across metrics, each in its own unit).

    `design`: sequential seeds (normkit_lab.sequential; `positions`, `reached` and `final` as there):
    the verdicts of the looks so far, "continue" for a comparison that gets more seeds. Without it the
    seeds are fixed: one look at the seeds there are (the Holm-adjusted paired t-test and TOST, with
    their Holm p-values and the seeds a fixed design would need)."""
    ds = [np.asarray(d, dtype=np.float64) for d in differences]
    margins = [float(margin)] * len(ds) if isinstance(margin, (int, float)) else [float(m) for m in margin]
    sequential = design is not None
    steps = analyze(design or Design((max([d.size for d in ds] + [1]),), alpha), ds, margins, positions=positions,
                    reached=reached if sequential else [1] * len(ds), final=final or not sequential,
                    min_pairs=MIN_PAIRS)
    eligible = [d.size >= MIN_PAIRS for d in ds]
    raw = [paired_p(d) for d in ds]
    tost = [tost_p(d, m) for d, m in zip(ds, margins, strict=True)]
    p_holm = holm([p if ok else None for p, ok in zip(raw, eligible, strict=True)])
    tost_holm = holm([p if ok else None for p, ok in zip(tost, eligible, strict=True)])
    level = alpha / max(1, sum(eligible))  # the strictest Holm step (Bonferroni)
    out = []
    for i, d in enumerate(ds):
        margin, step = margins[i], steps[i]
        n = int(d.size)
        sd = float(d.std(ddof=1)) if n >= 2 else None
        if sequential:  # planning numbers are the design's: the budget's detectable difference when undecided
            mde, needed, equivalence, note = step.mde, None, None, ""
        else:
            mde = minimum_detectable_effect(sd, n, alpha=level)
            needed = seeds_needed(sd, margin, cap=SEEDS_CAP, alpha=level)
            equivalence = seeds_for_equivalence(sd, margin, cap=SEEDS_CAP, alpha=level)
            note = "" if needed is not None else (
                "needs at least 2 pairs to estimate" if sd is None
                else "unknown: no spread between seeds" if sd == 0.0 else f"more than {SEEDS_CAP}")
        verdict = step.verdict if eligible[i] or (sequential and step.verdict == CONTINUE) else NO_VERDICT
        out.append(Verdict(verdict, n, raw[i], None if sequential else p_holm[i], tost[i],
                           None if sequential else tost_holm[i], margin, mde, needed, note, equivalence, level,
                           step.low, step.high, step.level, step.eq_low, step.eq_high,
                           step.look if sequential else None, step.stop if sequential else "",
                           *((step.p, step.alpha, step.eq_p, step.eq_alpha) if sequential else ())))
    return out


LOOK_P = "look p (α spent)"  # the column of sequential verdicts that takes the place of "Holm p"


def p_column(verdicts: Iterable[Verdict | None]) -> str:
    """The p column's name: "Holm p" for fixed seeds, LOOK_P when the verdicts come from sequential seeds."""
    return LOOK_P if any(v is not None and v.look is not None for v in verdicts) else "Holm p"


def decision_p(verdict: Verdict | None) -> str:
    """The p a verdict was decided on, as tables print it: the Holm p of a fixed design; with sequential seeds
    the look's p and, in brackets, the alpha that look spent ("TOST" before it when equivalence decided).
    Empty only where no test ran (the baseline, fewer than three pairs)."""
    if verdict is None:
        return ""
    if verdict.look is None:
        return "" if verdict.p_holm is None else f"{verdict.p_holm:.3g}"
    if verdict.verdict == EQUIVALENT and verdict.look_tost_p is not None and verdict.look_tost_alpha is not None:
        return f"TOST {verdict.look_tost_p:.3g} ({verdict.look_tost_alpha:.3g})"
    if verdict.look_p is None or verdict.look_alpha is None:
        return ""
    return f"{verdict.look_p:.3g} ({verdict.look_alpha:.3g})"


def oriented_to_metric(low: float | None, high: float | None, sign: float) -> tuple[float, float] | None:
    """An interval of oriented differences (+ = better) in the metric's own direction (norm - baseline)."""
    if low is None or high is None:
        return None
    return (low, high) if sign > 0 else (-high, -low)


def is_difference(verdict: str) -> bool:
    """True for better/worse verdicts, within the margin or not."""
    return verdict.split(" (")[0] in (BETTER, WORSE)


def reading(verdict: Verdict, norm: str, baseline: str, metric_label: str, unit: str,
            interval: tuple[float, float] | None = None) -> str:
    """One plain-language sentence that says what the verdict means and what to do next.

    `interval`: the adjusted interval of the paired difference (the one the verdict is decided on),
    which tells a difference larger than the margin from one that may be smaller.
    """
    m = f"{verdict.margin:g} {unit}".replace(" %", "%")
    sequential = verdict.look is not None
    if verdict.verdict == BASELINE:
        return f"{norm} is the baseline every other norm is compared to."
    if verdict.verdict == NO_VERDICT:
        return (f"{norm} vs {baseline}: only {verdict.n} paired seed(s); at least {MIN_PAIRS} are needed "
                f"for any verdict, so run more seeds.")
    if verdict.verdict == CONTINUE:
        return (f"{norm} vs {baseline} is not decided after {verdict.n} seeds; the next look adds seeds to it "
                f"(resume the comparison to continue).")
    evidence = (f"shown at look {verdict.look} with {verdict.n} seeds, alpha spent across the looks and Holm "
                f"across comparisons" if sequential else None)
    if is_difference(verdict.verdict):
        beyond = interval is not None and (interval[0] >= verdict.margin or interval[1] <= -verdict.margin)
        size = (f"and its adjusted interval lies beyond the margin of {m}" if beyond
                else f"but its whole adjusted interval lies inside the margin of {m}, so it is smaller than what "
                     f"you called negligible" if verdict.verdict.endswith(WITHIN_MARGIN)
                else f"though it may still be smaller than the margin of {m}")
        direction = verdict.verdict.split(" (")[0]
        return (f"{norm} is {direction} than {baseline} on {metric_label} ("
                f"{evidence or f'Holm-adjusted p = {verdict.p_holm:.3g}'}): a real difference for this model, "
                f"data and recipe, {size}.")
    if verdict.verdict == EQUIVALENT:
        return (f"{norm} and {baseline} are equivalent on {metric_label}: the difference is shown to be "
                f"smaller than the margin of {m} ({evidence or f'Holm-adjusted TOST p = {verdict.p_tost_holm:.3g}'}).")
    mde = "unknown" if verdict.mde is None else f"{verdict.mde:.3g} {unit}".replace(" %", "%")
    if sequential:
        return (f"{norm} vs {baseline} is inconclusive: {verdict.stop} after {verdict.n} seeds, neither a "
                f"difference nor equivalence within {m} is shown; the whole budget could have shown differences "
                f"of {mde} (80% power), so a smaller difference is not excluded.")
    if verdict.seeds_needed is None:
        more = f"seeds needed to detect the margin: {verdict.seeds_note}"
    elif verdict.seeds_needed <= verdict.n:
        more = "that is already below the margin: a few more seeds would likely settle it"
    else:
        more = f"about {verdict.seeds_needed} seeds would detect a difference of the margin"
    if verdict.seeds_equivalence is not None:
        more += (f"; about {verdict.seeds_equivalence} seeds would show equivalence within the margin (TOST, "
                 f"80% power if the true difference is 0)")
    return (f"{norm} vs {baseline} is inconclusive: neither a difference nor equivalence within {m} is "
            f"shown with {verdict.n} seeds; this run detects differences of {mde} (80% power at level "
            f"{verdict.planning_alpha:.3g}, alpha / comparisons: the strictest Holm step), and {more}.")
