"""Run a comparison: the plan's runs through `train_run`, results saved as they finish.

    cfg = config.resolve({"norms": "bn,gn+pn", "epochs": 2})
    check(cfg)                                   # every bad input fails here, before any training
    store = create_store(cfg, out=None)          # runs/<timestamp>-compare
    run_compare(cfg, store)                      # Ctrl-C keeps finished runs; resume with open_store

One path for data: plan (run identities, `normkit_lab.plan`) -> `train_run` -> store (runs.jsonl)
-> summary. With `tune`, the tuning runs come first (on the tune seeds), then each norm's
comparison runs use the values it did best with on validation. Every norm runs with the same
seeds, so runs pair by seed within a cell. A run that diverges is recorded with status
"diverged", one whose norm raises while building or training with status "failed" and its
one-line error; either way the comparison goes on. Resuming retries failed runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from normkit_lab import environment
from normkit_lab.config import CompareConfig, build_config, load_yaml, save_yaml
from normkit_lab.plan import RunId, choose, compare_plan, grid, run_count, tune_plan
from normkit_lab.progress import Progress
from normkit_lab.report import Results, write_summary
from normkit_lab.results import ResultsDir
from normkit_lab.training import check_config, failed_run, resolved_threads, train_run

CallbackFactory = Callable[[], Sequence[Any]]
TuningTable = Callable[[list[dict[str, Any]]], None]


def check(cfg: CompareConfig) -> None:
    """Validate model, dataset, norms and numbers of every cell and tuning candidate (raises a
    one-line NormkitError), and fill in the CPU thread count so config.yaml records it."""
    for cell in grid(cfg.sweep):
        for candidate in grid(cfg.tune):
            check_config(RunId.of(cfg.norms[0], 0, cell=cell, tuned=candidate).train_config(cfg.train),
                         list(cfg.norms))
    cfg.train.cpu_threads = resolved_threads(cfg.train, cfg.baseline_norm)


def create_store(cfg: CompareConfig, out: str | Path | None) -> ResultsDir:
    """A fresh results directory holding config.yaml and environment.json."""
    return ResultsDir.create(out, save_yaml(cfg), environment.environment(cfg.train.device))


def open_store(path: str | Path, overrides: dict[str, Any] | None = None) -> tuple[CompareConfig, ResultsDir]:
    """Reopen a results directory to resume it, with its saved config (plus runtime `overrides`)."""
    store = ResultsDir.open(path)
    cfg = build_config({**load_yaml(store.config_path), **(overrides or {})})
    return cfg, store


def results_of(cfg: CompareConfig, store: ResultsDir) -> Results:
    """The comparison-phase runs saved so far in `store` (tuning runs are in tuning.json)."""
    runs = [run for run in store.runs() if run.phase == "compare"]
    return Results(config=cfg.to_dict(), runs=runs, norms=list(cfg.norms), baseline=cfg.baseline_norm,
                   sources=[store.path], metric=cfg.metric)


def run_compare(cfg: CompareConfig, store: ResultsDir, *, progress: Progress | None = None,
                callbacks: CallbackFactory = tuple, on_tuned: TuningTable | None = None) -> Results:
    """Train the plan's runs that `store` does not hold yet; return all comparison runs.

    Tuning runs (if any) go first; their table is written to tuning.json and passed to
    `on_tuned`. `callbacks` makes fresh training callbacks for each run (e.g. diagnostics); this
    is the one place they reach `train_run`. Each finished run is appended to runs.jsonl and the
    summary is rewritten, so an interruption loses at most the run in progress.
    """
    progress = progress or Progress()
    finished = store.finished()
    env = environment.run_columns(cfg.train.device)
    n_tune, n_compare = run_count(cfg)
    tuning = [run_id for run_id in tune_plan(cfg) if run_id not in finished]
    progress.start(total=n_tune + n_compare, done=n_tune - len(tuning) + len(
        [r for r in finished if r.phase == "compare"]), epochs=cfg.train.epochs)
    try:
        _run_all(cfg, store, tuning, env, progress, callbacks)
        chosen = None
        if cfg.tune:
            chosen, table = choose(cfg, store.runs())
            store.write_tuning(table)
            if on_tuned is not None:
                on_tuned(table)
        todo = [run_id for run_id in compare_plan(cfg, chosen) if run_id not in finished]
        _run_all(cfg, store, todo, env, progress, callbacks)
    finally:
        progress.close()
    return results_of(cfg, store)


def _run_all(cfg: CompareConfig, store: ResultsDir, todo: list[RunId], env: dict[str, Any],
             progress: Progress, callbacks: CallbackFactory) -> None:
    for run_id in todo:
        progress.run_start(run_id.norm, run_id.seed)
        try:
            result = train_run(run_id.train_config(cfg.train), run_id.norm, run_id.seed, callbacks=callbacks(),
                               on_epoch=lambda record, n=run_id.norm, s=run_id.seed: progress.epoch_end(n, s, record))
        except Exception as exc:  # noqa: BLE001 - one norm's bug must not stop the others
            result = failed_run(run_id.norm, run_id.seed, exc)
        result.phase, result.cell, result.tuned = run_id.phase, dict(run_id.cell), dict(run_id.tuned)
        store.append_run(result, env)
        if run_id.phase == "compare":
            write_summary(store, results_of(cfg, store))
        progress.run_end(result)
