"""Which stage carries a norm's difference: the stage ablations of `normkit compare --ablate`.

For every compared norm and every stage its plugin declared (`normkit_lab.ablations`) whose arm has
runs (trained by `--ablate`, or itself one of the compared norms: ln+ib-l's arm without its
compression is ln), in every cell, two paired-by-seed contrasts:

    effect   norm - arm       what switching the stage off changes (+ = the stage helps, oriented)
    without  arm - baseline   the gap left without the stage (not for the baseline's own stages, nor
                              when the arm is the baseline)

Each is tested like any comparison (verdicts.py: paired t p or the exact sign test, TOST against the
margin), all of them Holm-adjusted together as one family of their own, apart from the comparison's
verdicts, so asking about mechanisms never weakens the headline. The intervals shown beside the
verdicts are adjusted for that family like the comparison's (the t interval at the Holm level each
test was last tested at), so they exclude 0 exactly when a test shows a difference; the unadjusted
95% intervals stay in summary.json (*_ci95_*). A stage carries a
norm's difference to the baseline when the norm differs from the baseline and switching the stage
off moves it significantly back towards the baseline (its effect has the difference's sign).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normkit_lab.ablations import Ablation, ablations_of
from normkit_lab.analysis.verdicts import (
    BETTER,
    EQUIVALENT,
    NO_VERDICT,
    WORSE,
    Verdict,
    decide,
    is_difference,
    oriented_to_metric,
)
from normkit_lab.stats import PairedDifference, paired_difference

Values = Mapping[str, Mapping[int, float]]  # spec -> seed -> primary value, in one cell


@dataclass(frozen=True)
class StageTest:
    """One declared stage of one norm in one cell: its effect and the gap left without it."""

    ablation: Ablation
    cell: dict[str, Any]
    effect: PairedDifference  # norm - arm, in the metric's unit
    effect_test: Verdict  # oriented: better = the stage helps
    without: PairedDifference | None  # arm - baseline; None for the baseline's own stages
    without_test: Verdict | None
    change_adjusted: tuple[float, float] | None = None  # arm - norm (what the table shows), adjusted for the family
    without_adjusted: tuple[float, float] | None = None  # arm - baseline, adjusted for the family

    @property
    def role(self) -> str:
        """What the effect test says the stage does: helps, hurts, no effect (within margin), inconclusive."""
        verdict = self.effect_test.verdict
        if verdict == NO_VERDICT:
            return NO_VERDICT
        if is_difference(verdict):
            return "helps" if verdict.startswith(BETTER) else "hurts"
        return "no effect (within margin)" if verdict == EQUIVALENT else "inconclusive"

    @property
    def reading(self) -> str:
        """The role as a phrase about the stage: "noise hurts", "proxy step: inconclusive"."""
        role = self.role
        return f"{self.ablation.stage} {role}" if role in ("helps", "hurts") else f"{self.ablation.stage}: {role}"

    def as_dict(self) -> dict[str, Any]:
        """The summary.json form (docs/experiments.md, "Stage ablations")."""
        e, t = self.effect, self.effect_test
        out = {**self.ablation.as_dict(), "cell": self.cell, "n": e.n, "effect": e.mean, "effect_ci95_low": e.low,
               "effect_ci95_high": e.high, "effect_p_value": e.p_value, "effect_p_holm": t.p_holm,
               "effect_verdict": t.verdict, "role": self.role, "mde": t.mde,
               # the adjusted interval of the effect (norm - arm, like `effect`), the one its verdict implies
               "effect_adj_low": None if self.change_adjusted is None else 0.0 - self.change_adjusted[1],
               "effect_adj_high": None if self.change_adjusted is None else 0.0 - self.change_adjusted[0]}
        w, wt = self.without, self.without_test
        out.update({"without_diff": w.mean if w else None, "without_ci95_low": w.low if w else None,
                    "without_ci95_high": w.high if w else None,
                    "without_adj_low": self.without_adjusted[0] if self.without_adjusted else None,
                    "without_adj_high": self.without_adjusted[1] if self.without_adjusted else None,
                    "without_p_holm": wt.p_holm if wt else None,
                    "without_verdict": wt.verdict if wt else None})
        return out


def declared_ablations(norms: Sequence[str], trained: set[str]) -> list[Ablation]:
    """The ablations of `norms` whose arm has runs (`trained`); a norm that no longer parses (a plugin
    uninstalled since the runs) has none."""
    found = []
    for norm in norms:
        try:
            found += [a for a in ablations_of(norm) if a.arm in trained]
        except Exception:  # noqa: BLE001 - any parse error: the report still shows the comparison
            continue
    return found


def stage_tests(per_cell: Sequence[tuple[dict[str, Any], Values]], ablations: Sequence[Ablation], baseline: str,
                sign: float, margin: float) -> list[StageTest]:
    """Every (cell, ablation)'s two contrasts, paired by seed, Holm-adjusted as one family."""
    planned = []
    for cell, values in per_cell:
        for a in ablations:
            norm, arm, base = values.get(a.norm, {}), values.get(a.arm, {}), values.get(baseline, {})
            seeds = sorted(set(norm) & set(arm))
            effect = paired_difference([norm[s] for s in seeds], [arm[s] for s in seeds])
            oriented = [sign * (norm[s] - arm[s]) for s in seeds]
            # the gap left without the stage: none for the baseline's own stages, and none when the arm
            # is the baseline itself (ln+ib-l's compression off is ln), whose gap is 0 by construction
            left = sorted(set(arm) & set(base)) if baseline not in (a.norm, a.arm) else None
            without = None if left is None else paired_difference([arm[s] for s in left], [base[s] for s in left])
            planned.append((a, cell, effect, oriented, without,
                            None if left is None else [sign * (arm[s] - base[s]) for s in left]))
    family = [p[3] for p in planned] + [p[5] for p in planned if p[5] is not None]
    tests = iter(decide(family, margin))
    effects = [next(tests) for _ in planned]
    out = []
    for (a, cell, effect, _, without, d), test in zip(planned, effects, strict=True):
        gap = None if d is None else next(tests)
        norm_minus_arm = oriented_to_metric(test.low, test.high, sign)
        out.append(StageTest(a, cell, effect, test, without, gap,
                             None if norm_minus_arm is None else (0.0 - norm_minus_arm[1], 0.0 - norm_minus_arm[0]),
                             None if gap is None else oriented_to_metric(gap.low, gap.high, sign)))
    return out


def family_size(tests: Sequence[StageTest]) -> int:
    """How many tests the ablations' Holm family holds: each stage's effect, and the gap left without
    it where there is one."""
    return len(tests) + sum(t.without is not None for t in tests)


def carries(test: StageTest, gap: Verdict | None) -> bool:
    """Whether `test`'s stage carries its norm's difference to the baseline (`gap`, the norm's verdict in
    that cell): the norm differs, and switching the stage off moves it significantly back."""
    if gap is None or not is_difference(gap.verdict) or not is_difference(test.effect_test.verdict):
        return False
    return test.effect_test.verdict.split(" (")[0] == gap.verdict.split(" (")[0]


def attribution(test: StageTest, gap: Verdict | None, baseline: str, unit: str) -> str:
    """One sentence on whether `test`'s stage carries its norm's difference to the baseline (`gap`: the
    norm's verdict against the baseline in the same cell, None for the baseline itself)."""
    a, e = test.ablation, test.effect
    if e.mean is None or test.effect_test.verdict == NO_VERDICT:
        return f"{a.norm}: {a.stage} not decided (fewer than 3 seeds with both {a.norm} and {a.arm})"
    shown = test.change_adjusted
    interval = "" if shown is None else f" [{shown[0]:+.2f}, {shown[1]:+.2f}]"
    change = (f"switching off {a.stage} ({a.arm}) changes {a.norm} by {0.0 - e.mean:+.2f} {unit}{interval} "
              f"(Holm-adjusted), Holm p {_p(test.effect_test.p_holm)}")
    if gap is None or not is_difference(gap.verdict):
        state = "no difference to baseline to attribute" if gap is not None else f"{a.norm} is the baseline"
        return f"{a.norm} ({state}): {change}: {test.reading}."
    direction = BETTER if gap.verdict.startswith(BETTER) else WORSE
    left = ""
    if test.without_test is not None and test.without is not None and test.without.mean is not None:
        left = (f"; without it {a.arm} vs {baseline}: {test.without.mean:+.2f}, "
                f"{test.without_test.verdict}")
    verdict = (f"{a.stage} carries the difference" if carries(test, gap)
               else f"{a.stage} is not shown to carry it ({test.role})")
    return f"{a.norm} is {direction} than {baseline}: {change}: {verdict}{left}."


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}"
