"""Trainers: what one run of a comparison executes. The comparison engine (plan, executors, store,
summary) is the same for every kind; only the training differs.

    builtin   normkit's own loop on a registered model and dataset (`normkit_lab.training`)
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
    from normkit_lab.checkpoints import Checkpointing
    from normkit_lab.config import CompareConfig
    from normkit_lab.plan import RunId
    from normkit_lab.training import RunResult, TrainConfig

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

    def train(self, job: Any, context: RunContext) -> RunResult:
        """Train one run (`job`: an `execute.Job`) and return its result; an exception is the run's
        failure (recorded failed by `run_job`)."""

    def tuning_score(self, cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
        """A tuning run's score on validation, higher is better; -inf for a missing, diverged,
        failed or incomplete run."""


def make_trainer(cfg: CompareConfig, function: Callable[..., Any] | None = None) -> Trainer:
    """The trainer of `cfg`: its `command`, else the `function` given, else the built-in loop."""
    if cfg.command is not None:
        from normkit_lab.trainers.command import CommandTrainer

        return CommandTrainer.of(cfg)
    if function is not None:
        from normkit_lab.trainers.function import FunctionTrainer

        return FunctionTrainer.of(cfg, function)
    if cfg.train_function is not None:
        from normkit_lab.errors import ConfigError

        raise ConfigError(f"this comparison trains the Python function {cfg.train_function}; resume it from Python "
                          f"with compare_norms(..., train={cfg.train_function.rpartition(':')[2]}, resume=DIR)")
    from normkit_lab.trainers.builtin import BuiltinTrainer

    return BuiltinTrainer()
