"""Executors: where the runs of a plan train. Each is a small adapter over `execute.run_job`.

    executor = make_executor(ExecutorOptions(kind="local", jobs=2))
    with executor.session():         # one command: its rounds share what the executor started
        executor.run(jobs, on_event)   # returns when every job is in the store (or was skipped)

`on_event(kind, value)` is called in this process for each run's "start", "epoch", "end" and
"skip" (a run another process finished or holds), so one progress display and the summary follow
every executor alike. Executors never decide what a run computes: that is the Job's.
"""

from __future__ import annotations

from normkit_lab.executors.options import EXECUTORS, Executor, ExecutorOptions

__all__ = ["EXECUTORS", "Executor", "ExecutorOptions", "make_executor"]


def make_executor(options: ExecutorOptions) -> Executor:
    """The executor `options.kind` names (optional engines are imported only when asked for)."""
    if options.kind == "local":
        from normkit_lab.executors.local import LocalExecutor

        return LocalExecutor(options)
    if options.kind == "ray":
        from normkit_lab.executors.ray import RayExecutor

        return RayExecutor(options)
    from normkit_lab.executors.slurm import SlurmExecutor  # the last kind ExecutorOptions accepts

    return SlurmExecutor(options)
