"""The `normkit` command line (Typer + rich); a thin layer over normkit and normkit-lab."""
