"""`normkit report DIR [DIR ...]`: the table and plots of results directories (one, or several merged)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from normkit_cli.errors import one_line_errors
from normkit_cli.text import plural

if TYPE_CHECKING:  # the lab (torch) is imported when a command runs, not for --help
    from normkit_lab.report import Results
    from normkit_lab.results import ResultsDir
    from normkit_lab.stats import MeanSem
    from normkit_lab.summary import NormSummary


def _acc(ms: MeanSem) -> str:
    if ms.mean is None:
        return "-"
    return f"{ms.mean:.2f} ± {ms.sem:.2f}" if ms.sem is not None else f"{ms.mean:.2f} (n=1)"


def _diff(s: NormSummary) -> tuple[str, str, str]:
    """The 'difference', '95% CI' and 'p' cells."""
    d = s.vs_baseline
    if d is None:
        return "baseline", "", ""
    if d.mean is None:
        return "-", d.note, ""
    if d.low is None or d.high is None or d.p_value is None:
        return f"{d.mean:+.2f}", d.note, ""
    return f"{d.mean:+.2f}", f"[{d.low:+.2f}, {d.high:+.2f}]", f"{d.p_value:.3g}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


# Columns left out, in this order, when the table is wider than the terminal (summary.csv has all).
_OPTIONAL = ("params", "peak MB", "samples/s")


def _cells(s: NormSummary) -> dict[str, str]:
    diff, interval, p = _diff(s)
    return {"norm": s.norm, "n": str(s.final_acc.n), "acc % ± s.e.": _acc(s.final_acc), "Δ": diff,
            "95% CI": interval, "p": p, "s/epoch": _num(s.time_per_epoch_s, ".2f"),
            "samples/s": _num(s.throughput, ",.0f"), "peak MB": _num(s.peak_mem_mb, ",.0f"),
            "params": _num(s.params, ","), "diverged": str(s.diverged),
            "failed": str(s.failed)}


def summary_table(results: Results, summaries: list[NormSummary], drop: tuple[str, ...] = ()) -> Table:
    """The final table: accuracy, paired difference to the baseline, speed, memory, size, divergences."""
    cfg = results.config
    epochs = plural(cfg["epochs"], "epoch") if isinstance(cfg.get("epochs"), int) else f"{cfg.get('epochs')} epochs"
    table = Table(title=f"{cfg.get('model')} on {cfg.get('dataset')}, {epochs}: final val "
                        f"accuracy over seeds, difference to {results.baseline} paired by seed",
                  box=box.SIMPLE_HEAD, title_justify="left", collapse_padding=True, pad_edge=False)
    rows = [_cells(s) for s in summaries]
    names = [name for name in rows[0] if name not in drop] if rows else []
    for name in names:
        header = f"Δ vs {results.baseline}" if name == "Δ" else name
        table.add_column(header, justify="left" if name == "norm" else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(row[name] for name in names))
    return table


def fitted_table(results: Results, summaries: list[NormSummary],
                 console: Console) -> tuple[Table, tuple[str, ...]]:
    """The summary table without the optional columns the console is too narrow for, and those left out."""
    unbounded = console.options.update(max_width=10_000)
    for k in range(len(_OPTIONAL) + 1):
        dropped = _OPTIONAL[:k]
        table = summary_table(results, summaries, drop=dropped)
        if Measurement.get(console, unbounded, table).maximum <= console.width:
            break
    return table, dropped


def console() -> Console:
    """The terminal's console; COLUMNS when set, else 160 columns when writing to a file or pipe."""
    term = Console()
    if term.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return term
    return Console(width=160)


def show(results: Results, store: ResultsDir, console: Console) -> None:
    """Rewrite the summary files and plots in `store`, then print the table and where files are."""
    from normkit_lab import plots
    from normkit_lab.report import write_plots, write_summary

    summaries = write_summary(store, results)
    written = write_plots(store, results)
    table, dropped = fitted_table(results, summaries, console)
    console.print(table)
    if dropped:
        console.print(f"(too narrow for {', '.join(dropped)}: see summary.csv)")
    console.print(f"results: {store.path}")
    if written is None:
        console.print(f"plots: none ({plots.PLOTS_HINT})")
    else:
        console.print("plots: " + ", ".join(p.name for p in written))


@one_line_errors
def report_cmd(
    dirs: Annotated[list[Path], typer.Argument(help="Results directories written by `normkit compare`.")],
    baseline: Annotated[str | None, typer.Option(help="Norm to compare against (default: the saved "
                                                      "baseline).")] = None,
    out: Annotated[Path | None, typer.Option(help="Where merged results go (several DIRs; default "
                                                  "runs/<timestamp>-report, never overwritten).")] = None,
) -> None:
    """Print the summary table and redraw plots of one results directory, or merge several.

    One DIR: summary.csv/json and plots in DIR are rewritten from its runs.jsonl. Several DIRs
    of the same configuration (norms and seeds may differ): their runs are merged into a new
    directory (--out), which `normkit report` can read again.
    """
    from normkit_lab.report import load_results, merge_into
    from normkit_lab.results import ResultsDir

    results = load_results(dirs, baseline)
    if len(dirs) == 1 and out is None:
        store = ResultsDir.open(dirs[0])
    else:
        store = merge_into(results, out)
    show(results, store, console())


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
