"""Interaction tests of a sweep: does a norm's gap to the baseline depend on the swept key?

A sweep's question is an interaction ("the gap between gn+pn and bn depends on batch size"), which
two per-cell verdicts cannot answer: "better at 2, inconclusive at 16" is not evidence that the gap
changed. For each norm and each pair of cells that differ in one swept key only (every pair of its
values, the other keys held fixed), the per-seed difference of differences

    (norm - baseline at cell B) - (norm - baseline at cell A)     (oriented: + = the gap grows in
                                                                   the norm's favour from A to B)

is tested like any paired difference (stats.py/verdicts.py): its Holm-adjusted interval (the t
interval at the level the test was last tested at, so it excludes 0 exactly when a dependence is
shown; `ci_level` in summary.json), paired t p (exact
sign test with zero spread), Holm over every interaction test of the run, and TOST against the
comparison's margin. Verdicts: "depends on KEY" (Holm p < alpha), "same gap across KEY (within
margin)" (Holm TOST p < alpha: the gaps are shown to differ by less than the margin), otherwise "no
evidence that it depends on KEY", and "no verdict (n<3)" with fewer than three seeds in both cells.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normkit_lab.analysis.verdicts import EQUIVALENT, NO_VERDICT, Verdict, decide, is_difference


@dataclass(frozen=True)
class Interaction:
    """One norm's change of gap between two cells of one swept key, and its verdict."""

    norm: str
    key: str
    cell_a: dict[str, Any]
    cell_b: dict[str, Any]
    seeds: list[int]
    mean: float | None
    verdict: str
    test: Verdict

    def as_dict(self) -> dict[str, Any]:
        """The summary.json form (see docs/experiments.md, "Interaction tests")."""
        t = self.test
        return {"norm": self.norm, "key": self.key, "from": self.cell_a[self.key], "to": self.cell_b[self.key],
                "cell_a": self.cell_a, "cell_b": self.cell_b, "n": t.n, "diff_of_diffs": self.mean,
                "ci95_low": t.low, "ci95_high": t.high, "ci_level": None if t.level is None else 1 - t.level,
                "p_value": t.p, "p_holm": t.p_holm,
                "p_tost_holm": t.p_tost_holm, "margin": t.margin, "verdict": self.verdict}


def _label(test: Verdict, key: str) -> str:
    if test.verdict == NO_VERDICT:
        return NO_VERDICT
    if is_difference(test.verdict):
        return f"depends on {key}"
    if test.verdict == EQUIVALENT:
        return f"same gap across {key} (within margin)"
    return f"no evidence that it depends on {key}"


def cell_pairs(cells: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
    """(key, index A, index B) for every pair of cells that differ in exactly one key, in sweep order."""
    pairs = []
    for (i, a), (j, b) in itertools.combinations(enumerate(cells), 2):
        if set(a) != set(b):
            continue
        differing = [k for k in a if a[k] != b[k]]
        if len(differing) == 1:
            pairs.append((differing[0], i, j))
    return pairs


def interactions(gaps: Mapping[tuple[int, str], Mapping[int, float]], cells: Sequence[Mapping[str, Any]],
                 norms: Sequence[str], baseline: str, margin: float) -> list[Interaction]:
    """Every interaction test of a sweep, Holm-adjusted together.

    `gaps[(i, norm)]` maps seed -> oriented paired difference (norm - baseline, + = better) in
    `cells[i]`.
    """
    found = []
    for norm in norms:
        if norm == baseline:
            continue
        for key, i, j in cell_pairs(cells):
            ga, gb = gaps.get((i, norm), {}), gaps.get((j, norm), {})
            seeds = sorted(set(ga) & set(gb))
            found.append((norm, key, dict(cells[i]), dict(cells[j]), seeds, [gb[s] - ga[s] for s in seeds]))
    tests = decide([f[5] for f in found], margin)
    return [Interaction(norm, key, a, b, seeds, sum(d) / len(d) if d else None, _label(t, key), t)
            for (norm, key, a, b, seeds, d), t in zip(found, tests, strict=True)]
