"""`--all-pairs`: every pair of norms compared paired by seed, Holm over all pairs, and a ranking.

The baseline comparison answers "how does each norm do against X"; with several candidates the
question is often "which is best". Here every pair (A, B) of norms in a cell, in the given order
with B after A, gets the paired difference B - A (oriented: + = B better), its Holm-adjusted interval and the
verdict rule of verdicts.py, Holm-adjusted over all pairs of all cells (k norms give k(k-1)/2 pairs
per cell, so the adjustment is stricter than the baseline family's).

Ranking per cell: by significant wins minus losses (better / worse verdicts, within the margin or
not), ties broken by the mean of the primary metric (oriented). Equal rank numbers are not given:
the order of norms whose verdicts tie is only their order of means, which the table shows.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normkit_lab.analysis.verdicts import BETTER, EQUIVALENT, WORSE, Verdict, decide, oriented_to_metric
from normkit_lab.stats import PairedDifference, paired_difference


@dataclass(frozen=True)
class PairVerdict:
    """`norm` against `other` in one cell: difference norm - other (metric unit) and its verdict."""

    cell: dict[str, Any]
    norm: str
    other: str
    diff: PairedDifference
    verdict: Verdict
    interval: tuple[float, float] | None = None  # the Holm-adjusted interval of norm - other the verdict used

    def as_dict(self) -> dict[str, Any]:
        d, v = self.diff, self.verdict
        return {"norm": self.norm, "vs": self.other, "n": d.n, "diff_mean": d.mean, "diff_ci95_low": d.low,
                "diff_ci95_high": d.high, "diff_adj_low": self.interval[0] if self.interval else None,
                "diff_adj_high": self.interval[1] if self.interval else None, "p_value": v.p, "p_holm": v.p_holm,
                "p_tost_holm": v.p_tost_holm, "verdict": v.verdict}


@dataclass(frozen=True)
class Rank:
    """One norm's place in its cell: significant wins, losses and equivalences over all pairs."""

    cell: dict[str, Any]
    norm: str
    rank: int
    mean: float | None
    wins: int
    losses: int
    equivalent: int


def all_pairs(cells: Sequence[tuple[dict[str, Any], Mapping[str, Mapping[int, float]]]], norms: Sequence[str],
              sign: float, margin: float) -> list[PairVerdict]:
    """Every pair of `norms` in every cell; `cells` pairs a cell with {norm: {seed: metric value}}."""
    found = []
    for cell, values in cells:
        for a, b in itertools.combinations(norms, 2):
            seeds = sorted(set(values.get(a, {})) & set(values.get(b, {})))
            diff = paired_difference([values[b][s] for s in seeds], [values[a][s] for s in seeds])
            found.append((cell, b, a, diff, [sign * (values[b][s] - values[a][s]) for s in seeds]))
    verdicts = decide([f[4] for f in found], margin)
    return [PairVerdict(cell, b, a, diff, v, oriented_to_metric(v.low, v.high, sign))
            for (cell, b, a, diff, _), v in zip(found, verdicts, strict=True)]


def _kind(verdict: str) -> str:
    return verdict.split(" (")[0]


def ranking(pairs: Sequence[PairVerdict], cells: Sequence[tuple[dict[str, Any], Mapping[str, Mapping[int, float]]]],
            norms: Sequence[str], sign: float) -> list[Rank]:
    """Per cell, the norms ordered by wins - losses, then by mean (oriented), with their counts."""
    out = []
    for cell, values in cells:
        score = {n: [0, 0, 0] for n in norms}  # wins, losses, equivalent
        for p in pairs:
            if p.cell != cell:
                continue
            kind = _kind(p.verdict.verdict)
            if kind in (BETTER, WORSE):
                winner, loser = (p.norm, p.other) if kind == BETTER else (p.other, p.norm)
                score[winner][0] += 1
                score[loser][1] += 1
            elif kind == EQUIVALENT:
                score[p.norm][2] += 1
                score[p.other][2] += 1
        means = {n: (sum(values[n].values()) / len(values[n]) if values.get(n) else None) for n in norms}
        order = sorted(norms, key=lambda n: (-(score[n][0] - score[n][1]),
                                             -(sign * means[n]) if means[n] is not None else float("inf")))
        out += [Rank(cell, n, i + 1, means[n], *score[n]) for i, n in enumerate(order)]
    return out
