"""Lab-specific errors; all are `normkit.NormkitError`, so the CLI prints them as one line."""

from __future__ import annotations

from normkit import NormkitError


class DatasetMissing(NormkitError):
    """A dataset that is not on disk (it is never downloaded unless asked)."""


class ConfigError(NormkitError):
    """A training configuration value that cannot be used."""
