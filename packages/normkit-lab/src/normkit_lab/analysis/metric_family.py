"""Several metrics at once (`--metric test_acc,test_loss`): one verdict table per metric, and one Holm
family across them.

Reading two metrics of the same runs makes twice the claims; if each metric kept its own Holm family,
the chance of a false "better" somewhere would grow with every metric added. So the verdicts of every
(metric, cell, norm) comparison are adjusted together, each with its own metric's margin (TOST in its
own unit) and direction; the per-metric summaries keep everything else (means, intervals, planning
numbers at the family's strictest Holm step). Interaction, diagnostic and all-pairs families stay
per metric: only the first metric's are reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from normkit_lab.analysis.caption import caption, summary_caption
from normkit_lab.analysis.summary import Run, Summary, cell_key
from normkit_lab.analysis.verdicts import decide, oriented_to_metric

# numeric columns of a runs.jsonl row that are no metric of the training: identity, and what normkit measures
NOT_METRICS = {"seed", "params", "threads", "epoch", "step", "steps", "epoch_time_s", "cpu_time_s", "wall_time_s",
               "throughput", "peak_mem_mb"}


def recorded_metrics(runs: Sequence[Run]) -> list[str]:
    """Every numeric field the finished runs' epochs record, in the order first seen (what can be read)."""
    names: dict[str, None] = {}
    for run in runs:
        for epoch in run.epochs:
            for key, value in epoch.items():
                if key not in NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    names.setdefault(key, None)
    return list(names)


def across_metrics(summaries: Sequence[Summary]) -> list[Summary]:
    """The summaries with every verdict Holm-adjusted over all comparisons of all of them (one family),
    each comparison's equivalence test at its own metric's margin. One summary is returned as it is."""
    if len(summaries) < 2:
        return list(summaries)
    first = summaries[0]
    if any(r.verdict is not None and r.verdict.look is not None for r in first.rows):
        others = ", ".join(s.metric.field for s in summaries[1:])
        note = (f"sequential seeds: the looks decided on {first.metric.field}, which chose the seeds; the verdicts "
                f"of {others} are fixed-seed tests on those seeds, each metric its own Holm family, not protected "
                f"against that stopping")
        return [first, *(dataclasses.replace(s, notes=[*s.notes, note]) for s in summaries[1:])]
    found = []  # (summary index, row index, oriented paired differences, margin)
    for i, summary in enumerate(summaries):
        base = {cell_key(r.cell): r.values for r in summary.rows if r.norm == summary.baseline}
        for j, row in enumerate(summary.rows):
            if row.verdict is None:
                continue
            paired = base.get(cell_key(row.cell), {})
            seeds = sorted(set(row.values) & set(paired))
            found.append((i, j, [summary.metric.sign * (row.values[s] - paired[s]) for s in seeds], summary.margin))
    verdicts = decide([f[2] for f in found], [f[3] for f in found])
    names = ", ".join(s.metric.field for s in summaries)
    note = (f"Holm's adjustment is over all {len(found)} comparisons of the {len(summaries)} metrics read "
            f"({names}), one family: the verdicts of each metric count the others' claims too")
    out = [dataclasses.replace(s, rows=list(s.rows), notes=[*s.notes, note]) for s in summaries]
    for (i, j, _, _), verdict in zip(found, verdicts, strict=True):
        out[i].rows[j] = dataclasses.replace(out[i].rows[j], verdict=verdict, interval=oriented_to_metric(
            verdict.low, verdict.high, summaries[i].metric.sign))  # the interval of the family's verdict
    return out


def family_caption(config: Mapping[str, Any], summaries: Sequence[Summary]) -> str:
    """The caption under the tables: the first metric's, with Holm's family counted over every metric read."""
    first = summaries[0]
    if len(summaries) == 1:
        return summary_caption(config, first)
    seeds = len({seed for s in first.rows for seed in s.values}) or len(config.get("seeds") or ())
    comparisons = sum(1 for summary in summaries for s in summary.rows if s.verdict is not None)
    return caption(config, seeds=seeds, comparisons=comparisons, baseline=first.baseline)
