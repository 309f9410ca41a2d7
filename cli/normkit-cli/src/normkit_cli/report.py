"""`normkit report DIR [DIR ...]`: the verdict table of results directories (one, or several merged).

The table is a rich Table fitted to the terminal: low-priority columns are dropped, and the
interval folded into the difference column, until it fits (summary.csv and report.html have all).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from normkit_cli import text
from normkit_cli.defaults import DEFAULT_METRIC, METRIC_NAMES, SELECTS
from normkit_cli.errors import fail, one_line_errors
from normkit_cli.text import plural

if TYPE_CHECKING:  # the lab (torch) is imported when a command runs, not for --help
    from normkit_lab.analysis.report import Results
    from normkit_lab.analysis.summary import NormSummary, Summary
    from normkit_lab.stats import MeanSem
    from normkit_lab.store.results import ResultsDir


def _mean(ms: MeanSem) -> str:
    if ms.mean is None:
        return "-"
    return f"{ms.mean:.2f} ± {ms.sem:.2f}" if ms.sem is not None else f"{ms.mean:.2f} (n=1)"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def tuned_text(tuned: dict[str, Any], keys: list[str]) -> str:
    """A row's tuned values: just the value when one key was tuned (the header names it), else k=v."""
    if not tuned:
        return "-"
    return f"{tuned[keys[0]]}" if keys == list(tuned) and len(keys) == 1 else ", ".join(
        f"{k}={v}" for k, v in tuned.items())


def _cells(s: NormSummary, many: bool, any_failed: bool, tuned_keys: list[str], p_name: str) -> dict[str, str]:
    """Every column's text for one row (keys are the column ids)."""
    from normkit_lab.analysis.summary import interval_text
    from normkit_lab.analysis.verdicts import decision_p

    d, v = s.vs_baseline, s.verdict
    if d is None:
        diff, interval = "baseline", ""
    elif d.mean is None:
        diff, interval = "-", d.note
    else:
        diff = f"{d.mean:+.2f}"
        interval = interval_text(*(s.interval or (None, None)), missing=d.note)  # adjusted: what the verdict used
    from normkit_lab.analysis.summary import cell_label

    row = {"norm": s.norm}
    if many:
        row["cell"] = cell_label(s.cell) or "-"
    if tuned_keys:
        row["tuned"] = tuned_text(s.tuned, tuned_keys)
    row |= {"n": str(s.primary.n), "metric": _mean(s.primary), "Δ": diff, ADJUSTED: interval,
            p_name: decision_p(v),
            "verdict": "baseline" if v is None else v.verdict,
            "MDE": "" if v is None or v.mde is None else f"{v.mde:.2f}",
            "s/epoch": _num(s.time_per_epoch_s, ".2f"), "CPU s/epoch": _num(s.cpu_time_per_epoch_s, ".2f"),
            "samples/s": _num(s.throughput, ",.0f"),
            "peak MB": _num(s.peak_mem_mb, ",.0f"), "params": _num(s.params, ","), "diverged": str(s.diverged)}
    if any_failed:
        row["failed"] = str(s.failed)
    return row


# The interval column: the paired difference's interval adjusted for the family (Holm) and the looks (sequential
# seeds), the one the verdict is decided on (normkit_lab.analysis.verdicts), explained under the table.
ADJUSTED = "adj. CI"

# Narrowing steps, in order: drop these columns one at a time, fold the interval into Δ, drop MDE.
_OPTIONAL = ("params", "peak MB", "samples/s", "s/epoch", "CPU s/epoch")
FOLD = "fold"


def summary_table(results: Results, summary: Summary, drop: tuple[str, ...] = ()) -> Table:
    """The final table: primary metric, paired difference, Holm p, verdict, MDE, speed, size, failures."""
    from normkit_lab.analysis.caption import training_length
    from normkit_lab.analysis.summary import cell_key
    from normkit_lab.analysis.verdicts import p_column

    cfg, metric = results.config, summary.metric
    what = f"{cfg.get('model')} on {cfg.get('dataset')}, {training_length(cfg)}"
    if cfg.get("command") or cfg.get("train_function"):
        what = f"`{cfg['command']}`" if cfg.get("command") else f"{cfg['train_function']}()"
    table = Table(title=Text(f"{what}: {summary.label} "
                        f"({summary.source}, {summary.select} epoch) over seeds, difference to {summary.baseline} "
                        f"paired by seed, equivalence margin ±{summary.margin:g} {metric.unit}"),
                  box=box.SIMPLE_HEAD, title_justify="left", collapse_padding=True, pad_edge=False)
    many = len({cell_key(s.cell) for s in summary.rows}) > 1
    any_failed = any(s.failed for s in summary.rows)
    tuned_keys = list(dict.fromkeys(k for s in summary.rows for k in s.tuned))
    rows = [_cells(s, many, any_failed, tuned_keys, p_column(s.verdict for s in summary.rows)) for s in summary.rows]
    fold = FOLD in drop
    if fold:
        for row in rows:
            row["Δ"] = f"{row['Δ']} {row[ADJUSTED]}".strip()
    names = [name for name in rows[0] if name not in drop and not (fold and name == ADJUSTED)] if rows else []
    headers = {"Δ": f"Δ vs {summary.baseline}" + (f" [{ADJUSTED}]" if fold else ""),
               "tuned": f"tuned {tuned_keys[0]}" if len(tuned_keys) == 1 else "tuned",
               "metric": f"{metric.unit} ± s.e." if metric.unit == "%" else f"{metric.field} ± s.e."}
    for name in names:
        left = name in ("norm", "cell", "tuned", "verdict")
        table.add_column(headers.get(name, name), justify="left" if left else "right", no_wrap=name != "cell",
                         overflow="fold")  # too narrow: a name goes on over lines, never cut
    for row in rows:
        table.add_row(*(Text(row[name]) for name in names))  # Text: no rich markup in specs or errors
    return table


def fitted_table(results: Results, summary: Summary, console: Console) -> tuple[Table, tuple[str, ...]]:
    """The table narrowed step by step (see _OPTIONAL, then FOLD) until it fits; and what was left out."""
    unbounded = console.options.update(max_width=10_000)
    steps = [*_OPTIONAL, FOLD, "MDE"]
    for k in range(len(steps) + 1):
        dropped = tuple(steps[:k])
        table = summary_table(results, summary, drop=dropped)
        if Measurement.get(console, unbounded, table).maximum <= console.width:
            break
    return table, dropped


def console() -> Console:
    """The terminal's console; COLUMNS when set, else 160 columns when writing to a file or pipe (the
    table is narrowed to fit, its names never cut, and the caption wraps at a readable width)."""
    return text.console(pipe_width=160)


def print_summary(results: Results, summaries: Sequence[Summary], console: Console) -> None:
    """The fitted table of each metric read (one with a single --metric) and, below them, the notes:
    fallbacks, failures, columns left out."""
    from normkit_lab.analysis.looks import interval_lines, read_looks
    from normkit_lab.analysis.metric_family import family_caption
    from normkit_lab.analysis.summary import cell_label
    from normkit_lab.analysis.tuning import edge_warnings, read_tuning

    summary = summaries[0]
    dropped: tuple[str, ...] = ()
    for each in summaries:
        table, narrowed = fitted_table(results, each, console)
        dropped = max(dropped, narrowed, key=len)
        console.print(table)
    console.print(family_caption(results.config, summaries), markup=False, highlight=False)
    for line in edge_warnings(read_tuning(results.sources)):
        console.print(line, markup=False, highlight=False, soft_wrap=True)  # one line, whatever the width
    if summary.interactions:
        console.print(interaction_table(summary))
    if summary.diagnostics:
        console.print(diagnostics_table(summary))
    if summary.ranks:
        console.print(ranking_table(summary))
    if summary.ablations:
        from normkit_cli.ablation_table import print_ablations

        print_ablations(summary, console)
    left_out = [d for d in dropped if d != FOLD]
    if left_out:
        console.print(f"(too narrow for {', '.join(left_out)}: see summary.csv or report.html)")
    for note in summary.notes:
        console.print(f"note: {note}", markup=False)
    for s in summary.rows:
        where = f"{s.norm} [{cell_label(s.cell)}]" if s.cell else s.norm
        for error in s.errors:
            console.print(f"failed: {where} {error}", markup=False)
    if any(s.verdict is not None and s.verdict.verdict.startswith("no verdict") for s in summary.rows):
        console.print("no verdict (n<3): fewer than 3 paired seeds; run more seeds")
    for line in interval_lines(summary, results.sequential().get("design"), read_looks(results.sources[0])
                               if len(results.sources) == 1 else None, "MDE" not in dropped):
        console.print(line, markup=False, highlight=False)


def _verdict_table(title: str, columns: list[str], left: tuple[str, ...]) -> Table:
    """The plain table the interaction, diagnostic and ranking verdicts are printed in."""
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left", collapse_padding=True,
                  pad_edge=False)
    for name in columns:
        table.add_column(name, justify="left" if name in left else "right")
    return table


def interaction_table(summary: Summary) -> Table:
    """Sweeps: per norm and pair of cells of one key, the change of its gap to the baseline."""
    from normkit_lab.analysis.summary import interval_text

    table = _verdict_table(f"interactions: does the gap to {summary.baseline} depend on the swept key? "
                           f"(gap at 'to' minus gap at 'from', paired by seed, + = the norm gains; Holm over "
                           f"{plural(len(summary.interactions), 'test')}; margin ±{summary.margin:g})",
                           ["norm", "key", "from → to", "n", "Δ gap", ADJUSTED, "Holm p", "verdict"],
                           ("norm", "key", "verdict"))
    for i in summary.interactions:
        t = i.test
        interval = interval_text(t.low, t.high)
        table.add_row(*(Text(x) for x in (
            i.norm, i.key, f"{i.cell_a[i.key]} → {i.cell_b[i.key]}", str(t.n), _num(i.mean, "+.2f"), interval,
            "" if t.p_holm is None else f"{t.p_holm:.3g}", i.verdict)))
    return table


def diagnostics_table(summary: Summary) -> Table:
    """--diagnostics: each representation measure of each norm against the baseline, paired by seed."""
    from normkit_lab.analysis.diagnostic_verdicts import MEANING
    from normkit_lab.analysis.summary import cell_label, interval_text

    many = len({cell_label(d.cell) for d in summary.diagnostics}) > 1
    names = ["norm", *(["cell"] if many else []), "measure", "n", summary.baseline, "norm value", "Δ", ADJUSTED,
             "Holm p", "verdict"]
    table = _verdict_table(f"representation measures vs {summary.baseline}, paired by seed (Holm within each "
                           f"family: {'; '.join(f'{k}: {v}' for k, v in MEANING.items())}; {ADJUSTED}: the "
                           f"interval at the Holm level each was tested at, excluding 0 exactly when higher/lower)",
                           names, ("norm", "cell", "measure", "verdict"))
    for d in summary.diagnostics:
        interval = interval_text(d.adj_low, d.adj_high, ".3g")
        values = [d.norm, *([cell_label(d.cell) or "-"] if many else []), d.measure, str(d.n),
                  _num(d.baseline_mean, ".4g"), _num(d.norm_mean, ".4g"), _num(d.diff, "+.3g"), interval,
                  "" if d.p_holm is None else f"{d.p_holm:.3g}", d.verdict]
        table.add_row(*(Text(v) for v in values))
    return table


def ranking_table(summary: Summary) -> Table:
    """--all-pairs: the norms of each cell ranked by significant wins minus losses over all pairs."""
    from normkit_lab.analysis.summary import cell_label

    many = len({cell_label(r.cell) for r in summary.ranks}) > 1
    names = [*(["cell"] if many else []), "rank", "norm", summary.metric.unit if summary.metric.unit == "%" else
             summary.metric.field, "wins", "losses", "equivalent", "significant pairs"]
    table = _verdict_table(f"ranking over all {plural(len(summary.pairs), 'pair')} of norms (paired by seed, "
                           f"Holm over all pairs; by wins - losses, then mean)", names,
                           ("cell", "norm", "significant pairs"))
    for r in summary.ranks:
        beats = [f"> {p.other}" if p.verdict.verdict.startswith("better") else f"< {p.other}"
                 for p in summary.pairs if p.norm == r.norm and p.cell == r.cell
                 and p.verdict.verdict.startswith(("better", "worse"))]
        beats += [f"> {p.norm}" if p.verdict.verdict.startswith("worse") else f"< {p.norm}"
                  for p in summary.pairs if p.other == r.norm and p.cell == r.cell
                  and p.verdict.verdict.startswith(("better", "worse"))]
        values = [*([cell_label(r.cell) or "-"] if many else []), str(r.rank), r.norm, _num(r.mean, ".2f"),
                  str(r.wins), str(r.losses), str(r.equivalent), ", ".join(beats)]
        table.add_row(*(Text(v) for v in values))
    return table


def _print_files(store: ResultsDir, written: list[Path], console: Console) -> None:
    from normkit_lab.analysis import plots
    from normkit_lab.analysis.report import REPORT_HTML

    console.print(f"results: {store.path}", markup=False)
    console.print(f"report: {store.path / REPORT_HTML}", markup=False)
    if not plots.available():
        console.print(f"plots: none ({plots.PLOTS_HINT})")
    elif written:
        console.print("plots: " + ", ".join(p.name for p in written))


def show(results: Results, store: ResultsDir, console: Console) -> None:
    """Rewrite the summary files, figures and report.html in `store`, then print the table and files."""
    from normkit_lab.analysis import plots
    from normkit_lab.analysis.report import write_diagnostics, write_summary

    summaries = write_summary(store, results, figures=True)
    written = [store.path / name for name in plots.FIGURES if (store.path / name).is_file()]
    written += [p for p in write_diagnostics(store, results) if p.suffix == ".png"]
    print_summary(results, summaries, console)
    _print_files(store, written, console)


@one_line_errors
def report_cmd(
    dirs: Annotated[list[Path], typer.Argument(help="Results directories written by `normkit compare`.")],
    baseline: Annotated[str | None, typer.Option(help="Norm to compare against (default: the saved "
                                                      "baseline).")] = None,
    metric: Annotated[str | None, typer.Option(help=f"Primary metric: {', '.join(METRIC_NAMES)} (default: the "
                                                    f"comparison's, else {DEFAULT_METRIC}); several, comma "
                                                    f"separated (test_acc,test_loss), give a table each and one "
                                                    f"Holm family.")] = None,
    margin: Annotated[float | None, typer.Option(help="Equivalence margin in the metric's unit (default: the "
                                                      "saved one, else 0.5 points of accuracy).")] = None,
    select: Annotated[str | None, typer.Option(help=f"Epoch of each run: {' or '.join(SELECTS)} (default: the "
                                                    "saved one, else final).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the (merged) runs, summary, figures and report.html "
                                                  "to this new directory (never overwritten).")] = None,
    all_pairs: Annotated[bool, typer.Option(help="Also compare every pair of norms (Holm over all pairs) and "
                                                 "rank them.")] = False,
) -> None:
    """Print the verdict table of one results directory, or of several merged.

    The directories read are never modified. With --out, their runs (merged when several DIRs of
    the same configuration are given; norms and seeds may differ) go to a new directory with
    summary.csv/json, the figures and report.html, which `normkit report` can read again.
    """
    from normkit_lab.analysis.report import load_results, merge_into

    if margin is not None and not (margin > 0 and margin != float("inf")):
        raise fail(f"--margin must be > 0 (a finite number in the metric's unit), not {margin!r}")
    results = load_results(dirs, baseline, metric)
    if not any(run.phase == "compare" for run in results.runs):  # a table of n = 0 rows would read as results
        where = " ".join(str(d) for d in dirs)
        raise fail(f"{where} holds no comparison run yet (runs.jsonl has none): nothing to report; train the "
                   f"runs with: normkit compare --resume {dirs[0]}")
    overrides = {k: v for k, v in (("margin", margin), ("select", select)) if v is not None}
    results.config = {**results.config, **overrides}
    results.all_pairs = all_pairs
    summaries = results.summaries()  # checks select and every metric before anything is written
    term = console()
    if out is None:
        print_summary(results, summaries, term)
        return
    store = merge_into(results, out)
    show(results, store, term)


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
