"""Verdicts for representation measures (`--diagnostics`): paired by seed against the baseline.

Each run with diagnostics gives one value per measure (see `measures_of`):

    qq_r2 depth D   Q-Q R^2 of the post-norm values at norm layer D, after training (higher: closer
                    to Gaussian)
    zeta            noise sensitivity, the mean of zeta_{k,l} over the run's table (lower: more robust)
    lambda          the power-transform lambda after the last epoch, mean over layers (only norms
                    that have one; compared only where the baseline has one too)

Per (cell, norm, measure) the per-seed difference norm - baseline gets a paired t-test p (the exact
sign test with zero spread), Holm-adjusted within its family (all depths of qq_r2 are one family,
zeta one, lambda one, over every norm and cell). Verdict: "higher" or "lower" when the Holm p <
0.05, "no evidence of a difference" otherwise, and "no verdict (n<3)" with fewer than three paired
seeds. There is no equivalence test: these measures have no margin. The interval shown beside the
verdict is adjusted for the family like the comparison's (verdicts.py): the t interval at the Holm
level the measure was last tested at, so it excludes 0 exactly when the verdict is higher or lower;
the unadjusted 95% interval stays in summary.json (ci95_low/ci95_high).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from normkit_lab.analysis.verdicts import BETTER, MIN_PAIRS, NO_VERDICT, WORSE, interval95
from normkit_lab.sequential import Design, Step, analyze
from normkit_lab.stats import ALPHA, holm, paired_p

HIGHER, LOWER, NO_EVIDENCE = "higher", "lower", "no evidence of a difference"
FAMILIES = ("qq_r2", "zeta", "lambda")
MEANING = {"qq_r2": "higher = closer to Gaussian", "zeta": "lower = more robust to noise",
           "lambda": "the power transform's lambda"}


@dataclass(frozen=True)
class DiagnosticVerdict:
    """One measure of one norm in one cell against the baseline on the same seeds."""

    norm: str
    cell: dict[str, Any]
    measure: str  # "qq_r2 depth 3", "zeta", "lambda"
    family: str
    n: int
    baseline_mean: float | None
    norm_mean: float | None
    diff: float | None
    low: float | None  # the unadjusted 95% t interval
    high: float | None
    p: float | None
    p_holm: float | None
    verdict: str
    adj_low: float | None = None  # the interval adjusted for the family (Holm), the one the verdict implies
    adj_high: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"measure": self.measure, "family": self.family, "n": self.n, "baseline_mean": self.baseline_mean,
                "norm_mean": self.norm_mean, "diff": self.diff, "ci95_low": self.low, "ci95_high": self.high,
                "adj_low": self.adj_low, "adj_high": self.adj_high, "p_value": self.p, "p_holm": self.p_holm,
                "verdict": self.verdict}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def measures_of(diagnostics: Mapping[str, Any] | None) -> dict[str, tuple[str, float]]:
    """measure name -> (family, value) of one run's diagnostics extras (empty when it has none)."""
    if not diagnostics:
        return {}
    out: dict[str, tuple[str, float]] = {}
    for row in diagnostics.get("final") or []:
        if _finite(row.get("qq_r2")):
            out[f"qq_r2 depth {row['depth']}"] = ("qq_r2", float(row["qq_r2"]))
    table = (diagnostics.get("noise_robustness") or {}).get("table") or []
    zetas = [float(c["zeta"]) for c in table if _finite(c.get("zeta"))]
    if zetas:
        out["zeta"] = ("zeta", sum(zetas) / len(zetas))
    epochs = diagnostics.get("lambda") or []
    if epochs:
        means = [float(layer["mean"]) for layer in epochs[-1].get("layers") or [] if _finite(layer.get("mean"))]
        if means:
            out["lambda"] = ("lambda", sum(means) / len(means))
    return out


def diagnostic_verdicts(per_seed: Mapping[tuple[int, str], Mapping[int, Mapping[str, tuple[str, float]]]],
                        cells: Sequence[Mapping[str, Any]], norms: Sequence[str], baseline: str,
                        alpha: float = ALPHA) -> list[DiagnosticVerdict]:
    """Every (cell, norm, measure) verdict; `per_seed[(cell index, norm)][seed]` is `measures_of` a run."""
    found = []
    for i, cell in enumerate(cells):
        base = per_seed.get((i, baseline), {})
        for norm in norms:
            mine = per_seed.get((i, norm), {})
            if norm == baseline or not mine:
                continue
            names = list(dict.fromkeys(m for seed in sorted(mine) for m in mine[seed]))
            for measure in names:
                seeds = sorted(s for s in mine if measure in mine[s] and measure in base.get(s, {}))
                if not seeds:
                    continue
                a = np.array([mine[s][measure][1] for s in seeds])
                b = np.array([base[s][measure][1] for s in seeds])
                found.append((norm, dict(cell), measure, mine[seeds[0]][measure][0], a, b))
    raw = [paired_p(a - b) if a.size >= MIN_PAIRS else None for *_, a, b in found]
    adjusted: list[float | None] = [None] * len(found)
    tested: list[Step | None] = [None] * len(found)
    for family in FAMILIES:
        idx = [k for k, f in enumerate(found) if f[3] == family]
        for k, p in zip(idx, holm([raw[k] for k in idx]), strict=True):
            adjusted[k] = p
        for k, step in zip(idx, _holm_steps([found[k][4] - found[k][5] for k in idx], alpha), strict=True):
            tested[k] = step
    out = []
    for (norm, cell, measure, family, a, b), p, ph, step in zip(found, raw, adjusted, tested, strict=True):
        d = a - b
        low, high = interval95(d)
        if a.size < MIN_PAIRS or step is None:
            verdict = NO_VERDICT
        elif step.verdict.startswith((BETTER, WORSE)):  # the Holm-adjusted paired t-test (or sign test) rejected
            verdict = HIGHER if float(d.mean()) > 0 else LOWER
        else:
            verdict = NO_EVIDENCE
        shown = verdict != NO_VERDICT and step is not None
        out.append(DiagnosticVerdict(norm, cell, measure, family, int(a.size), float(b.mean()), float(a.mean()),
                                     float(d.mean()), low, high, p, ph, verdict,
                                     step.low if shown else None, step.high if shown else None))
    return out


def _holm_steps(differences: Sequence[np.ndarray], alpha: float) -> list[Step]:
    """One family's Holm-adjusted paired tests as one fixed look (normkit_lab.sequential.analyze, which the
    comparison's verdicts use too): each step's interval is the t interval at the Holm level it was last
    tested at. No margin: a zero margin never shows equivalence."""
    if not differences:
        return []
    design = Design((max(d.size for d in differences),), alpha)
    return analyze(design, differences, [0.0] * len(differences), reached=[1] * len(differences), final=True,
                   min_pairs=MIN_PAIRS)
