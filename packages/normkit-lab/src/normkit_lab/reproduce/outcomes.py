"""The outcome of each pre-registered hypothesis, decided by the lab's own statistics and its margin.

No new test is invented here: compared runs are read through `summary.summarize` (paired
differences, Holm, TOST) and `interactions.py` (difference of gaps across a swept key); diagnostic
measures and random-net shares are paired by seed and decided by `verdicts.decide` with Holm over
the preset's hypotheses of that kind. What this module adds is the reading against the hypothesis:
its direction and its margin, the smallest effect the preset said matters.

    reproduced       the predicted direction is significant (Holm-adjusted) and the estimate is at
                     least the margin; for an equivalence hypothesis, equivalence within the margin
                     is shown (TOST, or the 95% interval inside it)
    below margin     the predicted direction is significant, but the estimate is smaller than the
                     margin: a real effect, smaller than what the preset called one that matters
    not reproduced   the data contradict the prediction: the opposite direction is significant, a
                     predicted difference is shown to be smaller than its margin (equivalent), or a
                     predicted equivalence is broken by a significant difference at or beyond the margin
    not attributed   the predicted effect is shown (as for `reproduced`), but a control the preset
                     names for the claim's stated cause (`controls:`) does not hold, so the design
                     does not attribute the effect to that cause
    inconclusive     neither; the line gives the minimum detectable effect and the seeds needed

Equivalence (an equivalence hypothesis shown, or a predicted difference shown smaller than its
margin) is claimed only when the design could have detected a difference of the margin's size: its
minimum detectable effect, from the run's own paired spread at the verdict's alpha and 80% power,
is at most the margin; otherwise the outcome is inconclusive and its line says so.

A hypothesis labelled `extension` or `prediction` (not a paper's reported result) prints
`supported` / `not supported` in place of `reproduced` / `not reproduced`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import normkit
from normkit_lab.analysis.diagnostic_verdicts import measures_of
from normkit_lab.analysis.summary import Run, Summary, cell_key, summarize
from normkit_lab.analysis.verdicts import (
    BETTER,
    EQUIVALENT,
    NO_VERDICT,
    WITHIN_MARGIN,
    WORSE,
    Verdict,
    decide,
    decision_p,
    p_column,
)
from normkit_lab.metrics import metric_named
from normkit_lab.reproduce.preset import REPRODUCTION, Hypothesis

REPRODUCED, BELOW_MARGIN, NOT_REPRODUCED, NOT_ATTRIBUTED, INCONCLUSIVE = (
    "reproduced", "below margin", "not reproduced", "not attributed", "inconclusive")
STATUSES = (REPRODUCED, BELOW_MARGIN, NOT_REPRODUCED, NOT_ATTRIBUTED, INCONCLUSIVE)
_OTHER_WORDS = {REPRODUCED: "supported", NOT_REPRODUCED: "not supported"}


@dataclass(frozen=True)
class Outcome:
    """One hypothesis's outcome; `observed` is the estimate behind it in words."""

    hypothesis: Hypothesis
    status: str
    observed: str
    mde: float | None = None
    seeds_needed: int | None = None
    unit: str = ""
    settled_by: str = ""  # the control whose inconclusive outcome leaves this one open (its MDE and seeds)

    @property
    def word(self) -> str:
        """The status as printed: `supported` for `reproduced` when the hypothesis is not a paper's result."""
        if self.hypothesis.label == REPRODUCTION:
            return self.status
        return _OTHER_WORDS.get(self.status, self.status)

    def planning(self) -> str:
        """For an inconclusive outcome, what this run could detect and how many seeds would settle it."""
        if self.status != INCONCLUSIVE:
            return ""
        mde = "unknown" if self.mde is None else f"{self.mde:.3g}{_unit(self.unit)}"
        goal = ("settle its control" if self.settled_by else "show equivalence"
                if self.hypothesis.test == "equivalence" else "detect the margin")
        seeds = (f"about {self.seeds_needed} seeds would {goal}" if self.seeds_needed is not None
                 else "seeds needed: unknown (no spread, or more than 1000)")
        return f"{'MDE' if not self.settled_by else f'control {self.settled_by}: MDE'} {mde}, {seeds}"

    def line(self) -> str:
        """The one line printed per hypothesis, e.g. `pn-rescues-ln: reproduced (ln+pn - ln = ...)`."""
        extra = f"; {self.planning()}" if self.planning() else ""
        return f"{self.hypothesis.name}: {self.word} ({self.observed}{extra})"

    def as_dict(self) -> dict[str, Any]:
        h = self.hypothesis
        return {"name": h.name, "label": h.label, "test": h.test, "prediction": h.describe(), "norm": h.norm,
                "baseline": h.baseline, "metric": h.metric, "measure": h.measure, "since": h.since,
                "direction": h.direction, "margin": h.margin, "status": self.status, "outcome": self.word,
                "controls": list(h.controls), "observed": self.observed, "mde": self.mde,
                "seeds_needed": self.seeds_needed, "line": self.line()}


def _unit(unit: str) -> str:
    return "" if not unit else unit if unit == "%" else f" {unit}"


def _num(value: float | None, fmt: str = "+.3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def classify(found: str | None, predicted: str, size: float | None, margin: float, shown_equal: bool) -> str:
    """The status from a significant direction `found` (None: nothing significant), the estimate's size
    in the predicted direction (`size`, + = as predicted) and whether equivalence within the margin
    was shown."""
    if found == predicted:
        return REPRODUCED if size is not None and size >= margin else BELOW_MARGIN
    if found is not None or shown_equal:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def _margin_note(status: str, margin: float, unit: str) -> str:
    if status == BELOW_MARGIN:
        return f"; significant, but the estimate is smaller than the margin {margin:g}{_unit(unit)}"
    return ""


def _verdict_direction(verdict: Verdict, positive: str, negative: str) -> str | None:
    base = verdict.verdict.split(" (")[0]
    return positive if base == BETTER else negative if base == WORSE else None


def detects_margin(v: Verdict, margin: float, unit: str = "", scale: float = 1.0) -> tuple[bool, str]:
    """Whether the design could have detected a difference of the margin's size, and why in words: its
    minimum detectable effect (two-sided at the verdict's planning alpha, 80% power, from the run's
    own paired spread; `scale` turns a margin-scaled verdict's MDE back into the measure's unit)
    against the margin. An equivalence is claimed only when it could: a design too noisy to see
    the margin would find 'no difference' whatever the truth."""
    margin_text = f"the margin {margin:g}{_unit(unit)}"
    if v.mde is None:
        return False, (f"the smallest difference this design detects is unknown (no spread between the "
                       f"{v.n} paired seeds), so it cannot show that a difference of {margin_text} would "
                       f"have been found; equivalence is not claimed")
    mde = v.mde * scale
    words = (f"the smallest difference this design detects is {mde:.3g}{_unit(unit)} (alpha "
             f"{v.planning_alpha:.3g}, power 0.8, {v.n} paired seeds)")
    if mde <= margin:
        return True, f"{words}, within {margin_text}: a difference of the margin's size would have been found"
    return False, (f"{words}, more than {margin_text}: this design cannot detect a difference of the "
                   f"margin's size, so equivalence is not claimed")


def _outcome(h: Hypothesis, status: str, observed: str, v: Verdict, unit: str, scale: float = 1.0) -> Outcome:
    """An Outcome with the planning numbers (scaled back to the metric's unit) when inconclusive; an
    equivalence needs both a passing TOST and an MDE within the margin, so it gets the larger count."""
    if status != INCONCLUSIVE:
        return Outcome(h, status, observed + _margin_note(status, h.margin, unit), unit=unit)
    seeds = v.seeds_needed
    if h.test == "equivalence":
        seeds = None if None in (v.seeds_equivalence, v.seeds_needed) else max(v.seeds_equivalence, v.seeds_needed)
    return Outcome(h, status, observed, None if v.mde is None else v.mde * scale, seeds, unit)


def _paired(summary: Summary, h: Hypothesis) -> Outcome:
    """difference / equivalence: the summary row of `h.norm` in `h.cell` against `h.baseline`."""
    row = next((r for r in summary.rows if r.norm != summary.baseline and r.norm == _canon(h.norm)
                and cell_key(r.cell) == cell_key(h.cell)), None)
    unit = summary.metric.unit
    if row is None or row.verdict is None or row.vs_baseline is None:
        return Outcome(h, INCONCLUSIVE, f"no paired runs of {h.norm} and {h.baseline}", unit=unit)
    v, d = row.verdict, row.vs_baseline
    low, high = row.interval or (None, None)  # adjusted for the family (and looks): the one the verdict implies
    tost = "" if v.look is not None else f"TOST Holm p {_num(v.p_tost_holm, '.3g')}, "
    observed = (f"{h.norm} - {h.baseline} = {_num(d.mean)}{_unit(unit)} "
                f"[{_num(low)}, {_num(high)}] adj., {p_column([v])} {decision_p(v) or '-'}, "
                f"{tost}n {v.n}; verdict {v.verdict}")
    if v.verdict == NO_VERDICT:
        return _outcome(h, INCONCLUSIVE, observed, v, unit)
    better = None if d.mean is None else d.mean * (1 if summary.metric.higher_is_better else -1)
    found = _verdict_direction(v, "better", "worse")
    if h.test == "equivalence":
        if v.verdict == EQUIVALENT or v.verdict.endswith(WITHIN_MARGIN):
            powered, note = detects_margin(v, h.margin, unit)
            return _outcome(h, REPRODUCED if powered else INCONCLUSIVE, f"{observed}; {note}", v, unit)
        if found is not None and better is not None and abs(better) >= h.margin:
            return _outcome(h, NOT_REPRODUCED, observed, v, unit)
        return _outcome(h, INCONCLUSIVE, observed, v, unit)
    size = None if better is None else better if h.direction == "better" else -better
    shown_equal, observed = _equal_if_powered(v, h.margin, unit, observed)
    return _outcome(h, classify(found, h.direction, size, h.margin, shown_equal), observed, v, unit)


def _equal_if_powered(v: Verdict, margin: float, unit: str, observed: str, scale: float = 1.0) -> tuple[bool, str]:
    """For a difference hypothesis: whether its verdict shows the effect smaller than the margin (TOST
    equivalence, and a design able to detect the margin), with the power note added to `observed`
    whenever the verdict is an equivalence."""
    if v.verdict != EQUIVALENT:
        return False, observed
    powered, note = detects_margin(v, margin, unit, scale)
    return powered, f"{observed}; {note}"


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
                    f"{h.from_value} to {h.to_value}: {_num(mean)}{_unit(unit)} [{_num(low)}, {_num(high)}] adj., "
                    f"Holm p {_num(t.p_holm, '.3g')}, n {t.n}; verdict {i.verdict}")
        if t.verdict == NO_VERDICT:
            return _outcome(h, INCONCLUSIVE, observed, t, unit)
        found = _verdict_direction(t, "shrinks" if flip else "grows", "grows" if flip else "shrinks")
        size = None if mean is None else mean if h.direction == "grows" else -mean
        shown_equal, observed = _equal_if_powered(t, h.margin, unit, observed)
        status = classify(found, h.direction, size, h.margin, shown_equal)
        return _outcome(h, status, observed, t, unit)
    return Outcome(h, INCONCLUSIVE, f"no interaction test of {h.norm} across {h.key} in these runs", unit=unit)


def run_measures(diagnostics: Mapping[str, Any] | None, since: str | None) -> dict[str, float]:
    """measure name -> value of one run's diagnostics: after training, or (since="init") its change from
    initialization, final minus init, for the measures recorded at both (qq_r2 per depth, zeta)."""
    final = {name: value for name, (_, value) in measures_of(diagnostics).items()}
    if since is None or not diagnostics:
        return final
    init = {name: value for name, (_, value) in measures_of(
        {"final": diagnostics.get("init"), "noise_robustness": diagnostics.get("init_noise_robustness")}).items()}
    return {name: final[name] - init[name] for name in final if name in init}


def _measure_names(h: Hypothesis, available: Sequence[str]) -> list[str]:
    if h.measure == "qq_r2":
        return sorted((m for m in available if m.startswith("qq_r2 depth ")), key=lambda m: int(m.rsplit(" ", 1)[1]))
    return [h.measure] if h.measure in available else []


def _diagnostic_differences(h: Hypothesis, runs: Sequence[Run]) -> dict[str, list[float]]:
    """Per measure of the hypothesis, the per-seed differences norm - baseline (paired by seed)."""
    per: dict[str, dict[int, dict[str, float]]] = {}
    for r in runs:
        if r.status == "ok" and r.phase == "compare" and cell_key(r.cell) == cell_key(h.cell):
            per.setdefault(r.norm, {})[r.seed] = run_measures(r.diagnostics, h.since)
    mine, base = per.get(_canon(h.norm), {}), per.get(_canon(h.baseline), {})
    seeds = sorted(s for s in mine if s in base)
    names = _measure_names(h, [m for s in seeds for m in mine[s] if m in base[s]])
    return {m: [mine[s][m] - base[s][m] for s in seeds if m in mine[s] and m in base[s]]
            for m in dict.fromkeys(names)}


def _judge_measures(items: list[tuple[Hypothesis, str, list[float]]]) -> list[tuple[str, Verdict, list[float], str]]:
    """Each (hypothesis, measure, differences) decided, Holm over all of them; differences oriented
    (+ = the predicted direction) and divided by the hypothesis's margin, so one `decide` call serves
    every margin (paired t p-values do not change with the scale; TOST against 1 is TOST against the
    margin). Returns (status, verdict, raw differences, power note of an equivalence) per item."""
    oriented = [[x / h.margin * (1 if h.direction == "higher" else -1) for x in d] for h, _, d in items]
    verdicts = decide(oriented, 1.0)
    out = []
    for (h, _, d), v in zip(items, verdicts, strict=True):
        found = _verdict_direction(v, h.direction, "lower" if h.direction == "higher" else "higher")
        size = float(np.mean(d)) * (1 if h.direction == "higher" else -1) if d else None
        shown_equal, note = _equal_if_powered(v, h.margin, "", "", scale=h.margin)
        status = INCONCLUSIVE if v.verdict == NO_VERDICT else classify(found, h.direction, size, h.margin,
                                                                       shown_equal)
        out.append((status, v, d, note))
    return out


def _combined(statuses: Sequence[str]) -> str:
    """One status for a hypothesis read at several measures (qq_r2 at every depth): every one must hold."""
    if any(s == NOT_REPRODUCED for s in statuses):
        return NOT_REPRODUCED
    if all(s == REPRODUCED for s in statuses):
        return REPRODUCED
    if all(s in (REPRODUCED, BELOW_MARGIN) for s in statuses):
        return BELOW_MARGIN
    return INCONCLUSIVE


def _judge_diagnostics(hypotheses: Sequence[Hypothesis], runs: Sequence[Run]) -> list[Outcome]:
    """Every diagnostic hypothesis of trained runs (in order), Holm over all their measures together."""
    items = [(h, m, d) for h in hypotheses for m, d in _diagnostic_differences(h, runs).items()]
    judged = _judge_measures(items) if items else []
    out = []
    for h in hypotheses:
        mine = [(m, j) for (owner, m, _), j in zip(items, judged, strict=True) if owner is h]
        if not mine:
            out.append(Outcome(h, INCONCLUSIVE, f"no {h.measure} measured for {h.norm} and {h.baseline}"
                                                   + (" at initialization" if h.since else "")
                                                   + " (run with diagnostics: true)"))
            continue
        parts = [f"{m}: {float(np.mean(d)):+.3f} [{_num(_raw(v, h)[0])}, {_num(_raw(v, h)[1])}] adj., "
                 f"Holm p {_num(v.p_holm, '.3g')}{note.replace('; ', ' (', 1) + ')' if note else ''}"
                 for m, (_, v, d, note) in mine]
        since = " (change from initialization)" if h.since else ""
        observed = f"{h.norm} - {h.baseline}{since}: " + "; ".join(parts)
        status = _combined([s for _, (s, _, _, _) in mine])
        if status != INCONCLUSIVE:
            out.append(Outcome(h, status, observed + _margin_note(status, h.margin, "")))
            continue
        undecided = [v for _, (s, v, _, _) in mine if s == INCONCLUSIVE]
        mdes = [v.mde * h.margin for v in undecided if v.mde is not None]
        seeds = [v.seeds_needed for v in undecided]
        out.append(Outcome(h, status, observed, max(mdes) if mdes else None,
                           max(seeds) if seeds and None not in seeds else None))
    return out


def _raw(v: Verdict, h: Hypothesis) -> tuple[float | None, float | None]:
    """The adjusted interval of an oriented, margin-scaled verdict (the one it implies: Holm over the preset's
    measures) back in the measure's units (norm - baseline)."""
    if v.low is None or v.high is None:
        return None, None
    if h.direction == "higher":
        return v.low * h.margin, v.high * h.margin
    return -v.high * h.margin, -v.low * h.margin


def _canon(spec: str) -> str:
    return normkit.parse(spec).text


def judge_compare(hypotheses: Sequence[Hypothesis], runs: Sequence[Run], norms: Sequence[str],
                  select: str = "final") -> list[Outcome]:
    """Every hypothesis of a `kind: compare` preset, read from the comparison's runs.

    A difference, equivalence or interaction hypothesis is summarized against its own baseline with
    its own metric and margin, so its Holm family is every norm of the run against that baseline;
    the diagnostic hypotheses form one Holm family over all their measures.
    """
    diagnostics = iter(_judge_diagnostics([h for h in hypotheses if h.test == "diagnostic"], runs))
    out = []
    for h in hypotheses:
        if h.test == "diagnostic":
            out.append(next(diagnostics))
            continue
        metric = metric_named(h.metric or "test_acc")
        summary = summarize(runs, list(norms), _canon(h.baseline), metric, select=select, margin=h.margin)
        out.append(_paired(summary, h) if h.test in ("difference", "equivalence") else _interaction(summary, h))
    return attribute(out)


def judge_random_net(hypotheses: Sequence[Hypothesis],
                     runs: Mapping[str, Sequence[Sequence[Mapping[str, float]]]]) -> list[Outcome]:
    """Every hypothesis of a `kind: random-net` preset: per net (seed), the dataset share at the
    hypothesis's depth, norm minus baseline, paired by net, Holm over the preset's hypotheses."""
    items = []
    for h in hypotheses:
        a, b = runs[_canon_key(runs, h.norm)], runs[_canon_key(runs, h.baseline)]
        d = [net_a[h.depth - 1]["dataset"] - net_b[h.depth - 1]["dataset"] for net_a, net_b in zip(a, b, strict=True)]
        items.append((h, f"dataset share at depth {h.depth}", d))
    out = []
    for (h, _, d), (status, v, _, note) in zip(items, _judge_measures(items), strict=True):
        mean_a = float(np.mean([net[h.depth - 1]["dataset"] for net in runs[_canon_key(runs, h.norm)]]))
        mean_b = float(np.mean([net[h.depth - 1]["dataset"] for net in runs[_canon_key(runs, h.baseline)]]))
        low, high = _raw(v, h)
        observed = (f"dataset share at depth {h.depth}: {h.norm} {mean_a:.3f}, {h.baseline} {mean_b:.3f}, "
                    f"difference {float(np.mean(d)):+.3f} [{_num(low)}, {_num(high)}] adj., Holm p "
                    f"{_num(v.p_holm, '.3g')}, {v.n} nets{note}")
        if status != INCONCLUSIVE:
            out.append(Outcome(h, status, observed + _margin_note(status, h.margin, "")))
        else:
            out.append(Outcome(h, status, observed, None if v.mde is None else v.mde * h.margin, v.seeds_needed))
    return attribute(out)


def attribute(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Each outcome read with the controls its hypothesis names (`controls:`, the arms that test the
    cause the claim states): an effect shown in the data is `reproduced` only when every control
    holds; a control that does not hold (not supported, or below its margin) makes it `not
    attributed`, an inconclusive control leaves it inconclusive with the control's planning numbers.
    An outcome that is not `reproduced` on its own data stays as it is: a control cannot rescue it."""
    by_name = {o.hypothesis.name: o for o in outcomes}
    out = []
    for o in outcomes:
        controls = [by_name[name] for name in o.hypothesis.controls if name in by_name]
        if o.status != REPRODUCED or not controls:
            out.append(o)
            continue
        failed = [c for c in controls if c.status in (NOT_REPRODUCED, NOT_ATTRIBUTED, BELOW_MARGIN)]
        open_ = [c for c in controls if c.status == INCONCLUSIVE]
        said = ", ".join(f"{c.hypothesis.name} {c.word}" for c in controls)
        if failed:
            out.append(replace(o, status=NOT_ATTRIBUTED, observed=(
                f"{o.observed}; controls: {said}, so the design does not attribute the effect to the "
                f"claim's stated cause")))
        elif open_:
            first = max(open_, key=lambda c: math.inf if c.seeds_needed is None else c.seeds_needed)
            out.append(replace(o, status=INCONCLUSIVE, mde=first.mde, seeds_needed=first.seeds_needed,
                               unit=first.unit, settled_by=first.hypothesis.name, observed=(
                                   f"{o.observed}; controls: {said}, so the design cannot yet attribute "
                                   f"the effect to the claim's stated cause")))
        else:
            out.append(replace(o, observed=f"{o.observed}; controls: {said}"))
    return out


def _canon_key(runs: Mapping[str, Any], spec: str) -> str:
    """The key of `runs` that is the spec `spec` (keys are the specs as given in the preset)."""
    text = _canon(spec)
    for key in runs:
        if _canon(key) == text:
            return key
    raise KeyError(spec)
