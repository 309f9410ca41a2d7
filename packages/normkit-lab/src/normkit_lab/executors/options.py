"""How runs execute (`ExecutorOptions`) and what an executor does (`Executor`): the part of
`normkit_lab.executors` every executor and the study import, apart from `make_executor`, which
imports the executors themselves.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from normkit_lab.errors import ConfigError
from normkit_lab.limits import MAX_JOBS
from normkit_lab.runs.execute import Events, Job

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

    def __post_init__(self) -> None:
        """Refuse bad values when the options are made, before any store is created."""
        if self.kind not in EXECUTORS:
            raise ConfigError(f"unknown executor {self.kind!r}; use one of {', '.join(EXECUTORS)}")
        for flag, value in (("--jobs", self.jobs), ("--jobs-per-gpu", self.jobs_per_gpu)):
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                          and 1 <= value <= MAX_JOBS):
                raise ConfigError(f"{flag} must be an integer in [1, {MAX_JOBS:,}], got {value!r}")

    @property
    def parallel_runs(self) -> int:
        """Runs training at once on this machine, which share its CPU cores: --jobs for the local
        executor, else 1 (a cluster's runs train elsewhere)."""
        return (self.jobs or 1) if self.kind == "local" else 1


class Executor(Protocol):
    def run(self, jobs: list[Job], on_event: Events) -> None:
        """Train every job not yet in the store; return when all are recorded (or skipped)."""

    def session(self) -> contextlib.AbstractContextManager[None]:
        """The span of one command (a comparison's rounds, a suite's workloads): what `run` starts that
        can serve later calls (the local executor's worker processes) is kept until it ends."""
