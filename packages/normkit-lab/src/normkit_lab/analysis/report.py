"""Views of results directories: the summary, figures and report.html, for one directory or several merged.

Directories merge when their configurations agree on everything that changes what a run computes
(model, dataset, epochs, optimizer, ...); they may differ in norms, seeds and runtime keys such as
the device. The same (norm, seed) in two directories is an error: it would count one seed twice.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normkit_lab import lm_baselines, safe_yaml, step_log
from normkit_lab.analysis import plots
from normkit_lab.analysis.caption import training_length
from normkit_lab.analysis.looks import budget_ended, read_looks
from normkit_lab.analysis.metric_family import across_metrics, recorded_metrics
from normkit_lab.analysis.report_html import render_html
from normkit_lab.analysis.summary import Run, Summary, cell_key, runs_from_results, runs_from_rows, summarize
from normkit_lab.analysis.tuning import read_tuning
from normkit_lab.diagnostics.report import write_report as write_diagnostics_files
from normkit_lab.errors import ConfigError
from normkit_lab.metrics import DEFAULT_METRIC, margin_for, margin_of, metric_list, metric_named, select_of
from normkit_lab.records import RUNTIME_KEYS, RunResult
from normkit_lab.sequential import Design
from normkit_lab.store.results import METRICS_DIR, ResultsDir, atomic_write_text, rows_to_runs
from normkit_lab.store.safe_paths import make_dirs

REPORT_HTML = "report.html"

# Keys that may differ between merged directories besides the runtime ones. The primary metric (and
# so its margin) only chooses what is read from the runs, which record every metric: the merged
# report uses --metric, else the first directory's.
_MERGE_FREE = RUNTIME_KEYS | {"norms", "seeds", "baseline", "margin", "select", "metric", "command_dir", "looks",
                              "max_cpu_minutes"}


@dataclass
class Results:
    """Runs of one or more directories, with the config they share."""

    config: dict[str, Any]
    runs: list[RunResult]
    norms: list[str]
    baseline: str
    sources: list[Path] = field(default_factory=list)
    metric: str = DEFAULT_METRIC  # the primary metric's name (see normkit_lab.metrics.METRICS)
    rows: list[dict[str, Any]] | None = None  # the runs.jsonl rows when read from disk (every key kept)
    all_pairs: bool = False  # also compare every pair of norms and rank them (--all-pairs)
    also: list[str] = field(default_factory=list)  # further metrics read (`--metric a,b`): see metric_family

    def run_views(self) -> list[Run]:
        """The runs as the summary reads them: from the rows when known, else from the RunResults."""
        return runs_from_rows(self.rows) if self.rows is not None else runs_from_results(self.runs)

    def summary(self) -> Summary:
        """Statistics and verdicts per (cell, norm), with `select` and `margin` from the config."""
        metric = metric_named(self.metric)
        summary = summarize(self.run_views(), self.norms, self.baseline, metric,
                            select=select_of(self.config), margin=margin_of(self.config, metric), pairs=self.all_pairs,
                            **self.sequential())
        baselines = self.lm_baselines()
        line = lm_baselines.note(baselines, summary.rows, metric.unit) if baselines is not None else None
        if line:  # language models: where the runs end against the n-gram tables, in every view of them
            summary.notes.append(line)
        return summary

    def sequential(self) -> dict[str, Any]:
        """summarize()'s sequential-seeds arguments for one directory run with `seeds: auto` (its looks in
        config.yaml, the rounds' stop in looks.json); none for fixed seeds or merged directories, whose
        seeds are then analyzed as one look."""
        looks = self.config.get("looks")
        if not looks or len(self.sources) != 1:
            return {}
        return {"design": Design(tuple(looks)), "seeds": list(self.config.get("seeds") or ()),
                "final": budget_ended(read_looks(self.sources[0]))}

    def lm_baselines(self) -> dict[str, Any] | None:
        """The n-gram tables recorded with a language model's runs (None for other data)."""
        return lm_baselines.baselines_of(self.rows if self.rows is not None else self.runs)

    def summaries(self) -> list[Summary]:
        """The primary metric's summary, then one per further metric (`also`), their verdicts one Holm
        family across all of them."""
        if not self.also:
            return [self.summary()]
        views, select = self.run_views(), select_of(self.config)
        others = [summarize(views, self.norms, self.baseline, metric_named(name), select=select,
                            margin=margin_for(name)) for name in self.also]
        first = self.summary()
        for other in others:
            if any(s.values for s in first.rows) and not any(s.values for s in other.rows):
                raise ConfigError(f"no finished run has {other.metric.field}, so it cannot be read; the runs "
                                  f"record {', '.join(recorded_metrics(views))}")
        return across_metrics([first, *others])


def read_config(store: ResultsDir) -> dict[str, Any]:
    raw = safe_yaml.read(store.config_path, "config", saved=True)
    norms = raw.get("norms") if isinstance(raw, dict) else None
    if not (isinstance(norms, list) and norms and all(isinstance(n, str) for n in norms)
            and isinstance(raw.get("baseline"), (str, type(None)))):
        raise ConfigError(f"{str(store.config_path)!r} is not a config written by `normkit compare` (it needs "
                          f"norms, a list of specs, and a baseline spec or null)")
    return raw


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    keys = sorted((set(a) | set(b)) - _MERGE_FREE)
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]


def _identity(run: Run) -> tuple[str, str, str, int]:
    """What makes a run unique in a comparison: phase, swept cell, norm, seed (older runs: no cell)."""
    return run.phase, cell_key(run.cell), run.norm, run.seed


def _row_identity(row: dict[str, Any]) -> tuple[str, str, str, int]:
    return row.get("phase") or "compare", cell_key(row.get("cell") or {}), row.get("norm"), row.get("seed")


def _check_one_tuned_value(runs: Sequence[RunResult]) -> None:
    """Merged comparisons that tuned must agree on what each norm ran with, or its seeds would mix
    recipes (directories that tuned on the same seeds on one machine agree)."""
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        if run.phase != "compare":
            continue
        key = (cell_key(run.cell), run.norm)
        if chosen.setdefault(key, run.tuned) != run.tuned:
            raise ConfigError(f"{run.norm} ran with {chosen[key]} in one directory and {run.tuned} in another "
                              f"(tuning chose differently); merge only comparisons that ran each norm alike")


def load_results(dirs: Sequence[str | Path], baseline: str | None = None,
                 metric: str | None = None) -> Results:
    """Load and merge results directories; refuse different configs and duplicate (norm, seed) runs.

    `metric`: the primary metric (default: the one the comparison saved, else test accuracy); a
    metric other than the saved one uses its own default margin, not the saved one's. Several, comma
    separated (`test_acc,test_loss`): the first is primary, the others are `Results.also`.
    """
    given = metric_list(metric) if metric is not None else None
    if not dirs:
        raise ConfigError("give at least one results directory")
    stores = [ResultsDir.open(d) for d in dirs]
    if len({s.path.resolve() for s in stores}) != len(stores):
        raise ConfigError("the same results directory is given twice")
    configs = [read_config(s) for s in stores]
    first = configs[0]
    norms: list[str] = []
    runs: list[RunResult] = []
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, str, int], Path] = {}
    for store, cfg in zip(stores, configs, strict=True):
        diff = _differences(first, cfg)
        if diff:
            raise ConfigError(f"cannot merge {str(store.path)!r} with {str(stores[0].path)!r}: their configs "
                              f"differ ({'; '.join(diff)}); merge only runs of the same configuration")
        norms += [n for n in cfg["norms"] if n not in norms]
        store_rows = store.rows()
        repeated_tuning = set()
        for view in runs_from_rows(store_rows):
            key = _identity(view)
            if key in seen and view.phase == "tune":
                if seen[key] != store.path:  # another candidate of this directory is not a repeat
                    repeated_tuning.add(key)  # both tuned on the same seeds: keep the first directory's runs
                continue
            if key in seen:
                raise ConfigError(f"{view.norm} seed {view.seed} is in both {str(seen[key])!r} and "
                                  f"{str(store.path)!r}; merge directories that ran different seeds or norms")
            seen[key] = store.path
        kept = [row for row in store_rows if _row_identity(row) not in repeated_tuning]
        rows += kept
        runs += rows_to_runs(kept)
    _check_one_tuned_value(runs)
    chosen = baseline or first.get("baseline") or first["norms"][0]
    if chosen not in norms:
        raise ConfigError(f"baseline {chosen!r} is not among the norms of these results ({', '.join(norms)})")
    saved = metric_list(first["metric"]) if isinstance(first.get("metric"), str) else [DEFAULT_METRIC]
    metric, *also = given or saved  # config.yaml keeps every metric of `--metric a,b`
    config = first if metric == saved[0] else {**first, "metric": metric, "margin": None}
    return Results(config=config, runs=runs, norms=norms, baseline=chosen, sources=[s.path for s in stores],
                   metric=metric, rows=rows, also=also)


def command_line() -> str:
    """The command that is running, as a shell line (`normkit ...` for the CLI)."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "normkit":
        argv[0] = "normkit"
    return shlex.join(argv)


def _title(results: Results) -> str:
    cfg = results.config
    if cfg.get("command") or cfg.get("train_function"):
        code = f"`{cfg['command']}`" if cfg.get("command") else f"{cfg['train_function']}()"
        return f"{code}: {', '.join(results.norms)} against {results.baseline}"
    return (f"{cfg.get('model')} on {cfg.get('dataset')}, {training_length(cfg)}: "
            f"{', '.join(results.norms)} against {results.baseline}")




def step_logs(runs: Sequence[Run], dirs: Sequence[Path]) -> dict[str, list[tuple[int, int, float, float]]]:
    """The step logs of `runs` by `plots.run_key`, from the first of `dirs` that holds each (a merged
    report's runs keep their logs in the directories they came from)."""
    found = {}
    for run in runs:
        key = plots.run_key(run)
        for directory in dirs:
            log = step_log.read(step_log.path_in(Path(directory) / METRICS_DIR, key))
            if log:
                found[key] = log
                break
    return found


def write_summary(store: ResultsDir, results: Results, figures: bool = False) -> list[Summary]:
    """Rewrite summary.csv/json and report.html of `store` from `results`; with `figures`, also draw
    the PNG figures (about a second) and embed them. A comparison rewrites the summary after every
    run without figures and draws them once at the end. Returns the summaries (`Results.summaries`):
    summary.csv/json hold the first metric's, report.html all of them."""
    summaries = results.summaries()
    summary = summaries[0]
    rows = summary.as_rows()
    baselines = results.lm_baselines()
    if baselines is not None:  # language models: the n-gram tables' scores beside each row
        rows = [{**row, **lm_baselines.row_fields(baselines, s.values)} for row, s in zip(rows, summary.rows,
                                                                                          strict=True)]
    store.write_summary(rows)
    views = results.run_views()
    own_code = bool(results.config.get("command") or results.config.get("train_function"))
    drawn = plots.render(summary, views, step_logs(views, [store.path, *results.sources]), own_code) if figures else {}
    plots.write_figures(store.path, drawn)
    if not figures:
        note = "Figures are drawn when the comparison finishes (or by `normkit report DIR --out NEW`)."
    else:
        note = "" if plots.available() else f"No figures: {plots.PLOTS_HINT}."
    page = render_html(summary, title=_title(results), figures=drawn, figures_note=note, config=results.config,
                       command=command_line(), environment=store.environment(),
                       sources=[str(s) for s in results.sources if s != store.path],
                       tuning=read_tuning([store.path, *results.sources]), more=summaries[1:])
    atomic_write_text(store.path / REPORT_HTML, page)
    return summaries


def write_diagnostics(store: ResultsDir, results: Results) -> list[Path]:
    """diagnostics.json/.md and their figures, for runs made with --diagnostics (else nothing)."""
    return write_diagnostics_files(store.path, results.runs, results.norms)


def refuse_out_inside_inputs(out: str | Path | None, sources: list[Path] | list[str]) -> None:
    """A report never writes into a directory it reads: `out` (links resolved) inside, or equal to, a source
    is refused before anything is created."""
    target = Path(os.path.realpath(out if out is not None else "runs"))  # realpath: a link loop is no error
    for source in sources:
        real = Path(os.path.realpath(source))
        if target == real or real in target.parents:
            raise ConfigError(f"--out {str(out if out is not None else 'runs/')!r} is inside input directory "
                              f"{str(source)!r} (it resolves to {str(target)!r}); a report never writes into a "
                              f"directory it reads, so choose --out outside it")


def merge_into(results: Results, out: str | Path | None) -> ResultsDir:
    """A new results directory holding the merged config and runs, each source's environment, the
    tuning table and the runs' step logs (so reading it again draws and shows the same)."""
    refuse_out_inside_inputs(out, results.sources)
    environments = {str(source): ResultsDir.open(source).environment() for source in results.sources}
    config = {**results.config, "norms": results.norms, "baseline": results.baseline,
              "seeds": sorted({r.seed for r in results.runs})}
    store = ResultsDir.create(out, safe_yaml.dumps(config), {"merged_from": environments},
                              kind="report")
    for source in results.sources:
        store.append_rows(ResultsDir.open(source).rows())
    tuning = read_tuning(results.sources)
    if tuning:
        store.write_tuning(tuning)
    logs = step_logs(results.run_views(), results.sources)
    if logs:
        steps_dir = make_dirs(store.path, store.path / METRICS_DIR / step_log.STEPS_DIR)
        for key, rows in logs.items():
            atomic_write_text(steps_dir / f"{key}.csv", step_log.rows_text(rows, header=True))
    return store
