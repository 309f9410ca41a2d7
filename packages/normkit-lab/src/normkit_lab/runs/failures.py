"""Which failures inside a run are the norm's (recorded as a failed run) and which the machine's
(nothing recorded, the run resumes later); docs/reliability.md, "Failures inside a run".

Its own module so that the in-process runner (`normkit_lab.runs.execute`) and the DDP ranks
(`normkit_lab.runs.distributed`) classify alike without importing each other.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from normkit_lab.errors import DamagedRunFile, MachineFailure, os_error_text

# OSError numbers that mean the machine, not the norm, failed (full disk or quota, denied write, I/O error)
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO,
                            errno.EFBIG, errno.ENOMEM})


def is_norm_failure(exc: BaseException) -> bool:
    """True when `exc`, raised inside a run, is the norm's or model's failure (recorded as a failed run)."""
    if isinstance(exc, (DamagedRunFile, MachineFailure)):
        return False
    if isinstance(exc, OSError):
        return exc.errno not in MACHINE_ERRNOS
    return isinstance(exc, (Exception, SystemExit, KeyboardInterrupt))


@contextlib.contextmanager
def machine_failures(what: str) -> Iterator[None]:
    """Within the block, an OSError of the machine (MACHINE_ERRNOS) becomes one-line MachineFailure."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in MACHINE_ERRNOS:
            raise
        raise MachineFailure(f"{what} stopped, the machine failed: {os_error_text(exc)}; nothing was recorded "
                             f"and the run resumes from its last finished epoch once that is fixed") from None
