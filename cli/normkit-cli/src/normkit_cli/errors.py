"""One-line errors: every expected failure prints `error: ...` and exits 2, never a traceback.

Kept free of torch and normkit imports (the CLI's `--help` must start in well under a second):
normkit's errors are recognised by their class, found in the exception's MRO, not by importing it.
`NORMKIT_TRACEBACK=1` (or `normkit --traceback ...`) re-raises instead, for debugging.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

TRACEBACK_ENV = "NORMKIT_TRACEBACK"
MAX_LINE = 500
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM)
EXIT_RUNS_FAILED = 1  # results written, but some runs failed


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be so it unwinds the same way (finished runs are kept)."""


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """`text` with every run of whitespace (newlines too) as one space, at most `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def show_tracebacks() -> bool:
    """True when NORMKIT_TRACEBACK is set to anything but '', '0', 'false' or 'no'."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def is_normkit_error(exc: BaseException) -> bool:
    """True for normkit.NormkitError and its subclasses (SpecError, PluginError, lab's ConfigError)."""
    return any(cls.__name__ == "NormkitError" and cls.__module__ == "normkit.errors"
               for cls in type(exc).__mro__)


def fail(message: str) -> typer.Exit:
    """Print one line to stderr and return the Exit(2) to raise."""
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(code=2)


def runs_failed(errors: list[str], culprit: str, store: Any) -> typer.Exit:
    """Print the one-line summary of a comparison's failed runs (their count, the first one's reason, what
    to fix and how to retry them) and return the Exit(1) to raise: the results are written, but a
    script or CI job must not read "all ran" from the exit status."""
    runs = f"{len(errors)} run{'s' if len(errors) != 1 else ''}"
    typer.echo(f"{runs} failed (first: {one_line(errors[0], 300)}); fix {culprit}, then retry them with: "
               f"normkit compare --resume {store}", err=True)
    return typer.Exit(code=EXIT_RUNS_FAILED)


def interrupted_code(exc: KeyboardInterrupt) -> int:
    """143 for SIGTERM, 130 for Ctrl-C (the shells' 128 + signal number)."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` (a KeyboardInterrupt) like Ctrl-C does."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread (e.g. some test runners): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit does not fail again on the closed pipe (the
    recipe of Python's signal documentation for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test runner's stream)
        pass


def one_line_errors(fn: F) -> F:
    """Turn what a command raises into one line: NormkitError and OSError exit 2, other errors exit 1;
    Ctrl-C exits 130 and SIGTERM (handled like Ctrl-C) 143; a reader that closed the pipe exits 0.

    With NORMKIT_TRACEBACK=1 nothing is caught, so the full traceback shows.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with sigterm_as_interrupt():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except KeyboardInterrupt as exc:
            typer.echo("interrupted", err=True)
            sys.exit(interrupted_code(exc))
        except Exception as exc:
            if show_tracebacks() or type(exc).__module__.startswith("click"):
                raise
            if is_normkit_error(exc):
                raise fail(str(exc)) from None
            if isinstance(exc, BrokenPipeError):  # `normkit ... | head`: the reader has all it wanted
                _silence_stdout()
                return None
            if isinstance(exc, OSError):
                where = f" {exc.filename!r}" if exc.filename else ""
                raise fail(f"cannot access{where}: {exc.strerror or exc}") from None
            typer.echo(f"error: unexpected {type(exc).__name__}: {one_line(str(exc))} (a bug; rerun with "
                       f"{TRACEBACK_ENV}=1 for the traceback and report it)", err=True)
            raise typer.Exit(code=1) from None

    return wrapper  # type: ignore[return-value]
