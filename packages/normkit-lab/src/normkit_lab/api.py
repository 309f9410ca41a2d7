"""`compare_norms`: the comparison `normkit compare` runs, as one call for notebooks and scripts.

    from normkit_lab import compare_norms
    result = compare_norms("bn,gn+pn", epochs=1, seeds=3)
    result.summary          # one dict per (cell, norm): accuracy, difference, verdict, ...
    result.runs             # the runs.jsonl rows
    result.tuning           # the tuning table (with tune=...), else []

Your own training code instead of normkit's loop (docs/own-training.md):

    compare_norms("bn,bnn", command="python train.py --norm {norm} --seed {seed}", metric="test_acc")
    compare_norms("bn,bnn", train=my_train, seeds=5, metric="test_acc")   # my_train(norm, seed, *, cell, report)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normkit_lab.executors import ExecutorOptions, make_executor
from normkit_lab.records import RUNTIME_KEYS
from normkit_lab.runs.execute import RunOptions
from normkit_lab.study import config as lab_config
from normkit_lab.study.compare import check, create_store, open_store, run_compare

__all__ = ["ComparisonResult", "ExecutorOptions", "RunOptions", "compare_norms", "read_result"]
from normkit_lab.runs.kinds import make_trainer
from normkit_lab.store.results import SUMMARY_JSON, TUNING_FILE, ResultsDir
from normkit_lab.study.progress import Progress


@dataclass
class ComparisonResult:
    """What a comparison wrote, as plain Python data (no pandas needed).

    `config`: the resolved config (as config.yaml); `summary`: the summary.json rows; `runs`:
    the runs.jsonl rows (phase `tune` and `compare`); `tuning`: tuning.json's rows; `path`: the
    results directory (open it with `normkit report`).
    """

    path: Path
    config: dict[str, Any]
    summary: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    tuning: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdicts(self) -> list[dict[str, Any]]:
        """(cell, norm, verdict) of every summary row; verdict None where the summary has none."""
        return [{"cell": row.get("cell", {}), "norm": row["norm"], "verdict": row.get("verdict")}
                for row in self.summary]


def compare_norms(norms: str | list[str], *, out: str | Path | None = None, config: str | Path | None = None,
                  progress: Progress | None = None, executor: ExecutorOptions | None = None,
                  run_options: RunOptions | None = None, train: Callable[..., Any] | None = None,
                  resume: str | Path | None = None, allow_version_change: bool = False,
                  **options: Any) -> ComparisonResult:
    """Run a comparison with the options of `normkit compare` (keys as in config.yaml, e.g.
    `epochs=2, seeds=3, tune={"lr": [0.03, 0.1]}, sweep={"batch_size": [16, 64]}`).

    Values come from `options`, then the YAML file `config`, then the defaults; bad input raises
    a one-line `normkit.NormkitError` before any training. Results are saved under `out`
    (default runs/<timestamp>-compare), exactly as the CLI saves them. `executor` says where runs
    train (`ExecutorOptions(jobs=2)`, `ExecutorOptions(kind="ray")`, ...), `run_options` how
    (`RunOptions(keep_checkpoints=True, log=("tensorboard",))`).

    Runs are normkit's own training loop, unless `command="python train.py --norm {norm} --seed
    {seed}"` (any program, reporting `normkit: {json}` lines) or `train=my_train` (a function
    `my_train(norm, seed, *, cell, report)`) trains them: see docs/own-training.md. `resume`
    continues an interrupted comparison in that directory (its saved config; `norms` and
    `options` are then ignored except runtime keys such as device or timeout). A resume under another
    torch, normkit or plugin version than the runs were made with is refused, unless
    `allow_version_change=True` (the new versions are then recorded in environment.json under `resumes`).
    """
    executor = executor or ExecutorOptions()
    if resume is not None:
        runtime = {k: v for k, v in options.items() if k in RUNTIME_KEYS}
        cfg, store = open_store(resume, runtime, allow_version_change=allow_version_change)
        trainer = make_trainer(cfg, train)
        check(cfg, parallel=executor.parallel_runs, trainer=trainer)
    else:
        if train is not None:  # known before the config is built: sweep and tune keys are then the function's
            from normkit_lab.runs.function import reference

            options = {**options, "train_function": reference(train)}
        cfg = lab_config.resolve({"norms": norms, **options}, config)
        trainer = make_trainer(cfg, train)
        check(cfg, parallel=executor.parallel_runs, trainer=trainer)
        store = create_store(cfg, out)
    run_compare(cfg, store, progress=progress, executor=make_executor(executor), options=run_options,
                trainer=trainer, allow_version_change=allow_version_change)
    return read_result(store)


def read_result(store: ResultsDir | str | Path) -> ComparisonResult:
    """The ComparisonResult of a results directory written by a comparison (its path, or the ResultsDir)."""
    if not isinstance(store, ResultsDir):
        store = ResultsDir.open(store)
    def load(name: str) -> list[dict[str, Any]]:
        path = store.path / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []

    return ComparisonResult(path=store.path, config=lab_config.load_yaml(store.config_path, saved=True),
                            summary=load(SUMMARY_JSON), runs=store.rows(), tuning=load(TUNING_FILE))
