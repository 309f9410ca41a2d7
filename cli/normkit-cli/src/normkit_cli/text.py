"""Small text helpers for command output."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 epoch', '3 epochs' (`many` for irregular plurals)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
