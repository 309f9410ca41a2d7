"""The Typer app. Each command module adds its commands with `register(app)`."""

from __future__ import annotations

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
    app()
