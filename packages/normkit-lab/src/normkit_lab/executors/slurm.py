"""The SLURM executor: each call of `run` (each phase of the plan) is one submitit job array, a task per run.

    normkit compare --norms bn,gn --executor slurm --slurm-partition gpu --slurm-time 120

Every array task calls `execute.run_job(job, wait=True)` on its compute node against the results
directory, which must be on storage that the submitting and the compute nodes share (with working
file locks): the store's run locks, per-epoch checkpoints and locked runs.jsonl appends then work as
they do for local runs, and the numbers are the same. This process only submits, polls and relays
progress: "start" and "epoch" from each run's metrics CSV (rewritten atomically by the task),
"end"/"skip" from each task's result. A task that ends without a result (killed, out of memory,
cancelled, timed out too often) is recorded as a failed run keeping its checkpoint, so
`--resume` continues it from its last finished epoch.

Preemption and timeouts: the submitted callable is a `submitit.helpers.Checkpointable`; on SLURM's
warning signal submitit requeues the same task, which resumes from the run's last epoch checkpoint
(the store does the checkpointing, so the task carries no state). Ctrl-C here leaves the array
running: its tasks fill the store, and `normkit compare --resume DIR` collects them. A run that
another process is training when `run` starts (an earlier array, on resume) is watched instead of
submitted again; should that process stop without finishing it, it goes in a second, small array.

`--slurm-param cluster=local` runs exactly this path with submitit's local executor (one process per
run on this machine, all at once): for tests and for trying a configuration without a cluster.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normkit import NormkitError
from normkit_lab.errors import ConfigError, one_line
from normkit_lab.executors.options import ExecutorOptions
from normkit_lab.records import EpochRecord, RunId, RunResult, failed_run
from normkit_lab.runs.execute import Events, Job, run_job, with_identity
from normkit_lab.spec import TrainConfig
from normkit_lab.store.results import METRICS_DIR, ResultsDir, epoch_fields

try:  # the task class below must be a real Checkpointable; without submitit, SlurmExecutor() refuses to start
    from submitit.helpers import Checkpointable
except ImportError:  # pragma: no cover - exercised only without the extra
    Checkpointable = object  # type: ignore[assignment,misc]

MISSING = ("--executor slurm needs submitit: pip install 'submitit>=1.5' (normkit-lab's extra slurm; normkit is "
           "not on PyPI)")
CLUSTERS = ("slurm", "local")
SLURM_DIR = "slurm"  # <store>/slurm/<job id>/: submitit's pickles and each task's logs
DEFAULT_TIMEOUT_MIN = 60
# submitit's cluster-independent parameters; any other key is a SLURM one (slurm_ is added when missing)
GENERIC = ("name", "timeout_min", "mem_gb", "nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node",
           "stderr_to_stdout")
CONSTRUCTOR = ("max_num_timeout", "python", "max_pickle_size_gb")  # submitit executor arguments, not sbatch ones
POLL_S = {"slurm": 2.0, "local": 0.2}  # a poll stats each pending task's files: gentle on shared storage
SHOWN_RUNS = 8  # runs named in the Ctrl-C message


class TaskLost(NormkitError):
    """A run's task ended without a result: the run is recorded failed (its checkpoint is kept)."""


class _NotRequeued(BaseException):
    """submitit refused to requeue (timed out too often): a BaseException, so run_job does not record
    the run as a norm failure (which would delete its checkpoint); the driver records it, keeping it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class RunTask(Checkpointable):
    """One array task: train one run into the shared store.

    On preemption or timeout submitit calls `checkpoint` and requeues the same task; the new attempt
    waits for the run's lock and resumes from the run's last epoch checkpoint.
    """

    def __init__(self, job: Job) -> None:
        self.job = job

    def __call__(self) -> RunResult | None:
        _guard_requeue_signal()
        try:
            return run_job(self.job, wait=True)
        except _NotRequeued as stop:
            raise stop.error from None

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """The same task again: the run's state is in the store's checkpoint, not in this object."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


def _guard_requeue_signal() -> None:
    """In the task process: forked children (DataLoader workers) ignore SLURM's warning signal, which
    would otherwise run submitit's requeue handler they inherit; and submitit's "not requeued" error
    leaves run_job as a BaseException (see _NotRequeued)."""
    from submitit import JobEnvironment

    signum = JobEnvironment._usr_sig()
    handler = signal.getsignal(signum)
    if callable(handler) and not getattr(handler, "_normkit", False):
        def guarded(sig: int, frame: Any, _original: Callable[..., Any] = handler) -> None:
            try:
                _original(sig, frame)
            except Exception as exc:  # submitit's UncompletedJobError: not requeued
                raise _NotRequeued(exc) from exc

        guarded._normkit = True  # type: ignore[attr-defined]
        signal.signal(signum, guarded)
    os.register_at_fork(after_in_child=lambda: signal.signal(signum, signal.SIG_IGN))


class SlurmExecutor:
    """Runs each batch of jobs as one submitit job array and waits for it here.

    `options.slurm` holds submitit's parameters: the generic ones (timeout_min, gpus_per_node,
    cpus_per_task, mem_gb, name), SLURM ones with or without their `slurm_` prefix (partition,
    account, qos, constraint, array_parallelism, setup, ...), `max_num_timeout`/`python` for the
    executor, and `cluster` ("slurm", the default, or "local"). Unset: timeout_min 60,
    gpus_per_node = nproc_per_node on CUDA (else none), cpus_per_task = nproc_per_node x
    (cpu_threads + num_workers), one task per node, one node.
    """

    def __init__(self, options: ExecutorOptions) -> None:
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise ConfigError(MISSING) from None
        self.options = options
        self.cluster, self.constructor, self.params = split_parameters(options.slurm)
        if self.cluster == "slurm" and shutil.which("srun") is None:
            raise ConfigError("--executor slurm submits with sbatch, but srun/sbatch are not on PATH here: run "
                              "normkit on a SLURM login node (to try it without a cluster: --slurm-param "
                              "cluster=local)")
        with tempfile.TemporaryDirectory(prefix="normkit-slurm-") as scratch:  # bad parameters fail now
            self._executor(Path(scratch), self.params)

    def session(self) -> contextlib.AbstractContextManager[None]:
        """Nothing is kept across calls: each `run` submits its jobs and waits for them."""
        return contextlib.nullcontext()

    def run(self, jobs: list[Job], on_event: Events) -> None:
        if not jobs:
            return
        store = Path(jobs[0].store)
        jobs = self._fit_threads(jobs)
        params = self.parameters(jobs)
        executor = self._executor(store / SLURM_DIR / "%j", params)
        watches = [_Watch(job) for job in jobs]  # before any task starts: what the store shows of each run
        # a run another process trains now (say an array still running after Ctrl-C, when resuming) is not
        # submitted again, which would hold a second allocation waiting for its lock: it is watched, and
        # submitted only if that process stops without finishing it
        held = [w for w in watches if _held(w.job)]
        queue = [w for w in watches if w not in held]
        pending: dict[Any, _Watch] = {}
        limit = _local_parallelism(params) if self.cluster == "local" else len(jobs)
        try:
            while pending or queue or held:
                if queue and len(pending) < limit:  # SLURM: all at once; local: the array throttling, by hand
                    pending.update(self._submit(executor, queue, limit - len(pending)))
                for sub in list(pending):
                    watch = pending[sub]
                    done = sub.done()
                    watch.relay(on_event)
                    if done:
                        del pending[sub]
                        _collect(sub, watch, on_event)
                for watch in [w for w in held if not _held(w.job)]:
                    held.remove(watch)
                    if watch.job.run in ResultsDir(store).finished():
                        on_event("skip", watch.job.run)
                    else:
                        queue.append(watch)
                if (pending or held) and not (queue and len(pending) < limit):
                    time.sleep(POLL_S[self.cluster])
        except KeyboardInterrupt:
            _say_detached(list(pending), [w.job for w in pending.values()], self.cluster, store)
            raise

    def _submit(self, executor: Any, queue: list[_Watch], room: int) -> dict[Any, _Watch]:
        """Submit the first `room` runs of `queue` (taken off it) as one array; their submitit jobs."""
        batch = queue[:room]
        del queue[:room]
        try:
            submitted = executor.submit_array([RunTask(watch.job) for watch in batch])
        except (OSError, RuntimeError) as exc:  # sbatch refused (partition, account, limits) or is missing
            raise ConfigError(f"SLURM did not accept the job array: {one_line(str(exc))}") from None
        return dict(zip(submitted, batch, strict=True))

    def parameters(self, jobs: list[Job]) -> dict[str, Any]:
        """submitit's parameters for an array of `jobs`: the given ones plus the defaults for unset ones."""
        params = dict(self.params)
        params.setdefault("timeout_min", DEFAULT_TIMEOUT_MIN)
        params.setdefault("name", f"normkit-{jobs[0].run.phase}")
        params.setdefault("tasks_per_node", 1)
        params.setdefault("nodes", 1)
        if "gpus_per_node" not in params:
            gpus = max(_gpus(job.train) for job in jobs)
            if gpus:
                params["gpus_per_node"] = gpus
        if "cpus_per_task" not in params:
            cpus = max(_cpus(job.train) for job in jobs)
            if cpus:
                params["cpus_per_task"] = cpus
        return params

    def sbatch_text(self, jobs: list[Job]) -> str:
        """The sbatch script `run(jobs)` would submit (SLURM only; nothing is submitted)."""
        from submitit.slurm.slurm import _make_sbatch_string

        if self.cluster != "slurm":
            raise ConfigError("sbatch_text needs cluster=slurm")
        executor = self._executor(Path(jobs[0].store) / SLURM_DIR / "%j", self.parameters(jobs))
        inner = executor._executor
        return str(_make_sbatch_string(command=inner._submitit_command_str, folder=inner.folder,
                                       map_count=len(jobs) if len(jobs) > 1 else None, **inner.parameters))

    def _executor(self, folder: Path, params: dict[str, Any]) -> Any:
        """A submitit AutoExecutor for `folder` with `params`; submitit's complaints become one ConfigError."""
        import submitit

        try:
            executor = submitit.AutoExecutor(folder=folder, cluster=self.cluster, **self.constructor)
            executor.update_parameters(**params)
        except (AssertionError, NameError, ValueError, TypeError, RuntimeError) as exc:
            raise ConfigError(f"--slurm-param: submitit refused the parameters: {one_line(str(exc))}") from None
        return executor

    def _fit_threads(self, jobs: list[Job]) -> list[Job]:
        """With --slurm-cpus-per-task given, each run's torch threads fit in it (the config's count was
        chosen for the submitting machine's cores)."""
        cpus = self.params.get("cpus_per_task")
        if not isinstance(cpus, int) or cpus < 1:
            return jobs
        fitted = []
        for job in jobs:
            per_process = max(1, cpus // max(job.train.nproc_per_node, 1))
            threads = job.train.cpu_threads
            fitted.append(job.with_train(cpu_threads=per_process) if threads and threads > per_process else job)
        return fitted


def split_parameters(given: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(cluster, submitit executor arguments, submitit parameters) from `--slurm-param`-style keys:
    a key that is neither generic nor prefixed by an executor name is a SLURM one (account -> slurm_account)."""
    params = {str(k).strip().replace("-", "_"): v for k, v in given.items()}
    cluster = params.pop("cluster", "slurm")
    if cluster not in CLUSTERS:
        raise ConfigError(f"--slurm-param cluster={cluster!r}: use slurm (the default) or local (no cluster, "
                          f"for tests)")
    constructor, out = {}, {}
    for key, value in params.items():
        if key not in GENERIC and not key.startswith(("slurm_", "local_", "debug_")):
            key = f"slurm_{key}"
        if key not in GENERIC and key.split("_", 1)[1] in CONSTRUCTOR:
            constructor[key] = value
        else:
            out[key] = value
    for key, want in (("tasks_per_node", 1), ("nodes", 1)):
        if out.get(key, want) != want:
            raise ConfigError(f"--slurm-param {key}={out[key]!r}: each run is one task on one node (it "
                              f"starts its own torchrun for --nproc-per-node); drop it")
    return cluster, constructor, out


def _local_parallelism(params: dict[str, Any]) -> int:
    """Runs at once with cluster=local: slurm_array_parallelism, else as many as the cores hold."""
    given = params.get("slurm_array_parallelism")
    if isinstance(given, int) and given >= 1:
        return given
    return max(1, (os.cpu_count() or 1) // max(int(params.get("cpus_per_task") or 1), 1))


def _held(job: Job) -> bool:
    """True when another process holds `job`'s run lock (it is training that run now)."""
    with ResultsDir(Path(job.store)).claim(job.run) as claimed:
        return not claimed


def _gpus(train: TrainConfig) -> int:
    """GPUs a run needs: nproc_per_node on CUDA ("auto" counts as CUDA when this machine has one)."""
    device = str(train.device)
    if device.startswith("cuda"):
        return train.nproc_per_node
    if device == "auto":
        import torch

        return train.nproc_per_node if torch.cuda.is_available() else 0
    return 0


def _cpus(train: TrainConfig) -> int:
    """CPUs a run uses: its torch threads and DataLoader workers, for each of its processes."""
    if train.cpu_threads is None:
        return 0
    return max(train.nproc_per_node, 1) * (train.cpu_threads + train.num_workers)


# -- the driver's view of a run ----------------------------------------------------------------


class _Watch:
    """What the driver has reported of one run: whether it started and how many epochs it finished,
    read from the run's metrics CSV, which the task rewrites atomically (created when training starts,
    one row per finished epoch). Rows an earlier attempt left are not reported again."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.path = Path(job.store) / METRICS_DIR / f"{job.run.slug()}.csv"
        self.seen = self._stat()
        self.started = False
        self.epochs = len(self._records()) if self.seen is not None else 0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _records(self) -> list[EpochRecord]:
        try:
            with self.path.open(newline="", encoding="utf-8") as f:
                return [_record(row) for row in csv.DictReader(f)]
        except (OSError, ValueError, TypeError, csv.Error):
            return []

    def relay(self, on_event: Events) -> None:
        """"start" once the run's CSV is (re)written, then an "epoch" for each new row."""
        stat = self._stat()
        if stat is None or stat == self.seen:
            return
        self.seen = stat
        self.start(on_event)
        for record in self._records():
            if record.epoch >= self.epochs:
                self.epochs = record.epoch + 1
                on_event("epoch", (self.job.run, record))

    def start(self, on_event: Events) -> None:
        if not self.started:
            self.started = True
            on_event("start", self.job.run)


_EPOCH_FIELDS = frozenset(epoch_fields())


def _record(row: dict[str, Any]) -> EpochRecord:
    values = {k: None if v in ("", None) else (int(v) if k == "epoch" else float(v))
              for k, v in row.items() if k in _EPOCH_FIELDS}
    return EpochRecord(**values)


def _collect(task: Any, watch: _Watch, on_event: Events) -> None:
    """A finished task: "end" with its result, "skip" when another process had the run, or the run
    recorded failed when the task ended without a result."""
    try:
        result = task.result()
    except Exception as exc:  # noqa: BLE001 - killed, cancelled, timed out too often, node failure, ...
        _task_lost(task, watch, exc, on_event)
        return
    if result is None:
        on_event("skip", watch.job.run)
        return
    watch.start(on_event)
    on_event("end", result)


def _task_lost(task: Any, watch: _Watch, exc: Exception, on_event: Events) -> None:
    """Record `watch`'s run failed (unless it finished, or another process holds it), keeping its
    checkpoint so that --resume continues it from its last epoch."""
    job = watch.job
    store = ResultsDir(Path(job.store))
    with store.claim(job.run) as claimed:
        if not claimed:  # another process trains it now
            on_event("skip", job.run)
            return
        result = _stored(store, job.run)
        if result is None:
            result = with_identity(failed_run(job.run.norm, job.run.seed, TaskLost(
                f"its SLURM task {task.job_id} ended without a result ({_reason(exc)}); log: {task.paths.stderr}")),
                job.run)
            store.append_run(result, {})
    watch.start(on_event)
    on_event("end", result)


def _stored(store: ResultsDir, run_id: RunId) -> RunResult | None:
    """The run's finished result in the store (a task that died after recording it), else None."""
    if run_id not in store.finished():
        return None
    return next((r for r in reversed(store.runs()) if RunId.of_run(r) == run_id and r.status != "failed"), None)


def _reason(exc: Exception) -> str:
    """The informative line of submitit's error: the exception line of a task's traceback, else its
    first lines (state and path)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    dashes = [i for i, line in enumerate(lines) if set(line) == {"-"}]
    if len(dashes) >= 2 and dashes[1] > dashes[0] + 1:  # FailedJobError: the trace sits between dashes
        return one_line(lines[dashes[1] - 1], 200)
    return one_line(" ".join(lines[:2]) or type(exc).__name__, 200)


def _say_detached(tasks: list[Any], jobs: list[Job], cluster: str, store: Path) -> None:
    """Ctrl-C: name the runs whose tasks go on (they fill the store) and how to stop them."""
    if not tasks:
        return
    names = ", ".join(job.run.label() for job in jobs[:SHOWN_RUNS]) + (", ..." if len(jobs) > SHOWN_RUNS else "")
    arrays = sorted({str(task.job_id).split("_")[0] for task in tasks})
    if cluster == "slurm":
        where = f"SLURM job array {', '.join(arrays)} keeps training {len(tasks)} runs ({names})"
        stop = f"; to stop them: scancel {' '.join(arrays)}"
    else:
        where = f"submitit local processes keep training {len(tasks)} runs ({names})"
        stop = ""
    print(f"{where}: they write to {store}; collect them later with: normkit compare --resume {store} "
          f"(with your --executor slurm flags, to train what is left on the cluster){stop}", file=sys.stderr,
          flush=True)
