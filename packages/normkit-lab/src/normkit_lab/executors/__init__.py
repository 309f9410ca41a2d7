"""Executors: where the runs of a plan train. Each is a small adapter over `execute.run_job`.

    executor = make_executor(ExecutorOptions(kind="local", jobs=2))
    executor.run(jobs, on_event)   # returns when every job is in the store (or was skipped)

`on_event(kind, value)` is called in this process for each run's "start", "epoch", "end" and
"skip" (a run another process finished or holds), so one progress display and the summary follow
every executor alike. Executors never decide what a run computes: that is the Job's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from normkit_lab.errors import ConfigError
from normkit_lab.execute import Events, Job

EXECUTORS = ("local", "ray", "slurm")


@dataclass(frozen=True)
class ExecutorOptions:
    """How many runs train at once and where: `jobs` runs at once on this machine (None: one per
    GPU on CUDA, else 1), `jobs_per_gpu` runs packed on each GPU; `ray_address` an existing Ray
    cluster (None: a local instance); `slurm` submitit's parameters (partition, time, GPUs...)."""

    kind: str = "local"
    jobs: int | None = None
    jobs_per_gpu: int = 1
    ray_address: str | None = None
    slurm: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    def run(self, jobs: list[Job], on_event: Events) -> None:
        """Train every job not yet in the store; return when all are recorded (or skipped)."""


def make_executor(options: ExecutorOptions) -> Executor:
    """The executor `options.kind` names (optional engines are imported only when asked for)."""
    if options.kind == "local":
        from normkit_lab.executors.local import LocalExecutor

        return LocalExecutor(options)
    if options.kind == "ray":
        from normkit_lab.executors.ray import RayExecutor

        return RayExecutor(options)
    if options.kind == "slurm":
        from normkit_lab.executors.slurm import SlurmExecutor

        return SlurmExecutor(options)
    raise ConfigError(f"unknown executor {options.kind!r}; use one of {', '.join(EXECUTORS)}")
