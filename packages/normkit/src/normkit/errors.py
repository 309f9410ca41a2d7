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


class NormShapeError(NormkitError, ValueError):
    """An input whose shape the norm cannot take (e.g. batch of one in BN training)."""


class StepError(NormShapeError):
    """A step of a norm failed on its input; the message names the spec, the step and the shape.

    The step's own exception is chained (`__cause__`) for debugging.
    """


MAX_WRAPPED = 300  # characters of a wrapped error's message kept in a one-line message


def first_line(exc: BaseException) -> str:
    """`Type: message` on one line (whitespace collapsed, at most MAX_WRAPPED characters of the
    message), for errors wrapped into one-line messages."""
    text = " ".join(str(exc).split())
    if len(text) > MAX_WRAPPED:
        text = text[:MAX_WRAPPED - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Closest valid names to `word`, for 'did you mean' hints."""
    return difflib.get_close_matches(word, sorted(set(candidates)), n=n, cutoff=0.5)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A hint such as "; did you mean 'bn' or 'bnn'?" (empty when nothing is close)."""
    matches = close_matches(word, candidates)
    if not matches:
        return ""
    return "; did you mean " + " or ".join(repr(m) for m in matches) + "?"
