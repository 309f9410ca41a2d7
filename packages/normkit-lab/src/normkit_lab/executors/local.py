"""The local executor: runs one after another in this process, or `--jobs N` at once in N processes.

Parallel runs go to a pool of spawned worker processes (fork is unsafe once torch has started
threads). On CPU the machine's cores are split between the workers (the config's thread count is
already capped at cores // jobs); on CUDA each worker owns one slot: a GPU, or `nproc_per_node`
GPUs for DDP runs, with `jobs_per_gpu` workers sharing a GPU to pack small models. Each worker
calls `run_job`, so results are those of sequential execution: every run seeds itself and the
store's locks keep two workers (or two machines) from training the same run.

The pool is started by the first `run` that needs it and kept for every later `run` inside one
`session()` (a comparison's rounds of sequential seeds, a suite's workloads): each worker imports
torch and the plugins once per command, not once per round (seconds of CPU each time).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normkit_lab.errors import ConfigError
from normkit_lab.executors.options import ExecutorOptions
from normkit_lab.processes import start_worker
from normkit_lab.records import failed_run
from normkit_lab.runs.execute import Events, Job, run_job, with_identity
from normkit_lab.store.results import ResultsDir

POLL_S = 0.2  # how often the parent drains progress events while runs train
LOST_ATTEMPTS = 2  # a run whose worker process died is run again once, then recorded failed


def cuda_slots(device: str, jobs: int | None, jobs_per_gpu: int, nproc: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES of each worker (None on CPU/MPS): every visible GPU, `jobs_per_gpu`
    workers each (or groups of `nproc` GPUs for DDP runs), cut to `jobs` slots if given."""
    import torch

    if device.startswith("cpu") or device == "mps" or not torch.cuda.is_available():
        return None
    if ":" in device:  # an explicit GPU: every worker shares it
        return [device.split(":")[1]] * max(jobs or 1, 1)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    groups = [",".join(gpus[i:i + nproc]) for i in range(0, len(gpus) - nproc + 1, nproc)]
    if not groups:
        raise ConfigError(f"runs need {nproc} GPUs each (--nproc-per-node) but {len(gpus)} are visible")
    slots = [g for g in groups for _ in range(jobs_per_gpu)]
    if jobs is not None and jobs > len(slots):
        raise ConfigError(f"--jobs {jobs} needs {jobs} GPU slots but there are {len(slots)} ({len(groups)} "
                          f"GPU{'s' if len(groups) > 1 else ''} x --jobs-per-gpu {jobs_per_gpu}); raise "
                          f"--jobs-per-gpu or lower --jobs")
    return slots[:jobs] if jobs is not None else slots


def worker_count(options: ExecutorOptions, device: str, nproc: int = 1) -> int:
    """How many runs train at once: --jobs, or one per CUDA slot, else 1."""
    return _workers(options, cuda_slots(device, options.jobs, options.jobs_per_gpu, nproc))


def _workers(options: ExecutorOptions, slots: list[str] | None) -> int:
    return len(slots) if slots is not None else options.jobs or 1


@dataclass
class _Pool:
    """The worker processes of a session, the queue their progress events come back on, and the
    `key` (workers, GPU slots) they were started for."""

    executor: ProcessPoolExecutor
    events: Any
    key: tuple[int, tuple[str, ...] | None]

    @classmethod
    def start(cls, workers: int, slots: list[str] | None) -> _Pool:
        ctx = multiprocessing.get_context("spawn")
        # a SimpleQueue writes each event to the pipe before `put` returns: a worker's events are all there
        # once its job's result is, so each `run` hands every event to its own caller (a later round's, or
        # another workload's, never gets them)
        events: Any = ctx.SimpleQueue()
        slot_queue: Any = ctx.Queue()
        for slot in slots or [None] * workers:
            slot_queue.put(slot)
        executor = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=start_worker,
                                       initargs=(os.getpid(), f"{__name__}:_init_worker", events, slot_queue))
        return cls(executor, events, (workers, None if slots is None else tuple(slots)))

    @property
    def broken(self) -> bool:
        """A worker died while the pool was idle (between rounds): it takes no more jobs."""
        return bool(getattr(self.executor, "_broken", False))

    def submit(self, job: Job, wait_for_holder: bool) -> Future[Any]:
        """`_work(job)` in a worker; on a pool that broke after `broken` was asked (a worker killed as a
        round starts), a future holding BrokenProcessPool, so the job is handled as every job of a broken pool."""
        try:
            return self.executor.submit(_work, job, wait_for_holder)
        except BrokenProcessPool as exc:
            future: Future[Any] = Future()
            future.set_exception(exc)
            return future

    def close(self, stop: bool) -> None:
        """Shut the workers down when they are done, or (`stop`: Ctrl-C, SIGTERM, an error) at once, each
        run in progress keeping its last epoch's checkpoint."""
        if stop:
            for process in list((getattr(self.executor, "_processes", None) or {}).values()):
                if process.is_alive():
                    process.terminate()
        self.executor.shutdown(wait=True, cancel_futures=stop)
        self.events.close()


class LocalExecutor:
    """Runs on this machine: in this process (one at a time) or in a pool of `jobs` processes, kept for
    the whole of a `session()`."""

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options
        self._pool: _Pool | None = None
        self._sessions = 0

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Keep one pool of workers for every `run` inside (nested sessions share the outermost one's):
        it is started by the first `run` that needs more than one worker and shut down when the
        outermost session ends, or stopped at once when it ends by an exception or Ctrl-C."""
        self._sessions += 1
        try:
            yield
        except BaseException:
            if self._sessions == 1:
                self._close(stop=True)
            raise
        finally:
            self._sessions -= 1
            if self._sessions == 0:
                self._close(stop=False)

    def run(self, jobs: list[Job], on_event: Events) -> None:
        if not jobs:
            return
        train = jobs[0].train
        slots = cuda_slots(train.device, self.options.jobs, self.options.jobs_per_gpu, train.nproc_per_node)
        workers = _workers(self.options, slots)
        if workers == 1:  # one at a time: in this process, on the configured device
            self._sequential(jobs, on_event)
            return
        with self.session():  # outside a caller's session: a pool for this call alone
            self._parallel(jobs, on_event, workers, slots)

    @staticmethod
    def _sequential(jobs: list[Job], on_event: Events) -> None:
        busy = [job for job in jobs if run_job(job, on_event) is None and not _skipped(job, on_event)]
        for job in busy:  # held by another process: wait for it, then run it only if it did not finish
            if run_job(job, on_event, wait=True) is None:
                on_event("skip", job.run)

    def _parallel(self, jobs: list[Job], on_event: Events, workers: int, slots: list[str] | None) -> None:
        # a store made for fewer jobs (resumed with more) must not oversubscribe the cores
        jobs = [job.sharing_cores(workers)
                if job.train.cpu_threads is not None else job for job in jobs]
        todo, losses = list(jobs), Counter()
        while todo:
            todo = self._pool_pass(todo, on_event, workers, slots, losses)

    def _pool_for(self, workers: int, slots: list[str] | None) -> _Pool:
        """The session's pool, started now if there is none (or it was started for other slots)."""
        key = (workers, None if slots is None else tuple(slots))
        if self._pool is not None and (self._pool.key != key or self._pool.broken):
            self._close(stop=False)
        if self._pool is None:
            self._pool = _Pool.start(workers, slots)
        return self._pool

    def _close(self, stop: bool) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(stop)

    def _pool_pass(self, todo: list[Job], on_event: Events, workers: int, slots: list[str] | None,
                   losses: Counter[Any]) -> list[Job]:
        """Run `todo` in the session's pool; returns the jobs to run again after a worker process died.

        When one worker dies the pool stops them all, so the runs it held cannot tell whose process
        died: each is run again (from its last epoch's checkpoint) in a new pool and recorded failed only
        when it is lost a second time."""
        pool = self._pool_for(workers, slots)
        futures: dict[Future[Any], Job] = {pool.submit(job, False): job for job in todo}
        retry: list[Job] = []
        broken = False
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                _drain(pool.events, on_event)
                for future in done:
                    job = futures[future]
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:
                        broken = True
                        _drain(pool.events, on_event)
                        losses[job.run] += 1
                        retry += record_lost_run(job, on_event, give_up=losses[job.run] >= LOST_ATTEMPTS)
                        continue
                    if outcome == "busy":  # another process holds it: wait for that one
                        pending.add(_resubmit(pool, futures, job))
        except BaseException:
            self._close(stop=True)
            raise
        _drain(pool.events, on_event)
        if broken:  # its workers are gone: the runs to retry, and later rounds, start a new pool
            self._close(stop=False)
        return retry


def _resubmit(pool: _Pool, futures: dict[Future[Any], Job], job: Job) -> Future[Any]:
    future = pool.submit(job, True)
    futures[future] = job
    return future


def record_lost_run(job: Job, on_event: Events, give_up: bool) -> list[Job]:
    """A worker process died (killed, out of memory, a crash in native code) while `job` was queued or
    running: [job] to run it again, or with `give_up` record it failed (its checkpoint is kept, so a
    later --resume continues it). Nothing when another process finished it.

    Waits for the run's lock: a broken pool reports its runs lost before it has stopped the other
    workers, which may still hold theirs for a moment."""
    store = ResultsDir(Path(job.store))
    with store.claim(job.run, wait=True):
        if job.run in store.finished():
            return []
        if not give_up:
            return [job]
        result = with_identity(failed_run(job.run.norm, job.run.seed, RuntimeError(
            "its worker process died (killed, out of memory or a crash in native code)")), job.run)
        store.append_run(result, {})
    on_event("end", result)
    return []


def _drain(events: Any, on_event: Events) -> None:
    while not events.empty():  # one reader (this process): what empty() saw is there to get
        kind, value = events.get()
        on_event(kind, value)


def _skipped(job: Job, on_event: Events) -> bool:
    """True (and a "skip" event) when another process has finished `job`'s run."""
    if job.run in ResultsDir(Path(job.store)).finished():
        on_event("skip", job.run)
        return True
    return False


# -- in the worker process -------------------------------------------------------------------

_EVENTS: Any = None
_SLOT: str | None = None


def _init_worker(events: Any, slot_queue: Any) -> None:
    """Take this worker's GPU slot (before CUDA starts) and the parent's event queue. Called by
    `processes.start_worker`, which first has the worker die with the parent (a SIGKILLed normkit takes
    its workers, and they their programs, along), before this module's imports."""
    global _EVENTS, _SLOT
    _EVENTS = events
    _SLOT = slot_queue.get()  # one slot per worker of the pool (a pool whose worker died is not refilled)
    if _SLOT is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = _SLOT
    signal.signal(signal.SIGINT, _idle_interrupt)


def _idle_interrupt(signum: int, frame: Any) -> None:
    """A Ctrl-C that reaches a worker waiting for its next job (between rounds): nothing of it to stop,
    and normkit, which gets it too, stops the pool; raised in the pool's own loop it would print a
    traceback. A Python handler, not SIG_IGN, which the programs a run starts would inherit."""


def _work(job: Job, wait_for_holder: bool) -> str:
    """Run one job in this worker (a Ctrl-C interrupts it as in normkit's own process); "ran", "skipped"
    (finished already) or "busy" (held elsewhere)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _work_on(job, wait_for_holder)
    finally:
        signal.signal(signal.SIGINT, _idle_interrupt)


def _work_on(job: Job, wait_for_holder: bool) -> str:
    if _SLOT is not None:
        job = job.with_train(device="cuda")
    result = run_job(job, lambda kind, value: _EVENTS.put((kind, value)), wait=wait_for_holder)
    if result is not None:
        return "ran"
    if wait_for_holder:  # the holder finished it
        _EVENTS.put(("skip", job.run))
        return "skipped"
    return "skipped" if _skipped(job, lambda kind, value: _EVENTS.put((kind, value))) else "busy"
