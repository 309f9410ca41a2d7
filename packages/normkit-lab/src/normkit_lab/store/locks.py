"""File locks that let several processes (a local pool, Ray tasks, SLURM array jobs) share one store.

`filelock` takes an advisory lock (flock on Unix) that the operating system drops when its process
dies, so a killed worker never leaves a run claimed forever and no stale-lock cleanup is needed. On
shared storage the file system must support locks (NFSv4 does; Lustre needs the `flock` mount
option); docs/scaling.md says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the lock at `path` for the block, waiting for it if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path), thread_local=False, is_singleton=False, preserve_lock_file=True):
        yield


@contextlib.contextmanager
def try_exclusive(path: Path, wait: bool = False) -> Iterator[bool]:
    """Try to hold the lock at `path` for the block: yields True when held, False when another
    process (or another lock object in this one) holds it; with `wait`, blocks until it is free."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), thread_local=False, is_singleton=False, preserve_lock_file=True)
    try:
        lock.acquire(timeout=-1 if wait else 0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
