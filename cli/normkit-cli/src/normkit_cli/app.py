"""The Typer app. Each command module adds its commands with `register(app)`."""

from __future__ import annotations

import sys

import typer

from normkit_cli import bench, catalog, compare, diagnose, report

app = typer.Typer(
    name="normkit",
    help="Build, compose and fairly compare normalization layers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for module in (catalog, bench, compare, report, diagnose):
    module.register(app)


def main() -> None:
    """Entry point: usage errors (bad option values, unknown options) also print one line, exit 2."""
    try:
        code = app(standalone_mode=False)
    except Exception as exc:  # noqa: BLE001 - click's usage errors, found by their interface
        if type(exc).__name__ == "Abort":  # Ctrl-C outside a command (commands handle their own)
            typer.echo("interrupted", err=True)
            sys.exit(130)
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(0)
        if not hasattr(exc, "format_message"):
            raise
        command = f"normkit {exc.ctx.info_name}" if getattr(exc, "ctx", None) and exc.ctx.parent else "normkit"
        typer.echo(f"error: {exc.format_message()} (see '{command} --help')", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)
