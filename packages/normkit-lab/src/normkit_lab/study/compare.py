"""Run a comparison: the plan's runs through an executor, results saved as they finish.

    cfg = config.resolve({"norms": "bn,gn+pn", "epochs": 2})
    check(cfg)                                   # every bad input fails here, before any training
    store = create_store(cfg, out=None)          # runs/<timestamp>-compare
    run_compare(cfg, store)                      # Ctrl-C keeps finished runs; resume with open_store

One path for data: plan (run identities, `normkit_lab.study.plan`) -> executor (`normkit_lab.executors`:
local, a local pool, Ray, SLURM) -> `execute.run_job` (one run, checkpointed every epoch) -> store
(runs.jsonl) -> summary. With `tune`, the tuning runs come first (on the tune seeds), then each norm's
comparison runs use the values it did best with on validation. Every norm runs with the same
seeds, so runs pair by seed within a cell. A run that diverges is recorded with status
"diverged", one whose norm raises while building or training with status "failed" and its
one-line error; either way the comparison goes on. Resuming retries failed runs.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normkit_lab.analysis.report import Results, write_summary
from normkit_lab.errors import ConfigError
from normkit_lab.executors import Executor, ExecutorOptions, make_executor
from normkit_lab.records import RunId
from normkit_lab.runs import environment
from normkit_lab.runs.checks import planned_epochs, planned_steps
from normkit_lab.runs.execute import Job, RunOptions
from normkit_lab.runs.kinds import make_trainer
from normkit_lab.runs.template import CommandTemplate
from normkit_lab.runs.trainer import Trainer
from normkit_lab.spec import CompareConfig
from normkit_lab.store.results import ENVIRONMENT_FILE, ResultsDir
from normkit_lab.study import versions
from normkit_lab.study.config import build_config, load_yaml, save_yaml
from normkit_lab.study.plan import choose, compare_plan, run_count, tune_plan
from normkit_lab.study.progress import Progress
from normkit_lab.study.rounds import run_rounds
from normkit_lab.study.twins import record_copy, split_twins

TuningTable = Callable[[list[dict[str, Any]]], None]


def check(cfg: CompareConfig, parallel: int = 1, trainer: Trainer | None = None) -> None:
    """Everything the trainer needs checked before any run (raises a one-line NormkitError): for the
    built-in trainer model, dataset, norms and numbers of every cell and tuning candidate, and the
    CPU thread count filled in so config.yaml records it (`parallel` runs share the cores)."""
    (trainer or make_trainer(cfg)).check(cfg, parallel)


def create_store(cfg: CompareConfig, out: str | Path | None) -> ResultsDir:
    """A fresh results directory holding config.yaml, store.json and environment.json."""
    return ResultsDir.create(out, save_yaml(cfg), environment.environment(cfg.train.device, cfg.train.cpu_threads))


def open_store(path: str | Path, overrides: dict[str, Any] | None = None, *, allow_version_change: bool = False,
               warn: Callable[[str], None] | None = None) -> tuple[CompareConfig, ResultsDir]:
    """Reopen a results directory to resume it, with its saved config (plus runtime `overrides`);
    a config.yaml edited after runs were written is refused (see `ResultsDir.check_config_unchanged`),
    and so is a torch, normkit or plugin version other than the runs were made with, unless
    `allow_version_change` (see `normkit_lab.study.versions`). Nothing is written here: an allowed change
    is recorded by `run_compare(..., allow_version_change=True)`, once every check of the resume has
    passed, so a resume refused later (a changed script, a bad option) leaves environment.json as it
    was. `warn` gets the line saying an older directory's versions could not be checked (default:
    `warnings.warn`)."""
    store = ResultsDir.open(path)
    cfg = build_config({**load_yaml(store.config_path, saved=True), **(overrides or {})})
    _, warning = versions.check_resume(_environment_name(store), store.environment(),
                                       environment.environment(cfg.train.device), allow_version_change)
    if warning is not None:
        (warn or _warn)(warning)
    return cfg, store


def _environment_name(store: ResultsDir) -> str:
    return repr(str(store.path / ENVIRONMENT_FILE))


def record_version_change(cfg: CompareConfig, store: ResultsDir) -> None:
    """Record in environment.json the versions an allowed resume runs under, if they changed: read,
    compare and record as one step against a concurrent resume (which then finds them recorded)."""
    with store.environment_lock():
        updated, _ = versions.check_resume(_environment_name(store), store.environment(),
                                           environment.environment(cfg.train.device), allow_change=True)
        if updated is not None:
            store.write_environment(updated)


def _warn(line: str) -> None:
    warnings.warn(line, versions.UncheckedVersions, stacklevel=3)


def results_of(cfg: CompareConfig, store: ResultsDir) -> Results:
    """The comparison-phase runs saved so far in `store` (tuning runs are in tuning.json)."""
    runs = [run for run in store.runs() if run.phase == "compare"]
    return Results(config=cfg.to_dict(), runs=runs, norms=list(cfg.norms), baseline=cfg.baseline_norm,
                   sources=[store.path], metric=cfg.metric)


def _tuning_column(cfg: CompareConfig) -> tuple[str, float] | None:
    """The tuning table's column for the user's own code: the metric's validation field (None: the
    built-in trainer's val accuracy)."""
    if not cfg.external:
        return None
    from normkit_lab.metrics import metric_named

    metric = metric_named(cfg.metric)
    return metric.select_by, metric.sign


def _record_load(store: ResultsDir) -> None:
    """environment.json's `load_average_end`: the machine's load when the directory's first session of
    runs ended (with `load_average_start`, whether its wall times were measured on a busy machine).
    Written once, beside the start it pairs with: a resume or an older directory is left as it is (each
    epoch row's `load_avg` covers later sessions)."""
    with store.environment_lock():
        saved = store.environment() or {}
        if "load_average_start" in saved and "load_average_end" not in saved:
            store.write_environment({**saved, "load_average_end": list(environment.load_average())})


def run_epochs(cfg: CompareConfig) -> Callable[[RunId], int | None]:
    """The epochs each run trains (a sweep's cells or a steps budget make them differ): what progress
    counts against. The user's own code trains its own number: known only for a command that is
    given `{epochs}`; None otherwise (progress then learns it from the runs that finish)."""
    if cfg.external:
        told = cfg.command is not None and "epochs" in CommandTemplate.parse(cfg.command).fields()
        return lambda run_id: cfg.train.epochs if told else None

    @functools.cache
    def of(run_id: RunId) -> int:
        return planned_epochs(run_id.train_config(cfg.train))

    return of


def run_steps(cfg: CompareConfig) -> Callable[[RunId], int] | None:
    """The optimizer steps each built-in run takes (the ETA's unit, which weighs cells by their cost);
    None for the user's own code, which reports epochs only."""
    if cfg.external:
        return None

    @functools.cache
    def of(run_id: RunId) -> int:
        return planned_steps(run_id.train_config(cfg.train))

    return of


def run_compare(cfg: CompareConfig, store: ResultsDir, *, progress: Progress | None = None,
                on_tuned: TuningTable | None = None, executor: Executor | None = None,
                options: RunOptions | None = None, trainer: Trainer | None = None,
                allow_version_change: bool = False) -> Results:
    """Train the plan's runs that `store` does not hold yet; return all comparison runs.

    Tuning runs (if any) go first; their table is written to tuning.json and passed to
    `on_tuned`. `executor` trains them (default: one after another in this process); `options`
    say how (checkpoints kept, loggers; diagnostics follow the config); `trainer` what a run executes
    (default: `make_trainer(cfg)`, normkit's own loop); `allow_version_change` (a resume that
    `open_store` allowed to continue under other versions) records the running versions in
    environment.json before any run, as the resume goes ahead. The summary is rewritten
    after every finished comparison run, so an interruption loses at most the epochs since the
    runs in progress last saved a checkpoint.
    """
    progress = progress or Progress()
    trainer = trainer or make_trainer(cfg)
    executor = executor or make_executor(ExecutorOptions())
    options = dataclasses.replace(options or RunOptions(), diagnostics=cfg.diagnostics)
    if allow_version_change:
        record_version_change(cfg, store)
    finished = store.finished()
    n_tune, n_compare = run_count(cfg)
    tuning = [run_id for run_id in tune_plan(cfg) if run_id not in finished]
    epochs_of, steps_of = run_epochs(cfg), run_steps(cfg)
    comparing = [run_id for run_id in compare_plan(cfg, {}) if run_id not in finished]  # tuned values aside
    units = [(steps_of or epochs_of)(run_id) for run_id in tuning + comparing]
    progress.start(total=n_tune + n_compare, done=n_tune - len(tuning) + len(
        [r for r in finished if r.phase == "compare"]), epochs=epochs_of,
        left=None if None in units else sum(units), steps=steps_of)

    def on_event(kind: str, value: Any) -> None:
        if kind == "start":
            progress.run_start(value)
        elif kind == "epoch":
            progress.epoch_end(*value)
        elif kind == "skip":
            progress.run_skipped(value)
        elif kind == "end":
            progress.run_end(value)
            if value.phase == "compare":
                write_summary(store, results_of(cfg, store))

    def run_all(run_ids: list[RunId]) -> None:
        train, copies = split_twins(cfg, store, run_ids)  # a run norm_batch cannot change is trained once
        executor.run([Job.make(cfg, run_id, store, options, trainer) for run_id in train], on_event)
        unrecorded = []  # a copy of a run that failed is trained itself (and fails or not in its own right)
        for run_id, source in copies:
            if run_id in store.finished():
                continue
            if record_copy(store, run_id, source):
                on_event("end", next(run for run in store.runs() if RunId.of_run(run) == run_id))
            else:
                unrecorded.append(run_id)
        if unrecorded:
            executor.run([Job.make(cfg, run_id, store, options, trainer) for run_id in unrecorded], on_event)
        recorded = {RunId.of_run(run) for run in store.runs()}
        missing = [run_id for run_id in run_ids if run_id not in recorded]
        if missing:  # an executor must record every run it was given (ok, diverged or failed)
            raise ConfigError(f"{len(missing)} of {len(run_ids)} runs were not recorded (first: "
                              f"{missing[0].label()}); their processes may have been stopped from outside, so "
                              f"train them with: normkit compare --resume {store.path}")

    with executor.session():  # one pool of workers (--jobs N) for the tuning runs and every look
        try:
            run_all(tuning)
            chosen = None
            if cfg.tune:
                chosen, table = choose(cfg, store.runs(), trainer.tuning_score, _tuning_column(cfg))
                store.write_tuning(table)
                if on_tuned is not None:
                    on_tuned(table)
            if cfg.looks is None:
                run_all([run_id for run_id in compare_plan(cfg, chosen) if run_id not in finished])
            else:  # sequential seeds: the same plan and executor, one look at a time (study/rounds.py)
                run_rounds(cfg, store, chosen, run_all, lambda: results_of(cfg, store).summary())
        finally:
            progress.close()
            _record_load(store)
    results = results_of(cfg, store)
    write_summary(store, results)
    return results

