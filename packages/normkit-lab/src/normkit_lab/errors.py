"""Lab-specific errors; all are `normkit.NormkitError`, so the CLI prints them as one line."""

from __future__ import annotations

from normkit import NormkitError

MAX_MESSAGE = 400  # characters of quoted input kept in a one-line message


class DatasetMissing(NormkitError):
    """A dataset that is not on disk (it is never downloaded unless asked)."""


class ConfigError(NormkitError):
    """A training configuration value that cannot be used."""


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` on one line (runs of whitespace, newlines included, become one space), shortened."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def short_repr(value: object, limit: int = 80) -> str:
    """repr(value) on one line and at most `limit` characters (for quoting user input in errors)."""
    return one_line(repr(value), limit)
