"""Trainers: what one run of a comparison executes. The comparison engine (plan, executors, store,
summary) is the same for every kind; only the training differs.

    builtin   normkit's own loop on a registered model and dataset (`normkit_lab.runs.training`)
    command   any program, `--command "python train.py --norm {norm} --seed {seed}"`
    function  a Python function, `compare_norms(..., train=my_train)`

A `Trainer` is small and picklable: executors send it with each `Job` to wherever the run trains,
and `execute.run_job` calls its `train`. It also says, before any run, whether a configuration is
runnable (`check`), which training values a run gets (`run_config`) and how a tuning run scores
(`tuning_score`), so plan, compare and the executors never look inside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from normkit_lab.records import RunId, RunResult
    from normkit_lab.runs.checkpoints import Checkpointing
    from normkit_lab.spec import CompareConfig, TrainConfig

TRAINER_KINDS = ("builtin", "command", "function")


@dataclass
class RunContext:
    """What a run reports to and restores from, outside its own arithmetic.

    `on_epoch(record)` after every finished epoch (progress, events); `checkpoint`: the run's
    per-epoch checkpoint file; `loggers`/`callbacks`: the built-in trainer's per-step loggers and
    diagnostics; `run_dir`: a directory of the run inside the results directory (kept between
    attempts, so a program that can resume itself finds its files there)."""

    run_dir: Path
    checkpoint: Checkpointing | None = None
    on_epoch: Callable[[Any], None] | None = None
    loggers: list[Any] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)


class Trainer(Protocol):
    """How the runs of a comparison train (see the module docstring)."""

    kind: str

    def check(self, cfg: CompareConfig, parallel: int = 1) -> None:
        """Refuse, with one line, a configuration this trainer cannot run; before any run or file."""

    def run_config(self, run_id: RunId, base: TrainConfig) -> TrainConfig:
        """The training values of `run_id` (its cell and tuned values applied where they are
        training keys)."""

    def train(self, job: RunJob, context: RunContext) -> RunResult:
        """Train one run (`job`: an `execute.Job`) and return its result; an exception is the run's
        failure (recorded failed by `run_job`)."""

    def tuning_score(self, cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
        """A tuning run's score on validation, higher is better; -inf for a missing, diverged,
        failed or incomplete run."""


class RunJob(Protocol):
    """What a trainer reads of the job it trains (`normkit_lab.runs.execute.Job` is one): the store's
    path, the run's training values and identity, the run options and the trainer itself."""

    @property
    def store(self) -> str: ...

    @property
    def train(self) -> TrainConfig: ...

    @property
    def run(self) -> RunId: ...

    @property
    def options(self) -> Any: ...

    @property
    def trainer(self) -> Trainer: ...

    def with_train(self, **changes: Any) -> RunJob:
        """The same job with training values changed."""
