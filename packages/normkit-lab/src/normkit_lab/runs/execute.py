"""One run, start to finish, as every executor runs it: claim it in the store, train, record.

    job = Job.make(cfg, run_id, store, RunOptions())
    result = run_job(job)          # None when another process finished it or is training it

This is the single place a run happens (the local pool, Ray tasks and SLURM array jobs all call
`run_job`), so every executor gives the same numbers and the same files. A `Job` is plain data
(picklable, small): executors send it to wherever the run trains. Nothing here knows about norms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normkit_lab.errors import DamagedRunFile, MachineFailure
from normkit_lab.records import EpochRecord, RunId, RunResult, failed_run
from normkit_lab.runs import environment
from normkit_lab.runs.builtin import BuiltinTrainer
from normkit_lab.runs.checkpoints import Checkpointing
from normkit_lab.runs.device import split_threads
from normkit_lab.runs.failures import is_norm_failure, machine_failures
from normkit_lab.runs.trainer import RunContext, Trainer
from normkit_lab.spec import CompareConfig, TrainConfig
from normkit_lab.store.results import ResultsDir

# An executor's view of a run's progress: ("start", RunId) / ("epoch", (RunId, EpochRecord)) /
# ("end", RunResult). Values pickle, so a worker process can send them through a queue.
Events = Callable[[str, Any], None]


@dataclass(frozen=True)
class RunOptions:
    """How runs execute, not what they compute (never part of a run's identity).

    keep_checkpoints: keep each run's final weights in checkpoints/ (the per-epoch checkpoint is
    always removed when a run ends); log: extra loggers ("tensorboard"; per-epoch CSV is always
    written); diagnostics: measure representations (normkit_lab.diagnostics).
    """

    keep_checkpoints: bool = False
    log: tuple[str, ...] = ()
    diagnostics: bool = False


@dataclass(frozen=True)
class Job:
    """One run to execute: where its store is, its training config (cell and tuned values applied),
    its identity, the run options and the trainer that runs it (`normkit_lab.runs.trainer`)."""

    store: str
    train: TrainConfig
    run: RunId
    options: RunOptions = field(default_factory=RunOptions)
    trainer: Trainer = field(default_factory=BuiltinTrainer)

    @classmethod
    def make(cls, cfg: CompareConfig, run_id: RunId, store: ResultsDir | str | Path,
             options: RunOptions | None = None, trainer: Trainer | None = None) -> Job:
        path = store.path if isinstance(store, ResultsDir) else Path(store)
        trainer = trainer or BuiltinTrainer()
        return cls(str(path), trainer.run_config(run_id, cfg.train), run_id, options or RunOptions(), trainer)

    def with_train(self, **changes: Any) -> Job:
        """The same job with training values changed (e.g. the CPU threads or device a slot gives it)."""
        return dataclasses.replace(self, train=dataclasses.replace(self.train, **changes))

    def sharing_cores(self, runs: int) -> Job:
        """The same job with its CPU threads cut so that `runs` parallel runs share the machine's cores."""
        return self.with_train(cpu_threads=split_threads(self.train.cpu_threads, runs))


def run_job(job: Job, events: Events | None = None, wait: bool = False) -> RunResult | None:
    """Train `job`'s run unless the store has it or another process holds it; record it.

    Returns the RunResult, or None when the run was skipped: finished already, or claimed by another
    process (with `wait`, waits for that process and then runs it only if it did not finish it).
    A failure inside the run is one of three kinds (docs/reliability.md, "Failures inside a run"):
    the norm or model failed (any exception, SystemExit and KeyboardInterrupt raised by its code
    included): recorded as a failed run; the run's checkpoint is damaged or foreign: DamagedRunFile,
    the file kept, nothing recorded; the machine failed (an OSError such as a full disk or a denied
    write, a real SIGINT/SIGTERM): MachineFailure or the interrupt propagates, nothing recorded, the
    last good checkpoint kept for the next attempt. A checkpoint is removed only after the run's row
    is written.
    """
    store = ResultsDir(Path(job.store))
    with store.claim(job.run, wait=wait) as claimed:
        if not claimed or job.run in store.finished():
            return None
        return _train_and_record(job, store, events)


def _train_and_record(job: Job, store: ResultsDir, events: Events | None) -> RunResult:
    from normkit_lab.diagnostics import callbacks_for
    from normkit_lab.runs.loggers import make_loggers

    emit = events or (lambda kind, value: None)
    run_id = job.run
    emit("start", run_id)
    checkpoint = Checkpointing(store.checkpoint_path(run_id), {"run": run_id.key(), "config": store.config_hash})
    checkpoint.load()  # a damaged or foreign checkpoint stops the comparison here (one line), the file kept
    caller_raised: list[BaseException] = []

    def on_epoch(record: EpochRecord) -> None:
        try:
            emit("epoch", (run_id, record))
        except BaseException as exc:  # the executor's own stop (e.g. its Ctrl-C), never the norm's failure
            caller_raised.append(exc)
            raise

    with machine_failures(f"run {run_id.slug()}"):
        loggers = make_loggers(job.options.log, store.path, run_id.slug())
        try:
            with _real_signals() as from_signals:
                try:
                    context = RunContext(run_dir=store.run_dir(run_id), checkpoint=checkpoint, on_epoch=on_epoch,
                                         loggers=loggers, callbacks=callbacks_for(job.options.diagnostics)())
                    result = job.trainer.train(job, context)
                except (DamagedRunFile, MachineFailure):
                    raise
                except BaseException as exc:  # noqa: BLE001 - one norm's failure, even sys.exit, must not stop the others
                    if (_from_signal(exc, from_signals) or any(exc is e for e in caller_raised)
                            or not is_norm_failure(exc)):
                        raise
                    result = failed_run(run_id.norm, run_id.seed, exc)
        finally:
            for logger in loggers:
                logger.close()
        result.trainer = job.trainer.kind
        store.append_run(with_identity(result, run_id), environment.run_columns(job.train.device))
    # the row is written: only now may the checkpoint go. A failed run restarts from its first epoch when
    # retried (its norm's code has probably changed)
    keep = job.options.keep_checkpoints and result.status != "failed"
    with machine_failures(f"run {run_id.slug()}"):
        checkpoint.finish(store.weights_path(run_id) if keep else None)
    emit("end", result)
    return result


@contextlib.contextmanager
def _real_signals() -> Iterator[list[BaseException]]:
    """Within the block, note what the process's signal handlers raise (a real Ctrl-C's KeyboardInterrupt,
    SIGTERM's `Terminated`, a cluster's requeue `SystemExit`), so that a SystemExit or KeyboardInterrupt
    raised by a norm's own code is told apart from one a signal caused. Outside the main thread handlers
    cannot be wrapped: there every KeyboardInterrupt and SystemExit counts as a signal's."""
    noted: list[BaseException] = []
    previous: dict[int, Any] = {}

    def wrap(signum: int, handler: Any) -> Callable[[int, Any], None]:
        def note(number: int, frame: Any) -> None:
            try:
                handler(number, frame)
            except BaseException as exc:
                noted.append(exc)
                raise
        return note

    try:
        for signum in signal.valid_signals():
            handler = signal.getsignal(signum)
            if callable(handler):  # Python handlers only: a default action ends the process, raising nothing
                previous[signum] = signal.signal(signum, wrap(signum, handler))
    except ValueError:  # not the main thread
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        yield [_ANY_SIGNAL]
        return
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _AnySignal(BaseException):
    """Stands for "any KeyboardInterrupt or SystemExit may be a signal's" where handlers cannot be wrapped."""


_ANY_SIGNAL = _AnySignal()


def _from_signal(exc: BaseException, noted: list[BaseException]) -> bool:
    """True when `exc` (or what it was raised from) is what a signal handler raised."""
    if _ANY_SIGNAL in noted and isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return True
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if any(seen is e for e in noted):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def with_identity(result: RunResult, run_id: RunId) -> RunResult:
    """`result` carrying the rest of `run_id` (phase, cell, tuned values), as the store keys it."""
    result.phase, result.cell, result.tuned = run_id.phase, dict(run_id.cell), dict(run_id.tuned)
    return result
