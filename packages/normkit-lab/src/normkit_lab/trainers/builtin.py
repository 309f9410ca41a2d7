"""The built-in trainer: normkit's own loop (`normkit_lab.training`) on a registered model and dataset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normkit_lab.trainers import RunContext
from normkit_lab.training import train_run

if TYPE_CHECKING:
    from normkit_lab.config import CompareConfig
    from normkit_lab.plan import RunId
    from normkit_lab.training import RunResult, TrainConfig


@dataclass(frozen=True)
class BuiltinTrainer:
    """Trains `TrainConfig.model` on `TrainConfig.dataset` in this process, or with
    `nproc_per_node` > 1 across processes under torchrun (`normkit_lab.distributed`)."""

    kind: str = "builtin"

    def check(self, cfg: CompareConfig, parallel: int = 1) -> None:
        """Validate model, dataset, norms and numbers of every cell and tuning candidate, and fill in
        the CPU thread count so config.yaml records it: with `parallel` runs at once, the machine's
        cores are shared out between them."""
        from normkit_lab.executors.local import split_threads
        from normkit_lab.plan import RunId, grid
        from normkit_lab.training import check_config, resolved_threads

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
            from normkit_lab.distributed import train_distributed

            return train_distributed(job, context.checkpoint, context.on_epoch)
        return train_run(job.train, job.run.norm, job.run.seed, on_epoch=context.on_epoch,
                         callbacks=context.callbacks, checkpoint=context.checkpoint, loggers=context.loggers)

    def tuning_score(self, cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
        """Val accuracy at the selected epoch; -inf when the run diverged or is incomplete."""
        from normkit_lab.plan import val_accuracy_score

        return val_accuracy_score(cfg, run, run_id)
