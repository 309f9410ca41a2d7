"""Per-norm summary of a comparison: the rows of summary.csv/json and of the final table.

Accuracy statistics use the final epoch's validation accuracy of every run that finished
("ok"); diverged and failed runs are counted, not averaged. Differences to the baseline pair runs by seed
over the seeds where both norms finished. Accuracies are in percent.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from normkit_lab.stats import MeanSem, PairedDifference, mean_sem, paired_difference
from normkit_lab.training import RunResult


@dataclass(frozen=True)
class NormSummary:
    norm: str
    runs: int
    diverged: int
    final_acc: MeanSem
    best_acc: MeanSem
    vs_baseline: PairedDifference | None  # None for the baseline itself
    time_per_epoch_s: float | None  # median over all epochs of all runs
    throughput: float | None  # median train samples/s over all epochs
    peak_mem_mb: float | None  # largest peak over all epochs
    params: int | None
    failed: int = 0  # runs whose norm raised while building or training

    def as_row(self, baseline: str) -> dict[str, Any]:
        """A flat row for summary.csv/json."""
        d = self.vs_baseline
        return {
            "norm": self.norm, "runs": self.runs, "ok": self.final_acc.n, "diverged": self.diverged,
            "failed": self.failed,
            "acc_mean": self.final_acc.mean, "acc_sem": self.final_acc.sem,
            "best_acc_mean": self.best_acc.mean, "best_acc_sem": self.best_acc.sem,
            "baseline": baseline, "diff_n": d.n if d else None, "diff_mean": d.mean if d else None,
            "diff_ci95_low": d.low if d else None, "diff_ci95_high": d.high if d else None,
            "diff_p_value": d.p_value if d else None, "diff_note": d.note if d else "baseline",
            "time_per_epoch_s": self.time_per_epoch_s, "throughput_samples_s": self.throughput,
            "peak_mem_mb": self.peak_mem_mb, "params": self.params,
        }


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def final_acc(run: RunResult) -> float | None:
    return _percent(run.epochs[-1].val_acc) if run.epochs else None


def best_acc(run: RunResult) -> float | None:
    values = [r.val_acc for r in run.epochs if r.val_acc is not None]
    return _percent(max(values)) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(runs: Sequence[RunResult], norms: Sequence[str], baseline: str) -> list[NormSummary]:
    """One NormSummary per norm (in `norms` order), differences paired by seed against `baseline`."""
    ok_acc: dict[str, dict[int, float]] = {norm: {} for norm in norms}
    for run in runs:
        acc = final_acc(run)
        if run.status == "ok" and acc is not None and run.norm in ok_acc:
            ok_acc[run.norm][run.seed] = acc
    out = []
    for norm in norms:
        mine = [r for r in runs if r.norm == norm]
        records = [e for r in mine for e in r.epochs]
        accs = ok_acc[norm]
        diff = None
        if norm != baseline:
            seeds = sorted(set(accs) & set(ok_acc[baseline]))
            diff = paired_difference([accs[s] for s in seeds], [ok_acc[baseline][s] for s in seeds])
        bests = [best_acc(r) for r in mine if r.status == "ok"]
        peaks = [e.peak_mem_mb for e in records if e.peak_mem_mb is not None]
        out.append(NormSummary(
            norm=norm, runs=len(mine), diverged=sum(r.status == "diverged" for r in mine),
            final_acc=mean_sem(list(accs.values())),
            best_acc=mean_sem([b for b in bests if b is not None]),
            vs_baseline=diff,
            time_per_epoch_s=_median([e.epoch_time_s for e in records if e.epoch_time_s is not None]),
            throughput=_median([e.throughput for e in records if e.throughput is not None]),
            peak_mem_mb=max(peaks) if peaks else None,
            params=next((r.params for r in mine if r.params is not None), None),
            failed=sum(r.status == "failed" for r in mine),
        ))
    return out


def summary_rows(summaries: Sequence[NormSummary], baseline: str) -> list[dict[str, Any]]:
    return [s.as_row(baseline) for s in summaries]
