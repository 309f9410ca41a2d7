"""The outcome of each pre-registered hypothesis, decided by the lab's own statistics.

Nothing here computes a p-value: the verdicts come from `summary.summarize` (paired differences,
Holm, TOST), `interactions.py` (difference of gaps across a swept key), `diagnostic_verdicts.py`
(representation measures) and `verdicts.decide` (random-net shares, paired by net). This module
only reads those verdicts against the hypothesis's direction:

    reproduced       the predicted direction is significant (Holm-adjusted), or for an equivalence
                     hypothesis, equivalence within the margin is shown
    not reproduced   the data contradict the prediction: the opposite direction is significant, a
                     predicted difference is shown to be smaller than its margin (equivalent), or a
                     predicted equivalence is broken by a significant difference beyond the margin
    inconclusive     neither; the line gives the minimum detectable effect and the seeds needed
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import normkit
from normkit_lab.analysis.diagnostic_verdicts import HIGHER, LOWER, measures_of
from normkit_lab.analysis.summary import Run, Summary, cell_key, summarize
from normkit_lab.analysis.verdicts import BETTER, EQUIVALENT, NO_VERDICT, WITHIN_MARGIN, WORSE, Verdict, decide
from normkit_lab.metrics import metric_named
from normkit_lab.reproduce.preset import Hypothesis
from normkit_lab.stats import ALPHA, minimum_detectable_effect, seeds_needed

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"


@dataclass(frozen=True)
class Outcome:
    """One hypothesis's outcome; `observed` is the estimate behind it in words."""

    hypothesis: Hypothesis
    status: str
    observed: str
    mde: float | None = None
    seeds_needed: int | None = None
    unit: str = ""

    def planning(self) -> str:
        """For an inconclusive outcome, what this run could detect and how many seeds would settle it."""
        if self.status != INCONCLUSIVE:
            return ""
        mde = "unknown" if self.mde is None else f"{self.mde:.3g}{_unit(self.unit)}"
        goal = "show equivalence" if self.hypothesis.test == "equivalence" else "detect the margin"
        seeds = (f"about {self.seeds_needed} seeds would {goal}" if self.seeds_needed is not None
                 else "seeds needed: unknown (no margin, no spread or more than 1000)")
        return f"MDE {mde}, {seeds}"

    def line(self) -> str:
        """The one line printed per hypothesis, e.g. `pn-rescues-ln: reproduced (ln+pn better ...)`."""
        extra = f"; {self.planning()}" if self.planning() else ""
        return f"{self.hypothesis.name}: {self.status} ({self.observed}{extra})"

    def as_dict(self) -> dict[str, Any]:
        h = self.hypothesis
        return {"name": h.name, "test": h.test, "prediction": h.describe(), "norm": h.norm, "baseline": h.baseline,
                "metric": h.metric, "measure": h.measure, "direction": h.direction, "margin": h.margin,
                "status": self.status, "observed": self.observed, "mde": self.mde, "seeds_needed": self.seeds_needed,
                "line": self.line()}


def _unit(unit: str) -> str:
    return "" if not unit else unit if unit == "%" else f" {unit}"


def _num(value: float | None, fmt: str = "+.3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _status(significant_direction: str | None, predicted: str, shown_equal: bool) -> str:
    if significant_direction == predicted:
        return REPRODUCED
    if significant_direction is not None or shown_equal:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def _verdict_direction(verdict: Verdict, positive: str, negative: str) -> str | None:
    base = verdict.verdict.split(" (")[0]
    return positive if base == BETTER else negative if base == WORSE else None


def _paired(summary: Summary, h: Hypothesis) -> Outcome:
    """difference / equivalence: the summary row of `h.norm` in `h.cell` against `h.baseline`."""
    row = next((r for r in summary.rows if r.norm != summary.baseline and r.norm == _canon(h.norm)
                and cell_key(r.cell) == cell_key(h.cell)), None)
    unit = summary.metric.unit
    if row is None or row.verdict is None or row.vs_baseline is None:
        return Outcome(h, INCONCLUSIVE, f"no paired runs of {h.norm} and {h.baseline}", unit=unit)
    v, d = row.verdict, row.vs_baseline
    observed = (f"{h.norm} - {h.baseline} = {_num(d.mean)}{_unit(unit)} "
                f"[{_num(d.low)}, {_num(d.high)}], Holm p {_num(v.p_holm, '.3g')}, "
                f"TOST Holm p {_num(v.p_tost_holm, '.3g')}, n {v.n}; verdict {v.verdict}")
    if v.verdict == NO_VERDICT:
        return Outcome(h, INCONCLUSIVE, observed, v.mde, v.seeds_needed, unit)
    if h.test == "equivalence":
        if v.verdict == EQUIVALENT or v.verdict.endswith(WITHIN_MARGIN):
            return Outcome(h, REPRODUCED, observed, unit=unit)
        if _verdict_direction(v, "better", "worse") is not None:
            return Outcome(h, NOT_REPRODUCED, observed, unit=unit)
        return Outcome(h, INCONCLUSIVE, observed, v.mde, v.seeds_equivalence, unit)
    status = _status(_verdict_direction(v, "better", "worse"), h.direction, v.verdict == EQUIVALENT)
    if status == REPRODUCED and v.verdict.endswith(WITHIN_MARGIN):
        observed += "; real but smaller than the margin"
    return Outcome(h, status, observed, v.mde if status == INCONCLUSIVE else None,
                   v.seeds_needed if status == INCONCLUSIVE else None, unit)


def _interaction(summary: Summary, h: Hypothesis) -> Outcome:
    """interaction: the test of the gap's change between the cells at `from` and `to` of `key`."""
    unit = summary.metric.unit
    for i in summary.interactions:
        if i.norm != _canon(h.norm) or i.key != h.key:
            continue
        a, b = i.cell_a[h.key], i.cell_b[h.key]
        if {a, b} != {h.from_value, h.to_value}:
            continue
        flip = a != h.from_value  # the test runs A -> B; the hypothesis reads from -> to
        t = i.test
        mean = None if i.mean is None else (-i.mean if flip else i.mean)
        low, high = (t.low, t.high) if not flip else (None if t.high is None else -t.high,
                                                      None if t.low is None else -t.low)
        observed = (f"change of the gap {h.norm} - {h.baseline} (+ = in {h.norm}'s favour) from {h.key}="
                    f"{h.from_value} to {h.to_value}: {_num(mean)}{_unit(unit)} [{_num(low)}, {_num(high)}], "
                    f"Holm p {_num(t.p_holm, '.3g')}, n {t.n}; verdict {i.verdict}")
        if t.verdict == NO_VERDICT:
            return Outcome(h, INCONCLUSIVE, observed, t.mde, t.seeds_needed, unit)
        found = _verdict_direction(t, "shrinks" if flip else "grows", "grows" if flip else "shrinks")
        status = _status(found, h.direction, t.verdict == EQUIVALENT)
        return Outcome(h, status, observed, t.mde if status == INCONCLUSIVE else None,
                       t.seeds_needed if status == INCONCLUSIVE else None, unit)
    return Outcome(h, INCONCLUSIVE, f"no interaction test of {h.norm} across {h.key} in these runs", unit=unit)


def _diagnostic(summary: Summary, runs: Sequence[Run], h: Hypothesis) -> Outcome:
    """diagnostic (trained runs): the measure's verdicts against `h.baseline` (every depth for qq_r2)."""
    norm = _canon(h.norm)
    found = [d for d in summary.diagnostics if d.norm == norm and cell_key(d.cell) == cell_key(h.cell)
             and (d.measure == h.measure or (h.measure == "qq_r2" and d.family == "qq_r2"))]
    if not found:
        return Outcome(h, INCONCLUSIVE, f"no {h.measure} measured for {h.norm} and {h.baseline} (run with "
                                        f"diagnostics: true)")
    wanted = HIGHER if h.direction == "higher" else LOWER
    opposite = LOWER if wanted == HIGHER else HIGHER
    parts = [f"{d.measure}: {_num(d.diff)} [{_num(d.low)}, {_num(d.high)}], Holm p {_num(d.p_holm, '.3g')}"
             for d in found]
    observed = f"{h.norm} - {h.baseline}: " + "; ".join(parts)
    verdicts = [d.verdict for d in found]
    if any(v == opposite for v in verdicts):
        return Outcome(h, NOT_REPRODUCED, observed)
    if all(v == wanted for v in verdicts):
        return Outcome(h, REPRODUCED, observed)
    mde, needed = _diagnostic_planning(runs, h, [d.measure for d in found if d.verdict != wanted],
                                       family_size=sum(d.family == found[0].family for d in summary.diagnostics))
    return Outcome(h, INCONCLUSIVE, observed, mde, needed)


def _diagnostic_planning(runs: Sequence[Run], h: Hypothesis, measures: list[str],
                         family_size: int) -> tuple[float | None, int | None]:
    """The largest MDE over the undecided measures (at the strictest Holm step) and the seeds needed to
    detect the hypothesis's margin, from the per-seed differences."""
    per: dict[str, dict[int, dict[str, tuple[str, float]]]] = {}
    for r in runs:
        if r.status == "ok" and r.phase == "compare" and cell_key(r.cell) == cell_key(h.cell):
            per.setdefault(r.norm, {})[r.seed] = measures_of(r.diagnostics)
    mine, base = per.get(_canon(h.norm), {}), per.get(_canon(h.baseline), {})
    level = ALPHA / max(1, family_size)
    mdes, needed = [], []
    for measure in measures:
        d = [mine[s][measure][1] - base[s][measure][1] for s in sorted(mine)
             if measure in mine[s] and measure in base.get(s, {})]
        sd = float(np.std(d, ddof=1)) if len(d) >= 2 else None
        mdes.append(minimum_detectable_effect(sd, len(d), alpha=level))
        if h.margin is not None:
            needed.append(seeds_needed(sd, h.margin, alpha=level))
    known = [m for m in mdes if m is not None]
    counts = [n for n in needed if n is not None]
    return (max(known) if known else None,
            max(counts) if counts and len(counts) == len(needed) else None)


def _canon(spec: str) -> str:
    return normkit.parse(spec).text


def judge_compare(hypotheses: Sequence[Hypothesis], runs: Sequence[Run], norms: Sequence[str],
                  select: str = "final") -> list[Outcome]:
    """Every hypothesis of a `kind: compare` preset, read from the comparison's runs.

    Each hypothesis is summarized against its own baseline with its own metric and margin, so its
    Holm family is every norm of the run against that baseline.
    """
    out = []
    for h in hypotheses:
        metric = metric_named(h.metric or "test_acc")
        summary = summarize(runs, list(norms), _canon(h.baseline), metric, select=select, margin=h.margin)
        if h.test in ("difference", "equivalence"):
            out.append(_paired(summary, h))
        elif h.test == "interaction":
            out.append(_interaction(summary, h))
        else:
            out.append(_diagnostic(summary, runs, h))
    return out


def judge_random_net(hypotheses: Sequence[Hypothesis],
                     runs: Mapping[str, Sequence[Sequence[Mapping[str, float]]]]) -> list[Outcome]:
    """Every hypothesis of a `kind: random-net` preset: per net (seed), the dataset share at the
    hypothesis's depth, norm minus baseline, decided by `verdicts.decide` with Holm over the preset's
    hypotheses (oriented so that + = in the predicted direction's sense of "lower"/"higher")."""
    oriented, raw = [], []
    for h in hypotheses:
        a, b = runs[_canon_key(runs, h.norm)], runs[_canon_key(runs, h.baseline)]
        d = [net_a[h.depth - 1]["dataset"] - net_b[h.depth - 1]["dataset"] for net_a, net_b in zip(a, b, strict=True)]
        raw.append(d)
        oriented.append([x if h.direction == "higher" else -x for x in d])  # + = the predicted direction
    out = []
    for k, h in enumerate(hypotheses):
        v = decide(oriented, h.margin or 0.0)[k]
        d = np.asarray(raw[k])
        mean_a = float(np.mean([net[h.depth - 1]["dataset"] for net in runs[_canon_key(runs, h.norm)]]))
        mean_b = float(np.mean([net[h.depth - 1]["dataset"] for net in runs[_canon_key(runs, h.baseline)]]))
        low, high = (v.low, v.high) if h.direction == "higher" else (
            None if v.high is None else -v.high, None if v.low is None else -v.low)
        observed = (f"dataset share at depth {h.depth}: {h.norm} {mean_a:.3f}, {h.baseline} {mean_b:.3f}, "
                    f"difference {float(d.mean()):+.3f} [{_num(low)}, {_num(high)}], Holm p "
                    f"{_num(v.p_holm, '.3g')}, {v.n} nets")
        if v.verdict == NO_VERDICT:
            out.append(Outcome(h, INCONCLUSIVE, observed, v.mde, v.seeds_needed))
            continue
        found = _verdict_direction(v, h.direction, "lower" if h.direction == "higher" else "higher")
        status = _status(found, h.direction, v.verdict == EQUIVALENT)
        out.append(Outcome(h, status, observed, v.mde if status == INCONCLUSIVE else None,
                           v.seeds_needed if status == INCONCLUSIVE else None))
    return out


def _canon_key(runs: Mapping[str, Any], spec: str) -> str:
    """The key of `runs` that is the spec `spec` (keys are the specs as given in the preset)."""
    text = _canon(spec)
    for key in runs:
        if _canon(key) == text:
            return key
    raise KeyError(spec)
