"""The built-in trainer: normkit's own loop (`normkit_lab.runs.training`) on a registered model and dataset."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from normkit_lab.records import RunId, RunResult, selected_epoch
from normkit_lab.runs.checks import check_config, planned_epochs, resolved_threads
from normkit_lab.runs.device import split_threads
from normkit_lab.runs.trainer import RunContext
from normkit_lab.runs.training import train_run
from normkit_lab.spec import CompareConfig, TrainConfig, grid


@dataclass(frozen=True)
class BuiltinTrainer:
    """Trains `TrainConfig.model` on `TrainConfig.dataset` in this process, or with
    `nproc_per_node` > 1 across processes under torchrun (`normkit_lab.runs.distributed`)."""

    kind: str = "builtin"

    def check(self, cfg: CompareConfig, parallel: int = 1) -> None:
        """Validate model, dataset, norms and numbers of every cell and tuning candidate, and fill in
        the CPU thread count so config.yaml records it: with `parallel` runs at once, the machine's
        cores are shared out between them."""
        for cell in grid(cfg.sweep):
            for candidate in grid(cfg.tune):
                check_config(RunId.of(cfg.norms[0], 0, cell=cell, tuned=candidate).train_config(cfg.train),
                             list(cfg.norms))
        if cfg.train.cpu_threads is None:
            cfg.train.cpu_threads = split_threads(resolved_threads(cfg.train, cfg.baseline_norm), parallel)

    def run_config(self, run_id: RunId, base: TrainConfig) -> TrainConfig:
        return run_id.train_config(base)

    def train(self, job: Any, context: RunContext) -> RunResult:
        if job.train.nproc_per_node > 1:
            from normkit_lab.runs.distributed import train_distributed

            return train_distributed(job, context.checkpoint, context.on_epoch)
        return train_run(job.train, job.run.norm, job.run.seed, on_epoch=context.on_epoch,
                         callbacks=context.callbacks, checkpoint=context.checkpoint, loggers=context.loggers)

    def tuning_score(self, cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
        """Val accuracy at the selected epoch; -inf when the run diverged or is incomplete."""
        return val_accuracy_score(cfg, run, run_id)


def val_accuracy_score(cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
    """A tuning run's val accuracy at the selected epoch; -inf when it diverged or is incomplete (the
    built-in trainer's score; other trainers pass their own to `choose`)."""
    epochs = planned_epochs(run_id.train_config(cfg.train))
    if run is None or run.status != "ok" or len(run.epochs) < epochs:
        return -math.inf
    record = selected_epoch(run.epochs, cfg.select)
    return record.val_acc if record is not None else -math.inf
