"""Atomic file replacement: readers see the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_replace_from(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one step. An OSError that
    names no file (a write on a full disk) is raised naming `path`, so its one-line error says where."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is not None and exc.filename != str(tmp):
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never half of one."""
    with atomic_replace_from(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
