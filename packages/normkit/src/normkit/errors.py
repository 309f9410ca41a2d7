"""Exceptions users see: each carries one line that says what went wrong and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class NormkitError(Exception):
    """Base class for every error normkit raises on purpose (CLI prints it as one line)."""


class SpecError(NormkitError, ValueError):
    """A spec string, parameter or composition that cannot be built."""


class PluginError(NormkitError):
    """A plugin that failed to load or registered something invalid."""


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Closest valid names to `word`, for 'did you mean' hints."""
    return difflib.get_close_matches(word, sorted(set(candidates)), n=n, cutoff=0.5)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A hint such as "; did you mean 'bn' or 'bnn'?" (empty when nothing is close)."""
    matches = close_matches(word, candidates)
    if not matches:
        return ""
    return "; did you mean " + " or ".join(repr(m) for m in matches) + "?"
