"""Run a comparison: every (norm, seed) of the plan through `train_run`, results saved as they finish.

    cfg = config.resolve({"norms": "bn,gn+pn", "epochs": 2})
    check(cfg)                                   # every bad input fails here, before any training
    store = create_store(cfg, out=None)          # runs/<timestamp>-compare
    run_compare(cfg, store)                      # Ctrl-C keeps finished runs; resume with open_store

Every norm runs with the same seeds, so runs pair by seed. A run that diverges is recorded with
status "diverged", one whose norm raises while building or training with status "failed" and its
one-line error; either way the comparison goes on. Resuming retries failed runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from normkit_lab import environment
from normkit_lab.config import CompareConfig, build_config, load_yaml, save_yaml
from normkit_lab.progress import Progress
from normkit_lab.report import Results, write_summary
from normkit_lab.results import ResultsDir
from normkit_lab.training import check_config, failed_run, train_run

CallbackFactory = Callable[[], Sequence[Any]]


def check(cfg: CompareConfig) -> None:
    """Validate model, dataset, norms and numbers (raises NormkitError with one line)."""
    check_config(cfg.train, list(cfg.norms))


def create_store(cfg: CompareConfig, out: str | Path | None) -> ResultsDir:
    """A fresh results directory holding config.yaml and environment.json."""
    return ResultsDir.create(out, save_yaml(cfg), environment.environment(cfg.train.device))


def open_store(path: str | Path, overrides: dict[str, Any] | None = None) -> tuple[CompareConfig, ResultsDir]:
    """Reopen a results directory to resume it, with its saved config (plus runtime `overrides`)."""
    store = ResultsDir.open(path)
    cfg = build_config({**load_yaml(store.config_path), **(overrides or {})})
    return cfg, store


def results_of(cfg: CompareConfig, store: ResultsDir) -> Results:
    """The comparison's runs saved so far in `store`."""
    return Results(config=cfg.to_dict(), runs=store.runs(), norms=list(cfg.norms), baseline=cfg.baseline_norm,
                   sources=[store.path])


def run_compare(cfg: CompareConfig, store: ResultsDir, *, progress: Progress | None = None,
                callbacks: CallbackFactory = tuple) -> Results:
    """Train the plan's runs that `store` does not hold yet; return all runs of the comparison.

    `callbacks` makes fresh training callbacks for each run (e.g. diagnostics); this is the one
    place they reach `train_run`. Each finished run is appended to runs.jsonl and the summary is
    rewritten, so an interruption loses at most the run in progress.
    """
    progress = progress or Progress()
    finished = store.finished()
    plan = cfg.plan()
    todo = [(norm, seed) for norm, seed in plan if (norm, seed) not in finished]
    env = environment.run_columns(cfg.train.device)
    progress.start(total=len(plan), done=len(plan) - len(todo), epochs=cfg.train.epochs)
    try:
        for norm, seed in todo:
            progress.run_start(norm, seed)
            try:
                result = train_run(cfg.train, norm, seed, callbacks=callbacks(),
                                   on_epoch=lambda record, n=norm, s=seed: progress.epoch_end(n, s, record))
            except Exception as exc:  # noqa: BLE001 - one norm's bug must not stop the others
                result = failed_run(norm, seed, exc)
            store.append_run(result, env)
            write_summary(store, results_of(cfg, store))
            progress.run_end(result)
    finally:
        progress.close()
    return results_of(cfg, store)
