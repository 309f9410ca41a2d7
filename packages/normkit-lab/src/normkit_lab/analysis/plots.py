"""PNG figures of a comparison (optional: needs matplotlib, `pip install matplotlib`).

    forest.png          paired difference to the baseline per (cell, norm): mean and 95% t interval,
                        the equivalence band (-margin, +margin) shaded, the verdict beside it; with
                        --diagnostics one more panel per family of representation measures
    primary_metric.png  the primary metric per (cell, norm): mean, 95% t interval, every seed a dot
    curves.png          how the runs trained: the training loss and learning rate at every step
                        (from the step logs) and the validation loss per epoch, mean over finished
                        seeds; for your own code every metric it reported at its own epoch numbers;
                        one epoch drawn as a point per seed and norm; diverged runs dashed, ended
                        with an x
    sweep.png           (sweeps only) the primary metric against the swept value, one line per norm

Figures are rendered to PNG bytes once; the same bytes are written as files and embedded in
report.html. Intervals are clipped to the metric's valid range; a panel with nothing to draw says
why in words instead of showing empty axes.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from normkit_lab.analysis.caption import plural
from normkit_lab.analysis.diagnostic_verdicts import FAMILIES, MEANING
from normkit_lab.analysis.metric_family import recorded_metrics
from normkit_lab.analysis.summary import NormSummary, Run, Summary, cell_key, cell_label
from normkit_lab.records import RunId
from normkit_lab.stats import mean_sem, t_interval
from normkit_lab.store.atomic import atomic_replace_from

PLOTS_HINT = "install matplotlib for plots (pip install matplotlib)"
FIGURES = ("forest.png", "primary_metric.png", "curves.png", "sweep.png")


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _name(s: NormSummary, many_cells: bool) -> str:
    return f"{s.norm} [{cell_label(s.cell)}]" if many_cells and s.cell else s.norm


def _note(ax: Any, text: str) -> None:
    """Say in words why a panel has nothing to show."""
    ax.text(0.5, 0.5, textwrap.fill(text, 48), ha="center", va="center", transform=ax.transAxes, fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])


def _png(fig: Any) -> bytes:
    plt = _pyplot()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    plt.close(fig)
    return buf.getvalue()


def _unit(summary: Summary) -> str:
    return summary.metric.unit


def _many_cells(summary: Summary) -> bool:
    return len({cell_key(s.cell) for s in summary.rows}) > 1


def forest(summary: Summary) -> bytes:
    """Paired differences with their adjusted intervals (Holm, and the looks with sequential seeds: the ones
    the verdicts are decided on) and the equivalence band; with --diagnostics,
    one more panel per family of representation measures (their own units, no margin)."""
    plt = _pyplot()
    families = [f for f in FAMILIES if any(d.family == f for d in summary.diagnostics)]
    drawn = [s for s in summary.rows if s.vs_baseline is not None and s.vs_baseline.mean is not None]
    heights = [1.2 + 0.55 * max(3, len(drawn))] + [
        0.9 + 0.42 * max(2, sum(d.family == f for d in summary.diagnostics)) for f in families]
    fig, axes = plt.subplots(len(heights), 1, figsize=(7.5, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    _metric_panel(axes[0][0], summary, drawn)
    for ax, family in zip((row[0] for row in axes[1:]), families, strict=True):
        _diagnostic_panel(ax, summary, family)
    return _png(fig)


def _metric_panel(ax: Any, summary: Summary, drawn: list[NormSummary]) -> None:
    many = _many_cells(summary)
    metric, m = summary.metric, summary.margin
    span = None if metric.low is None or metric.high is None else metric.high - metric.low
    if not drawn:
        if not any(s.vs_baseline is not None for s in summary.rows):
            _note(ax, "only the baseline was run: nothing to compare")
        elif not any(s.values for s in summary.rows):
            _note(ax, "every run diverged or failed: no paired difference to draw")
        else:
            _note(ax, "no paired differences to draw: no norm finished on a seed where the baseline also finished")
        return
    ax.axvspan(-m, m, color="tab:green", alpha=0.15, label=f"equivalence band ±{m:g} {_unit(summary)}")
    ax.axvline(0.0, color="black", linewidth=0.8)
    for y, s in enumerate(reversed(drawn)):
        d = s.vs_baseline
        low, high = s.interval or (None, None)
        if low is not None and high is not None and span is not None:
            low, high = max(-span, low), min(span, high)
        if low is not None and high is not None:
            ax.errorbar([d.mean], [y], xerr=[[d.mean - low], [high - d.mean]], fmt="o", color="black", capsize=4)
        else:
            ax.plot([d.mean], [y], "o", color="grey")
    ax.set_yticks(range(len(drawn)), [f"{_name(s, many)}\n{s.verdict.verdict if s.verdict else ''}"
                                      for s in reversed(drawn)])
    ax.set_ylim(-0.7, len(drawn) - 0.3)
    good = "right" if metric.higher_is_better else "left"
    looks = ", looks" if any(s.verdict is not None and s.verdict.look is not None for s in drawn) else ""
    ax.set(xlabel=f"{summary.label} ({_unit(summary)}): norm - {summary.baseline}  ({good} is better)",
           title=f"Paired difference to {summary.baseline}:\nmean and interval adjusted for "
                 f"{plural(len(drawn), 'comparison')} (Holm{looks})")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)


def _diagnostic_panel(ax: Any, summary: Summary, family: str) -> None:
    """One family of diagnostic verdicts: per (norm, measure) the paired difference and its interval."""
    rows = [d for d in summary.diagnostics if d.family == family]
    many = len({cell_key(d.cell) for d in rows}) > 1
    ax.axvline(0.0, color="black", linewidth=0.8)
    for y, d in enumerate(reversed(rows)):
        if d.diff is None:
            continue
        if d.adj_low is not None and d.adj_high is not None:
            ax.errorbar([d.diff], [y], xerr=[[d.diff - d.adj_low], [d.adj_high - d.diff]], fmt="o", capsize=4,
                        color="tab:blue" if d.verdict in ("higher", "lower") else "grey")
        else:
            ax.plot([d.diff], [y], "o", color="grey")
    labels = [f"{d.norm}{f' [{cell_label(d.cell)}]' if many and d.cell else ''} "
              f"{d.measure.removeprefix(family).strip()}\n{d.verdict} "
              f"(Holm p {'-' if d.p_holm is None else f'{d.p_holm:.2g}'})" for d in reversed(rows)]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set(xlabel=f"{family}: norm - {summary.baseline}  ({MEANING[family]}; Holm p within {family})",
           title=f"{family} vs {summary.baseline}: paired difference, interval adjusted for "
                 f"{plural(len(rows), 'measure')} (Holm)")
    ax.grid(axis="x", alpha=0.3)


def _seed_offsets(seeds: Sequence[int]) -> dict[int, float]:
    """A fixed horizontal place per seed (the same in every column), so tied values stay apart and a
    seed's dots can be joined across norms."""
    order = sorted(seeds)
    width = 0.3
    if len(order) == 1:
        return {order[0]: -0.2}
    return {seed: -0.2 - width / 2 + width * k / (len(order) - 1) for k, seed in enumerate(order)}


def primary_metric(summary: Summary) -> bytes:
    """The primary metric per (cell, norm): mean, 95% t interval (clipped), each seed a dot at its
    own place, a seed's dots joined across the norms of a cell (the pairing the verdicts use)."""
    plt = _pyplot()
    many = _many_cells(summary)
    rows = summary.rows
    width = max(6.5, 1.1 * len(rows) + 2)
    fig, ax = plt.subplots(figsize=(width, 4.6))
    metric = summary.metric
    if not any(s.values for s in rows):
        _note(ax, "every run diverged or failed: no finished run to plot")
        return _png(fig)
    offsets = _seed_offsets(sorted({seed for s in rows for seed in s.values}))
    by_cell: dict[str, list[tuple[int, NormSummary]]] = {}
    for i, s in enumerate(rows):
        by_cell.setdefault(cell_label(s.cell), []).append((i, s))
    for members in by_cell.values():  # pairing lines: one seed, consecutive norms of one cell
        for (i, a), (j, b) in itertools.pairwise(members):
            for seed in sorted(set(a.values) & set(b.values)):
                ax.plot([i + offsets[seed], j + offsets[seed]], [a.values[seed], b.values[seed]], "-",
                        color="grey", alpha=0.35, linewidth=0.8, zorder=1)
    low_y = min(v for s in rows for v in s.values.values())
    for i, s in enumerate(rows):
        seeds = sorted(s.values)
        ax.plot([i + offsets[seed] for seed in seeds], [s.values[seed] for seed in seeds], "o", color="tab:blue",
                alpha=0.75, markersize=4, zorder=2)
        ax.annotate(f"n={len(seeds)}", (i, low_y), xytext=(0, -14), textcoords="offset points", ha="center",
                    fontsize=8, color="dimgrey")
        if s.primary.mean is None:
            continue
        interval = t_interval(list(s.values.values()))
        yerr = None
        if interval:
            low, high = metric.clip(interval[0]), metric.clip(interval[1])
            yerr = [[s.primary.mean - low], [high - s.primary.mean]]
        ax.errorbar([i + 0.2], [s.primary.mean], yerr=yerr, fmt="s", color="black", capsize=6, markersize=6,
                    zorder=3)
    ax.set_xticks(range(len(rows)), [_name(s, many) for s in rows], rotation=20 if many else 0)
    ax.margins(y=0.12)
    ax.set_ylabel(f"{summary.label} ({metric.unit})")
    title = (f"{summary.label.capitalize()} at the {summary.select} epoch: mean, 95% t interval (squares); "
             f"seeds (dots, each seed at its own place), grey lines join a seed across norms")
    ax.set_title(textwrap.fill(title, int(width * 12)), fontsize=10)  # wrapped to the figure, never cut
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


StepLog = list[tuple[int, int, float, float]]  # (step, epoch, loss, lr) rows: normkit_lab.step_log
MAX_OWN_PANELS = 9


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _epoch_means(runs: Sequence[Run], key: str, shift: int) -> tuple[list[int], list[float]]:
    """Mean over `runs` of `key` at each epoch; x = the epoch number + `shift` (1 for normkit's own runs,
    whose epoch 0 ends after one epoch of training; 0 for your own code, whose numbers are kept)."""
    epochs = sorted({e["epoch"] for r in runs for e in r.epochs})
    xs, ys = [], []
    for epoch in epochs:
        ms = mean_sem([e[key] for r in runs for e in r.epochs if e["epoch"] == epoch and _finite_number(e.get(key))])
        if ms.mean is not None:
            xs.append(epoch + shift)
            ys.append(ms.mean)
    return xs, ys


def _step_means(logs: Sequence[StepLog], column: int) -> tuple[list[float], list[float]]:
    """Mean over runs of a step-log column at each step; x in epochs trained (step j of an epoch of k
    steps at e + j/k, k the steps of a full epoch, so a last epoch cut short by a step budget ends
    early), so steps line up with the per-epoch points."""
    per_epoch: dict[int, int] = {}
    for _, epoch, _, _ in logs[0]:
        per_epoch[epoch] = per_epoch.get(epoch, 0) + 1
    full = max(per_epoch.values())
    seen: dict[int, int] = {}
    where: dict[int, float] = {}
    for step, epoch, _, _ in logs[0]:
        seen[epoch] = seen.get(epoch, 0) + 1
        where[step] = epoch + seen[epoch] / full
    values: dict[int, list[float]] = {}
    for log in logs:
        for row in log:
            if row[0] in where and math.isfinite(row[column]):
                values.setdefault(row[0], []).append(row[column])
    steps = sorted(values)
    return [where[s] for s in steps], [sum(values[s]) / len(values[s]) for s in steps]


def _moving_average(ys: list[float], window: int) -> list[float]:
    """The mean of each value and the `window - 1` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def _rows_of(summary: Summary, runs: Sequence[Run]) -> list[tuple[NormSummary, list[Run]]]:
    return [(s, [r for r in runs if r.norm == s.norm and cell_key(r.cell) == cell_key(s.cell)]) for s in summary.rows]


def _by_norm_points(ax: Any, summary: Summary, runs: Sequence[Run], key: str, shift: int) -> None:
    """One epoch: per norm its seeds' values (dots) and their mean (square), norms side by side."""
    many = _many_cells(summary)
    rows = _rows_of(summary, runs)
    for i, (_, mine) in enumerate(rows):
        values = [e[key] for r in mine if r.status == "ok" for e in r.epochs if _finite_number(e.get(key))]
        if values:
            ax.plot([i - 0.15] * len(values), values, "o", color="tab:blue", alpha=0.6, markersize=4)
            ax.plot([i + 0.15], [sum(values) / len(values)], "s", color="black", markersize=6)
    epoch = next((e["epoch"] for _, mine in rows for r in mine for e in r.epochs), 0) + shift
    ax.set_xticks(range(len(rows)), [_name(s, many) for s, _ in rows], rotation=20 if many else 0)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(f"after epoch {epoch}, the only one: seeds (dots) and their mean (square)")


def _epoch_lines(ax: Any, summary: Summary, runs: Sequence[Run], key: str, shift: int) -> None:
    """Several epochs: per norm the mean over finished seeds at each epoch; diverged runs dashed, ended
    with a red x."""
    many = _many_cells(summary)
    for s, mine in _rows_of(summary, runs):
        ok = [r for r in mine if r.status == "ok"]
        color = None
        if ok:
            xs, ys = _epoch_means(ok, key, shift)
            if xs:
                (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=_name(s, many))
                color = line.get_color()
        for r in mine:
            if r.status != "diverged" or not r.epochs:
                continue
            xs, ys = _epoch_means([r], key, shift)
            if xs:
                (line,) = ax.plot(xs, ys, linestyle="--", linewidth=0.9, color=color, alpha=0.8)
                color = line.get_color()
                ax.plot(xs[-1:], ys[-1:], "x", color="red", markersize=8)
    ax.set_xlabel("epoch" if shift == 0 else "epochs trained")


def _has_values(runs: Sequence[Run], key: str) -> bool:
    return any(_finite_number(e.get(key)) for r in runs for e in r.epochs)


def _one_epoch(runs: Sequence[Run]) -> bool:
    return len({e["epoch"] for r in runs for e in r.epochs}) == 1


def _epoch_panel(ax: Any, summary: Summary, runs: Sequence[Run], key: str, title: str, shift: int) -> None:
    from matplotlib.ticker import MaxNLocator

    if _one_epoch(runs):
        _by_norm_points(ax, summary, runs, key, shift)
    else:
        _epoch_lines(ax, summary, runs, key, shift)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if shift:  # epochs trained, from 0 as the step panels beside it
            ax.set_xlim(left=0)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def _step_panel(ax: Any, summary: Summary, runs: Sequence[Run], logs: Mapping[str, StepLog], column: int) -> None:
    """Per norm, a step-log column (2: loss, 3: lr) averaged over its finished seeds; the loss also over
    a moving window (its per-step values are noisy). Learning rates shared by every norm: one line."""
    many = _many_cells(summary)
    curves_of = []
    for s, mine in _rows_of(summary, runs):
        mine_logs = [logs[run_key(r)] for r in mine if r.status == "ok" and logs.get(run_key(r))]
        if mine_logs:
            curves_of.append((_name(s, many), *_step_means(mine_logs, column)))
    steps = max((len(xs) for _, xs, _ in curves_of), default=0)
    window = max(1, steps // 60) if column == 2 else 1
    shared = column == 3 and len(curves_of) > 1 and all(
        ys == curves_of[0][2] and xs == curves_of[0][1] for _, xs, ys in curves_of)
    for name, xs, ys in curves_of[:1] if shared else curves_of:
        ax.plot(xs, _moving_average(ys, window), linewidth=1.1, label="every norm" if shared else name)
    if column == 2:
        smoothed = f", moving average of {window} steps" if window > 1 else ""
        ax.set_title(f"training loss per step\n(mean over seeds{smoothed})", fontsize=10)
    else:
        ax.set_title("learning rate at every step,\nas the schedule ran", fontsize=10)
        if shared:
            ax.legend(fontsize=8)
    ax.set_xlabel("epochs trained")
    ax.set_xlim(0, max((xs[-1] for _, xs, _ in curves_of if xs), default=1))
    ax.grid(alpha=0.3)


def run_key(run: Run) -> str:
    """The key of a run's step log: its file slug (normkit_lab.records.RunId.slug)."""
    return RunId.of(run.norm, run.seed, run.phase, run.cell, run.tuned).slug()


def _own_metrics(runs: Sequence[Run]) -> list[str]:
    """Every metric your program reported (finite values), in the order it first reported them."""
    return [name for name in recorded_metrics(runs) if _has_values(runs, name)]


def curves(summary: Summary, runs: Sequence[Run], logs: Mapping[str, StepLog] | None = None,
           own_code: bool = False) -> bytes:
    """How the runs trained. normkit's own runs: the training loss and learning rate at every step (from
    the step logs; per epoch for results written before them) and the validation loss per epoch. Your
    own code: every metric it reported, at its own epoch numbers. One epoch: a point per seed and norm
    instead of single dots on a line. Panels with nothing to show are left out."""
    plt = _pyplot()
    runs = [r for r in runs if r.phase == "compare"]
    logs = logs or {}
    stepped = any(logs.get(run_key(r)) for r in runs if r.status == "ok")
    shift = 0 if own_code else 1
    reported = _own_metrics(runs) if own_code else []
    if own_code:
        panels = [(lambda ax, k=k: _epoch_panel(ax, summary, runs, k, k, shift)) for k in reported[:MAX_OWN_PANELS]]
    else:
        panels = []
        if stepped:
            panels.append(lambda ax: _step_panel(ax, summary, runs, logs, 2))
        elif _has_values(runs, "train_loss"):
            panels.append(lambda ax: _epoch_panel(ax, summary, runs, "train_loss", "training loss", shift))
        if _has_values(runs, "val_loss"):
            panels.append(lambda ax: _epoch_panel(ax, summary, runs, "val_loss", "validation loss", shift))
        if stepped:
            panels.append(lambda ax: _step_panel(ax, summary, runs, logs, 3))
        elif _has_values(runs, "lr") and not _one_epoch(runs):
            panels.append(lambda ax: _epoch_panel(ax, summary, runs, "lr", "learning rate at each epoch's first "
                                                  "step", shift))
    if not panels:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        _note(ax, "no epoch finished (every run diverged or failed in its first epoch)" if not any(
            r.epochs for r in runs) else "the runs recorded no curve to draw")
        return _png(fig)
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols, 3.8 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, draw in zip(flat, panels, strict=False):
        draw(ax)
    for ax in flat[len(panels):]:
        ax.remove()
    first = flat[0]
    if any(r.status == "diverged" for r in runs) and not _one_epoch(runs):
        first.plot([], [], "x", color="red", label="diverged run (last epoch)")
    if first.get_legend_handles_labels()[0] and not first.get_legend():
        first.legend(fontsize=8)
    what = "as your program reported them, at its epoch numbers" if own_code else "mean over finished seeds"
    if len(reported) > MAX_OWN_PANELS:
        what += f"; the first {MAX_OWN_PANELS} of its {len(reported)} metrics, all in runs.jsonl"
    diverged = "; dashed: diverged runs" if any(r.status == "diverged" for r in runs) else ""
    fig.suptitle(f"How the runs trained ({what}{diverged})", fontsize=10)
    return _png(fig)


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def sweep(summary: Summary) -> bytes | None:
    """The primary metric against the swept value per norm (None when there is a single cell)."""
    if not _many_cells(summary):
        return None
    plt = _pyplot()
    metric = summary.metric
    cells = []
    for s in summary.rows:
        if s.cell not in cells:
            cells.append(s.cell)
    keys = {tuple(c) for c in cells}
    single = len(keys) == 1 and len(next(iter(keys))) == 1
    raw = [next(iter(c.values())) for c in cells] if single else []
    numeric = single and _numeric(raw)
    positions = raw if numeric else list(range(len(cells)))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    norms = list(dict.fromkeys(s.norm for s in summary.rows))
    log = numeric and min(raw) > 0 and max(raw) / min(raw) >= 10
    span = (max(positions) - min(positions)) or 1.0
    for k, norm in enumerate(norms):
        dodge = (k - (len(norms) - 1) / 2) * 0.035  # side by side, not on top of each other
        xs, ys, lows, highs = [], [], [], []
        for x, cell in zip(positions, cells, strict=True):
            x = x * 10 ** (dodge * math.log10(max(raw) / min(raw))) if log else x + dodge * span
            s = next((r for r in summary.rows if r.norm == norm and r.cell == cell), None)
            if s is None or s.primary.mean is None:
                continue
            interval = t_interval(list(s.values.values()))
            low, high = (metric.clip(interval[0]), metric.clip(interval[1])) if interval else (s.primary.mean,) * 2
            xs.append(x)
            ys.append(s.primary.mean)
            lows.append(s.primary.mean - low)
            highs.append(high - s.primary.mean)
        if xs:
            ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=4, label=norm)
    if not ax.lines:
        _note(ax, "every run diverged or failed: no finished run to plot")
        return _png(fig)
    if numeric:
        key = next(iter(keys))[0]
        if log:
            ax.set_xscale("log")
            from matplotlib.ticker import NullLocator

            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(raw, [f"{v:g}" for v in raw])  # ticks at the swept values, written as given
        ax.set_xlabel(key)
    else:
        ax.set_xticks(positions, [cell_label(c) for c in cells], rotation=20)
        ax.set_xlabel("cell")
    ax.set(ylabel=f"{summary.label} ({metric.unit})", title="Sweep: mean and 95% t interval per cell")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def render(summary: Summary, runs: Sequence[Run], logs: Mapping[str, StepLog] | None = None,
           own_code: bool = False) -> dict[str, bytes]:
    """Every figure that applies, by file name, as PNG bytes (empty without matplotlib). `logs`: the
    runs' step logs by `run_key`; `own_code`: the runs are your program's (curves of its own metrics)."""
    if not available():
        return {}
    figures = {"forest.png": forest(summary), "primary_metric.png": primary_metric(summary),
               "curves.png": curves(summary, runs, logs, own_code)}
    swept = sweep(summary)
    if swept is not None:
        figures["sweep.png"] = swept
    return figures


def write_figures(out_dir: Path, figures: dict[str, bytes]) -> list[Path]:
    """Write rendered figures into `out_dir` (each atomically) and return their paths."""
    written = []
    for name, data in figures.items():
        path = out_dir / name
        with atomic_replace_from(path) as tmp:
            tmp.write_bytes(data)
        written.append(path)
    return written
