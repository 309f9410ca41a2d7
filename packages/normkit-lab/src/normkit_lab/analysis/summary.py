"""Per-(cell, norm) summary of a comparison: the rows of summary.csv/json, the table and report.html.

The input is runs.jsonl rows (or RunResults, turned into the same rows), so results written by any
version read alike: rows without `cell`/`tuned`/`phase` are one cell of the comparison phase, and
results without `test_acc` (written before the test split) fall back to `val_acc`, with a note.
Statistics use the primary metric of every run that finished ("ok"); diverged and failed runs are
counted, not averaged. Differences to the baseline pair runs by seed within a cell, over the seeds
where both norms finished; the verdicts are Holm-adjusted over every comparison of the run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from normkit_lab.analysis.ablations import StageTest, declared_ablations, stage_tests
from normkit_lab.analysis.diagnostic_verdicts import DiagnosticVerdict, diagnostic_verdicts, measures_of
from normkit_lab.analysis.interactions import Interaction, interactions
from normkit_lab.analysis.pairs import PairVerdict, Rank, all_pairs, ranking
from normkit_lab.analysis.verdicts import BASELINE, Verdict, decide, oriented_to_metric
from normkit_lab.errors import ConfigError
from normkit_lab.metrics import METRICS, Metric, run_value
from normkit_lab.records import RunResult
from normkit_lab.sequential import Design, looks_reached
from normkit_lab.stats import MeanSem, PairedDifference, mean_sem, paired_difference
from normkit_lab.store.results import group_runs, run_rows

COMPARE_PHASE = "compare"


@dataclass(frozen=True)
class Run:
    """One run as the summary sees it: its identity, status and epoch rows (dicts of runs.jsonl)."""

    norm: str
    seed: int
    status: str
    params: int | None
    cell: dict[str, Any] = field(default_factory=dict)
    tuned: dict[str, Any] = field(default_factory=dict)
    phase: str = COMPARE_PHASE
    error: str | None = None
    epochs: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: dict[str, Any] | None = None  # the --diagnostics extras, when the run has them


def cell_key(cell: Mapping[str, Any]) -> str:
    """A stable text key of a cell (its swept values), `{}` for the single cell of a plain run."""
    return json.dumps(dict(cell), sort_keys=True)


def cell_label(cell: Mapping[str, Any]) -> str:
    """`lr=0.05, batch_size=64`, or "" for no swept values."""
    return ", ".join(f"{k}={v}" for k, v in cell.items())


def interval_text(low: float | None, high: float | None, fmt: str = ".2f", missing: str = "") -> str:
    """`[-1.23, +0.45]` for a 95% interval, `missing` where it has no bounds (tables and report.html)."""
    return missing if low is None or high is None else f"[{low:+{fmt}}, {high:+{fmt}}]"


def runs_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Run]:
    """Runs.jsonl rows as runs (grouped by `results.group_runs`, the store's one grouping by run identity),
    in the order runs first appeared."""
    rows = list(rows)
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get("norm"), str) or not isinstance(row.get("seed"), int):
            raise ConfigError(f"runs.jsonl row {number} has no norm or seed; the file was edited or damaged, "
                              f"so fix or remove that row")
    runs = []
    for run_id, group in group_runs(rows).items():  # type: ignore[arg-type]
        last = group[-1]
        runs.append(Run(norm=run_id.norm, seed=run_id.seed, status=last.get("status") or "ok",
                        params=last.get("params"), cell=dict(last.get("cell") or {}),
                        tuned=dict(last.get("tuned") or {}),
                        phase=run_id.phase, error=last.get("error") or (last.get("extras") or {}).get("error"),
                        epochs=[dict(r) for r in group if r.get("epoch") is not None],
                        diagnostics=(last.get("extras") or {}).get("diagnostics")))
    return runs


def runs_from_results(results: Iterable[RunResult]) -> list[Run]:
    """The same view of in-memory RunResults (through their runs.jsonl rows)."""
    return runs_from_rows(row for result in results for row in run_rows(result, {}))


@dataclass(frozen=True)
class NormSummary:
    """The summary of one norm in one cell; `vs_baseline` and `verdict` are None for the baseline."""

    norm: str
    cell: dict[str, Any]
    tuned: dict[str, Any]
    runs: int
    diverged: int
    failed: int
    errors: list[str]
    values: dict[int, float]  # primary metric per finished seed
    primary: MeanSem
    best_val_acc: MeanSem  # best validation accuracy over epochs (%), for reference only
    vs_baseline: PairedDifference | None
    verdict: Verdict | None
    time_per_epoch_s: float | None  # median over all epochs of all runs
    throughput: float | None  # median train samples/s over all epochs
    peak_mem_mb: float | None  # largest peak over all epochs
    params: int | None
    cpu_time_per_epoch_s: float | None = None  # median process CPU time of the training passes
    steps: int | None = None  # optimizer steps of a finished run (the median; they differ only if runs stopped)
    load_max: float | None = None  # the highest 1-minute load average at the end of any epoch
    cores: int | None = None  # the cores the runs could use
    # the interval the verdict implies (norm - baseline, metric unit): adjusted for the family (Holm) and,
    # with sequential seeds, for the looks; excludes 0 exactly when a difference is shown (verdicts.py)
    interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class Summary:
    """Every (cell, norm) summary of a comparison and how its primary metric was chosen."""

    rows: list[NormSummary]
    baseline: str
    metric: Metric
    source: str  # the record field actually used (the metric's, or its fallback)
    select: str
    margin: float
    notes: list[str]
    interactions: list[Interaction] = field(default_factory=list)  # sweeps only: see interactions.py
    diagnostics: list[DiagnosticVerdict] = field(default_factory=list)  # --diagnostics runs only
    pairs: list[PairVerdict] = field(default_factory=list)  # --all-pairs only: see pairs.py
    ranks: list[Rank] = field(default_factory=list)
    ablations: list[StageTest] = field(default_factory=list)  # --ablate only: see ablations.py

    @property
    def label(self) -> str:
        """What the values are: the metric's label, or its fallback's when that was used."""
        return METRICS[self.source].label if self.source in METRICS else self.metric.label

    def as_rows(self) -> list[dict[str, Any]]:
        """Flat rows for summary.csv/json (the keys are a contract: see docs/experiments.md)."""
        return [self._row(s) for s in self.rows]

    def interactions_of(self, s: NormSummary) -> list[dict[str, Any]]:
        """The interaction tests that end at this row's cell (cell B of the pair), as dicts."""
        return [i.as_dict() for i in self.interactions if i.norm == s.norm and cell_key(i.cell_b) == cell_key(s.cell)]

    def _row(self, s: NormSummary) -> dict[str, Any]:
        d, v = s.vs_baseline, s.verdict
        percent = self.metric.unit == "%"
        return {
            "norm": s.norm, "cell": s.cell, "tuned": s.tuned,
            "runs": s.runs, "ok": s.primary.n, "diverged": s.diverged, "failed": s.failed,
            "metric": self.metric.field, "metric_source": self.source, "higher_is_better":
                self.metric.higher_is_better, "select": self.select,
            "metric_mean": s.primary.mean, "metric_sem": s.primary.sem,
            "acc_mean": s.primary.mean if percent else None, "acc_sem": s.primary.sem if percent else None,
            "best_acc_mean": s.best_val_acc.mean, "best_acc_sem": s.best_val_acc.sem,
            "baseline": self.baseline, "diff_n": d.n if d else None, "diff_mean": d.mean if d else None,
            "diff_sd": d.sd if d else None,
            "diff_ci95_low": d.low if d else None, "diff_ci95_high": d.high if d else None,
            "diff_p_value": d.p_value if d else None, "diff_note": d.note if d else "baseline",
            "diff_adj_low": s.interval[0] if s.interval else None,
            "diff_adj_high": s.interval[1] if s.interval else None,
            "adj_level": v.level if v else None, "look": v.look if v else None, "stop": v.stop if v else "",
            "verdict": v.verdict if v else BASELINE, "p_holm": v.p_holm if v else None,
            "p_tost": v.p_tost if v else None, "p_tost_holm": v.p_tost_holm if v else None,
            "look_p": v.look_p if v else None, "look_alpha": v.look_alpha if v else None,
            "look_tost_p": v.look_tost_p if v else None, "look_tost_alpha": v.look_tost_alpha if v else None,
            "margin": self.margin, "mde": v.mde if v else None,
            "seeds_needed": v.seeds_needed if v else None, "seeds_note": v.seeds_note if v else "",
            "seeds_equivalence": v.seeds_equivalence if v else None,
            "planning_alpha": v.planning_alpha if v else None,
            "time_per_epoch_s": s.time_per_epoch_s, "cpu_time_per_epoch_s": s.cpu_time_per_epoch_s,
            "steps": s.steps, "load_avg_max": s.load_max, "cores": s.cores, "throughput_samples_s": s.throughput,
            "peak_mem_mb": s.peak_mem_mb, "params": s.params,
            "interactions": self.interactions_of(s),
            "diagnostic_verdicts": [d.as_dict() for d in self.diagnostics
                                    if d.norm == s.norm and cell_key(d.cell) == cell_key(s.cell)],
            "ablations": [t.as_dict() for t in self.ablations
                          if t.ablation.norm == s.norm and cell_key(t.cell) == cell_key(s.cell)],
            **self._rank_of(s),
        }

    def _rank_of(self, s: NormSummary) -> dict[str, Any]:
        """--all-pairs: the row's rank, wins/losses/equivalences and its pairs against earlier norms."""
        rank = next((r for r in self.ranks if r.norm == s.norm and cell_key(r.cell) == cell_key(s.cell)), None)
        return {"rank": rank.rank if rank else None, "wins": rank.wins if rank else None,
                "losses": rank.losses if rank else None, "equivalent_to": rank.equivalent if rank else None,
                "pairs": [p.as_dict() for p in self.pairs
                          if p.norm == s.norm and cell_key(p.cell) == cell_key(s.cell)]}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _has(runs: Sequence[Run], name: str) -> bool:
    return any(isinstance(e.get(name), (int, float)) for r in runs if r.status == "ok" for e in r.epochs)


def source_field(runs: Sequence[Run], metric: Metric, select: str) -> tuple[str, list[str]]:
    """The field to read (the metric's, or its fallback when no run has it) and the notes to show."""
    if _has(runs, metric.field) or metric.fallback is None or not _has(runs, metric.fallback):
        return metric.field, []
    optimistic = ("; with select: best-val the same data also picked the epoch, so the values are optimistic"
                  if select == "best-val" else "")
    return metric.fallback, [f"these results have no {metric.field} (written before the test split): "
                             f"{metric.fallback} is reported instead{optimistic}"]


def _best_val_acc(run: Run) -> float | None:
    values = [e["val_acc"] for e in run.epochs if isinstance(e.get("val_acc"), (int, float))]
    return 100.0 * max(values) if values else None


def _cells(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The cells in the order they first appear (the single `{}` cell when there are none)."""
    seen: dict[str, dict[str, Any]] = {}
    for run in runs:
        seen.setdefault(cell_key(run.cell), run.cell)
    return list(seen.values()) or [{}]


def summarize(runs: Sequence[Run], norms: Sequence[str], baseline: str, metric: Metric,
              select: str = "final", margin: float | None = None, pairs: bool = False,
              design: Design | None = None, seeds: Sequence[int] = (), final: bool = False) -> Summary:
    """One NormSummary per (cell, norm) (cells in order of appearance, norms in `norms` order).

    Only comparison-phase runs count (tuning runs are on other seeds and pick hyperparameters).
    `pairs`: also compare every pair of norms and rank them (`--all-pairs`, see pairs.py).
    `design`: sequential seeds (normkit_lab.sequential) over `seeds` in the order they are added; a
    comparison has reached the looks whose seeds both its norms have recorded runs for (any status);
    `final`: the budget ended the rounds (looks.json).
    """
    runs = [r for r in runs if r.phase == COMPARE_PHASE]
    margin = metric.default_margin if margin is None else margin
    source, notes = source_field(runs, metric, select)
    partial: list[dict[str, Any]] = []
    per_cell: list[tuple[dict[str, Any], dict[str, dict[int, float]]]] = []
    ablations = declared_ablations(norms, {r.norm for r in runs})
    arm_values: list[tuple[dict[str, Any], dict[str, dict[int, float]]]] = []
    for cell in _cells(runs):
        ck = cell_key(cell)
        # in seed order, so every mean is the same whatever order the runs finished in (parallel executors)
        in_cell = sorted((r for r in runs if cell_key(r.cell) == ck), key=lambda r: r.seed)
        values: dict[str, dict[int, float]] = {norm: {} for norm in norms}
        unread: dict[str, list[int]] = {}  # ok runs without a value of `source` at their selected epoch
        arms: dict[str, dict[int, float]] = {a.arm: {} for a in ablations}
        for run in in_cell:
            if run.norm in arms and run.status == "ok":
                value = run_value(run.epochs, metric, select, source)
                if value is not None:
                    arms[run.norm][run.seed] = value
            value = run_value(run.epochs, metric, select, source) if run.status == "ok" else None
            if value is not None and run.norm in values:
                values[run.norm][run.seed] = value
            elif run.status == "ok" and run.norm in values:  # never silently one seed fewer
                unread.setdefault(run.norm, []).append(run.seed)
        per_cell.append((cell, values))
        arm_values.append((cell, {**values, **arms}))
        for norm in norms:
            mine = [r for r in in_cell if r.norm == norm]
            paired = sorted(set(values[norm]) & set(values[baseline]))
            diff = None if norm == baseline else paired_difference(
                [values[norm][s] for s in paired], [values[baseline][s] for s in paired])
            recorded = {r.seed for r in mine} & {r.seed for r in in_cell if r.norm == baseline}
            partial.append({"norm": norm, "cell": cell, "mine": mine, "values": values[norm], "diff": diff,
                            "unread": [f"seed {seed}: status ok, but runs.jsonl has no {source} at its selected "
                                       f"epoch (null or missing), so it is left out of the statistics; the row was "
                                       f"edited or damaged, or the run never recorded it there: rerun it"
                                       for seed in unread.get(norm, [])],
                            "oriented": {s: metric.sign * (values[norm][s] - values[baseline][s]) for s in paired},
                            "recorded": recorded})
    compared = [p for p in partial if p["diff"] is not None]
    position = {seed: i for i, seed in enumerate(seeds)}
    found = decide([list(p["oriented"].values()) for p in compared], margin, design=design, final=final,
                   positions=[[position.get(s, len(position)) for s in p["oriented"]] for p in compared],
                   reached=[looks_reached(design, [position[s] for s in p["recorded"] if s in position])
                            for p in compared] if design is not None else None)
    for p, verdict in zip(compared, found, strict=True):
        p["verdict"] = verdict
        p["interval"] = oriented_to_metric(verdict.low, verdict.high, metric.sign)
    rows = [_norm_summary(p) for p in partial]
    notes += load_notes(rows)
    cells = _cells(runs)
    index = {cell_key(c): i for i, c in enumerate(cells)}
    gaps = {(index[cell_key(p["cell"])], p["norm"]): p["oriented"] for p in compared}
    measured = {(index[cell_key(r.cell)], r.norm): {} for r in runs}
    for r in runs:
        if r.status == "ok" and r.diagnostics:
            measured[(index[cell_key(r.cell)], r.norm)][r.seed] = measures_of(r.diagnostics)
    compared_pairs = all_pairs(per_cell, norms, metric.sign, margin) if pairs else []
    return Summary(rows=rows, baseline=baseline, metric=metric, source=source, select=select, margin=margin,
                   notes=notes, interactions=interactions(gaps, cells, norms, baseline, margin),
                   diagnostics=diagnostic_verdicts(measured, cells, norms, baseline), pairs=compared_pairs,
                   ranks=ranking(compared_pairs, per_cell, norms, metric.sign) if pairs else [],
                   ablations=stage_tests(arm_values, ablations, baseline, metric.sign, margin))


def load_notes(rows: Sequence[NormSummary]) -> list[str]:
    """A note when the machine was busier than its cores while runs trained: their wall times (s/epoch,
    samples/s) then include waiting for a core, and only the CPU time per epoch compares."""
    busy = [s for s in rows if s.load_max is not None and s.cores is not None and s.load_max > s.cores]
    if not busy:
        return []
    worst = max(busy, key=lambda s: s.load_max or 0.0)
    return [f"load warning: the load average reached {worst.load_max:.1f} on {worst.cores} cores while "
            f"{', '.join(dict.fromkeys(s.norm for s in busy))} trained, so wall times (s/epoch, samples/s) include "
            f"waiting for a core; compare CPU s/epoch (process time) instead"]


def _norm_summary(p: dict[str, Any]) -> NormSummary:
    mine: list[Run] = p["mine"]
    records = [e for r in mine for e in r.epochs]

    def numbers(key: str) -> list[float]:
        return [e[key] for e in records if isinstance(e.get(key), (int, float))]

    peaks = numbers("peak_mem_mb")
    bests = [b for b in (_best_val_acc(r) for r in mine if r.status == "ok") if b is not None]
    return NormSummary(
        norm=p["norm"], cell=p["cell"], tuned=mine[-1].tuned if mine else {}, runs=len(mine),
        diverged=sum(r.status == "diverged" for r in mine),
        failed=sum(r.status == "failed" for r in mine) + len(p["unread"]),
        errors=[f"seed {r.seed}: {r.error}" for r in mine if r.status == "failed"] + p["unread"],
        values=dict(p["values"]), primary=mean_sem(list(p["values"].values())), best_val_acc=mean_sem(bests),
        vs_baseline=p["diff"], verdict=p.get("verdict"), interval=p.get("interval"),
        time_per_epoch_s=_median(numbers("epoch_time_s")), throughput=_median(numbers("throughput")),
        peak_mem_mb=max(peaks) if peaks else None,
        params=next((r.params for r in mine if r.params is not None), None),
        cpu_time_per_epoch_s=_median(numbers("cpu_time_s")),
        steps=_median_int([r.epochs[-1]["steps"] for r in mine if r.status == "ok" and r.epochs
                           and isinstance(r.epochs[-1].get("steps"), int)]),
        load_max=max(numbers("load_avg"), default=None),
        cores=min((int(c) for c in numbers("cpu_cores")), default=None),
    )


def _median_int(values: list[int]) -> int | None:
    return sorted(values)[len(values) // 2] if values else None
