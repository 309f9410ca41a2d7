"""Small text helpers for command output: plurals and the console tables are printed on."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# The width of output written to a file or a pipe: wide enough that no table row is ever wrapped or
# cut, so `normkit list | grep NAME` and `less` see whole rows (rich itself assumes 80 columns there).
PIPE_WIDTH = 100_000


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 epoch', '3 epochs' (`many` for irregular plurals)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def console(pipe_width: int = PIPE_WIDTH) -> Console:
    """The console to print on: the terminal's width (or COLUMNS when set); `pipe_width` columns when
    stdout is a file or a pipe."""
    from rich.console import Console

    term = Console(soft_wrap=False)
    if term.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return term
    return Console(width=pipe_width, soft_wrap=False)
