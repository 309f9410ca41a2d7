"""One run on K processes: torch's elastic launcher (torchrun) around `train_run`, as DistributedDataParallel.

    result = train_distributed(job, checkpoint)       # job.train.nproc_per_node = K > 1

`execute.run_job` calls this for a job with `nproc_per_node` above 1, holding the run's lock; it
records the returned RunResult and removes the checkpoint, exactly as for a run in one process.
Here the job goes to a temporary file and `python -m torch.distributed.run --standalone` starts K
processes of this module (`python -m normkit_lab.runs.distributed JOBFILE RESULTFILE`), on a free local
port, so it needs no network. Each process joins the group (nccl on CUDA, else gloo), trains on
its GPU (`cuda:LOCAL_RANK`) or the CPU, and calls `train_run`, which then trains one DDP run with
synced batch statistics (see normkit_lab.runs.training). Rank 0 alone writes: the checkpoint (every
rank loads it on resume), the loggers, the callbacks' results, each finished epoch (relayed to
`on_epoch` here) and the result, which this process reads back. A failing rank makes the launcher
stop the others; the run then fails with the first error's one line, and the launcher's full log is
kept next to the checkpoint (`<slug>.ddp.log`). Ctrl-C or SIGTERM here stops the launcher and its
processes; a rank whose launcher or launching process disappears (even by SIGKILL) exits by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from normkit_lab.records import EpochRecord, RunResult
    from normkit_lab.runs.checkpoints import Checkpointing
    from normkit_lab.runs.trainer import RunJob

PARENT_ENV = "NORMKIT_DDP_PARENT"  # pid of the process that launched the run (the ranks watch it)
POLL_S = 0.5  # how often the launching process relays epochs and the ranks check their parents
STOP_TIMEOUT_S = 60  # after SIGTERM, how long the launcher may take to stop its processes (its own limit: 30 s)
_ERROR_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit))(:.*)?$")


class DistributedRunError(RuntimeError):
    """A DDP run's processes stopped with an error (message: the first failing rank's one line)."""


def _files(result_file: Path) -> tuple[Path, Path]:
    """Where rank 0 appends finished epochs, and the prefix of each rank's error file."""
    return result_file.with_name(result_file.name + ".epochs.jsonl"), result_file.with_name(result_file.name + ".err")


def train_distributed(job: RunJob, checkpoint: Checkpointing,
                      on_epoch: Callable[[EpochRecord], None] | None = None) -> RunResult:
    """Train `job` on `job.train.nproc_per_node` processes under torchrun; rank 0's RunResult.

    Raises DistributedRunError when the processes fail (run_job records a failed run). Ctrl-C or
    SIGTERM (any exception while waiting) stops the launcher and its processes, then propagates.
    """
    from normkit_lab.errors import DamagedRunFile, MachineFailure, one_line

    with tempfile.TemporaryDirectory(prefix="normkit-ddp-") as tmp:
        folder = Path(tmp)
        job_file, result_file, log_file = folder / "job.pkl", folder / "result.json", folder / "launcher.log"
        job_file.write_bytes(pickle.dumps((job, checkpoint)))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", str(job.train.nproc_per_node),
               "-m", "normkit_lab.runs.distributed", str(job_file), str(result_file)]
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        with log_file.open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            try:
                _wait(proc, _files(result_file)[0], on_epoch)
            except BaseException:
                _stop(proc)
                raise
        kept = checkpoint.path.with_name(checkpoint.path.name.removesuffix(".pt") + ".ddp.log")
        if proc.returncode != 0:
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(log_file.read_bytes())
            killed = _killed_rank(log_file.read_text(encoding="utf-8", errors="replace"))
            if killed is not None:  # the machine's failure (OOM killer, an operator's kill): resumable
                rank, signum = killed
                raise MachineFailure(f"run {job.run.slug()} stopped: rank {rank} of {job.train.nproc_per_node} was "
                                     f"killed by {_signal_name(signum)}; nothing was recorded and the run resumes "
                                     f"from its last finished epoch (launcher log: {kept})")
            kind, summary = _failure(result_file, log_file, proc.returncode, job.train.nproc_per_node)
            if kind == "damaged":
                raise DamagedRunFile(summary)
            if kind == "machine":
                raise MachineFailure(summary)
            raise DistributedRunError(one_line(f"{summary} (launcher log: {kept})", 1000))
        kept.unlink(missing_ok=True)  # a log kept by an earlier failed attempt
        return _read_result(result_file)


def _wait(proc: subprocess.Popen[bytes], epochs_file: Path, on_epoch: Callable[[EpochRecord], None] | None) -> None:
    """Wait for the launcher, relaying rank 0's finished epochs to `on_epoch` as they appear."""
    from normkit_lab.records import EpochRecord

    relayed = 0
    while True:
        try:
            proc.wait(timeout=POLL_S)
            done = True
        except subprocess.TimeoutExpired:
            done = False
        if on_epoch is not None and epochs_file.is_file():
            lines = epochs_file.read_text(encoding="utf-8").split("\n")[:-1]  # complete lines only
            for line in lines[relayed:]:
                on_epoch(EpochRecord(**json.loads(line)))
            relayed = len(lines)
        if done:
            return


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the launcher (it stops its processes, SIGKILL after 30 s); kill it if it does not exit."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_KILLED = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*-(\d+)")


def _killed_rank(log: str) -> tuple[int, int] | None:
    """(rank, signal) when the first failure in torchrun's failure table ("Root Cause") is a rank killed by
    a signal, else None (ranks torchrun itself stopped afterwards are listed with SIGTERM as other failures)."""
    _, marker, root_cause = log.rpartition("Root Cause")
    found = _KILLED.search(root_cause) if marker else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _failure(result_file: Path, log_file: Path, returncode: int, nproc: int) -> tuple[str, str]:
    """The kind ("norm", "damaged" or "machine", as the failing rank classified it) and one line for a
    failed launch: the first rank's own error, else the log's last error line."""
    errors = sorted(result_file.parent.glob(_files(result_file)[1].name + "*"), key=lambda p: p.stat().st_mtime_ns)
    if errors:
        first = errors[0]
        kind, _, text = first.read_text(encoding="utf-8").strip().partition(" ")
        if kind == "damaged":
            return kind, text  # names the checkpoint and what to do already
        return kind, f"rank {first.name.rsplit('.', 1)[-1]} of {nproc}: {text}"
    lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    found = [line.strip() for line in lines if _ERROR_LINE.match(line) and "ChildFailedError" not in line]
    if found:
        return "norm", f"torchrun: {found[-1]}"
    signals = [line.strip() for line in lines if "Signal" in line or "exitcode" in line]
    return "norm", f"torchrun exited with code {returncode}" + (f": {signals[-1]}" if signals else "")


def _read_result(result_file: Path) -> RunResult:
    from normkit_lab.records import EpochRecord, RunResult

    if not result_file.is_file():
        raise DistributedRunError("the DDP processes exited without rank 0's result")
    data = json.loads(result_file.read_text(encoding="utf-8"))
    return RunResult(**{**data, "epochs": [EpochRecord(**e) for e in data["epochs"]]})


# -- one rank (python -m normkit_lab.runs.distributed JOBFILE RESULTFILE, started by torchrun) --------------------


def _watch_parents() -> None:
    """Exit when the launcher (this process's parent) or the launching process is gone, so a killed
    parent never leaves ranks training (and writing the checkpoint) behind."""
    launcher = os.getppid()
    launching = int(os.environ.get(PARENT_ENV, "0"))

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            if os.getppid() != launcher or (launching > 0 and not alive(launching)):
                os._exit(143)

    threading.Thread(target=watch, name="normkit-ddp-watch", daemon=True).start()


def _error_text(exc: BaseException) -> str:
    """The line a failed rank reports: its kind ("norm", "damaged", "machine"; see failures.is_norm_failure),
    a space, then the message for NormkitErrors, else `Type: message`."""
    import normkit
    from normkit_lab.errors import DamagedRunFile, one_line
    from normkit_lab.runs.failures import is_norm_failure

    text = one_line(str(exc)) or "(no message)"
    kind = "damaged" if isinstance(exc, DamagedRunFile) else "norm" if is_norm_failure(exc) else "machine"
    return f"{kind} " + (text if isinstance(exc, normkit.NormkitError) else f"{type(exc).__name__}: {text}")


def _rank_job(job: RunJob, local_rank: int, local_world: int) -> tuple[RunJob, bool]:
    """The job as this rank trains it: its own GPU (`cuda:LOCAL_RANK`) or the CPU, and on CPU the
    run's threads shared out between the node's processes. Also whether it uses CUDA."""
    from normkit_lab.runs.device import resolve_device

    cuda = resolve_device(job.train.device).type == "cuda"
    threads = job.train.cpu_threads
    if not cuda and threads is not None:
        threads = max(1, threads // local_world)
    return job.with_train(device=f"cuda:{local_rank}" if cuda else "cpu", cpu_threads=threads), cuda


def _train_rank(job: RunJob, checkpoint: Checkpointing, rank: int, result_file: Path) -> RunResult:
    """`train_run` on this rank: rank 0 gets the loggers, callbacks and epoch relay; the others load
    the checkpoint but never write it."""
    from normkit_lab.diagnostics import callbacks_for
    from normkit_lab.runs.checkpoints import Checkpointing
    from normkit_lab.runs.loggers import make_loggers
    from normkit_lab.runs.training import train_run

    writer = rank == 0
    loggers = make_loggers(job.options.log, Path(job.store), job.run.slug()) if writer else []
    epochs_file = _files(result_file)[0]

    def relay(record: EpochRecord) -> None:
        with epochs_file.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record.as_dict()) + "\n")

    try:
        return train_run(job.train, job.run.norm, job.run.seed, on_epoch=relay if writer else None,
                         callbacks=callbacks_for(job.options.diagnostics)() if writer else (),
                         checkpoint=Checkpointing(checkpoint.path, checkpoint.identity, save=writer),
                         loggers=loggers)
    finally:
        for logger in loggers:
            logger.close()


def main(argv: list[str] | None = None) -> int:
    """One rank of a DDP run (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and the rendezvous)."""
    import torch
    import torch.distributed as dist

    from normkit_lab.store.atomic import atomic_write_text

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m torch.distributed.run ... -m normkit_lab.runs.distributed JOBFILE RESULTFILE",
              file=sys.stderr)
        return 2
    job_file, result_file = Path(args[0]), Path(args[1])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    _watch_parents()
    try:
        job, checkpoint = pickle.loads(job_file.read_bytes())  # noqa: S301 - written by train_distributed
        job, cuda = _rank_job(job, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
        result = _train_rank(job, checkpoint, rank, result_file)
        if rank == 0:
            atomic_write_text(result_file, json.dumps(dataclasses.asdict(result)))
        # every rank tears gloo down together: a rank leaving while a peer is still in rank-0-only
        # work aborted now and then in gloo's teardown ("terminate called without an active exception")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:
        with contextlib.suppress(OSError):
            (result_file.parent / f"{_files(result_file)[1].name}.{rank}").write_text(_error_text(exc) + "\n",
                                                                                   encoding="utf-8")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
