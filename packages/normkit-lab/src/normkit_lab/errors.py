"""Lab-specific errors; all are `normkit.NormkitError`, so the CLI prints them as one line."""

from __future__ import annotations

import errno

from normkit import NormkitError

MAX_MESSAGE = 400  # characters of quoted input kept in a one-line message


class DatasetMissing(NormkitError):
    """A dataset that is not on disk (it is never downloaded unless asked)."""


class ConfigError(NormkitError):
    """A training configuration value that cannot be used."""


class DamagedRunFile(ConfigError):
    """A run's own file (its checkpoint) is damaged or foreign: refused, kept, nothing recorded."""


class DamagedStudyFile(ConfigError):
    """A file the comparison needs to go on (looks.json) is damaged: a plain resume meets it again, so the
    answer is to restore it or start again, never `--resume`."""


class MachineFailure(NormkitError):
    """The machine failed during a run (disk full, permissions, a killed process, a signal): nothing is
    recorded as the norm's fault and the run resumes from its last good checkpoint."""


def os_error_text(exc: OSError) -> str:
    """An OSError as one short line that names its cause and file (never the raw "[Errno N]" form)."""

    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc) or type(exc).__name__
    where = f" ({exc.filename})" if exc.filename else ""
    return one_line(f"{reason}{f' [{name}]' if name else ''}{where}", 200)


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` on one line (runs of whitespace, newlines included, become one space), shortened."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def short_repr(value: object, limit: int = 80) -> str:
    """repr(value) on one line and at most `limit` characters (for quoting user input in errors)."""
    return one_line(repr(value), limit)
