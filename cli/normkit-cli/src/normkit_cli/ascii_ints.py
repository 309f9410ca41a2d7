"""Integer options that accept ASCII digits only.

The CLI's option parsing reads integers the way Python's `int` does, which also takes other scripts'
digits (`int("٣") == 3`) and underscores (`1_000`); norm specs and config files refuse those, so every
integer option does too (pass `parser=ascii_int(...)` to `typer.Option`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


def ascii_int(min: int | None = None, max: int | None = None) -> Callable[[Any], int]:  # noqa: A002
    """A typer option parser: an integer written with the digits 0-9, within [min, max] when given."""

    def parse(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _INTEGER.fullmatch(value):
            number = int(value)
        else:
            raise ValueError(f"{value!r} is not an integer written with the digits 0-9")
        if (min is not None and number < min) or (max is not None and number > max):
            bounds = f"[{min if min is not None else '-inf'}, {max if max is not None else 'inf'}]"
            raise ValueError(f"{number} is not in the range {bounds}")
        return number

    return parse
