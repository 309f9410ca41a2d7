"""The Typer app. Each command module adds its commands with `register(app)`.

Command modules import torch, normkit and the lab inside their command functions only, so
`normkit --help` and every `normkit CMD --help` start without loading them (docs/performance.md).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from normkit_cli import bench, catalog, compare, diagnose, report, reproduce, suite
from normkit_cli.errors import TRACEBACK_ENV, interrupted_code, one_line, show_tracebacks

app = typer.Typer(
    name="normkit",
    help="Build, compose and fairly compare normalization layers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def main_options(
    traceback: Annotated[bool, typer.Option("--traceback", help=f"Show the full traceback of an error instead "
                                                                f"of one line (same as {TRACEBACK_ENV}=1).")]
    = False,
) -> None:
    """Build, compose and fairly compare normalization layers."""
    if traceback:
        os.environ[TRACEBACK_ENV] = "1"


for module in (catalog, bench, compare, report, diagnose, reproduce, suite):
    module.register(app)


def main() -> None:
    """Entry point: usage errors (bad option values, unknown options) also print one line, exit 2."""
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt as exc:  # outside a command (commands handle their own)
        typer.echo("interrupted", err=True)
        sys.exit(interrupted_code(exc))
    except Exception as exc:  # noqa: BLE001 - click's usage errors, found by their interface
        if type(exc).__name__ == "Abort":  # Ctrl-C inside click's prompts
            typer.echo("interrupted", err=True)
            sys.exit(130)
        if type(exc).__name__ == "NoArgsIsHelpError":  # click has printed the help already
            sys.exit(0)
        if not hasattr(exc, "format_message") or show_tracebacks():
            raise
        command = f"normkit {exc.ctx.info_name}" if getattr(exc, "ctx", None) and exc.ctx.parent else "normkit"
        typer.echo(f"error: {one_line(exc.format_message())} (see '{command} --help')", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)
