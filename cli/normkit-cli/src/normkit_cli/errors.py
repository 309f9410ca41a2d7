"""One-line errors: every expected failure prints `error: ...` and exits 2, never a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from normkit import NormkitError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str) -> typer.Exit:
    """Print one line to stderr and return the Exit(2) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def one_line_errors(fn: F) -> F:
    """Turn NormkitError (and bad values) raised by a command into one line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NormkitError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
