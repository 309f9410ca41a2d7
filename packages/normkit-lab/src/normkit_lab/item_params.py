"""Typed parameters of a model or dataset (`--model-param`, `--dataset-param`), checked one way.

Each value is coerced by the item's declared `normkit.params.Param` (from the factory's
signature), then refused when it is a non-finite float or an integer too large for any tensor
size, so nothing downstream sees nan, inf or a size that overflows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from normkit.errors import SpecError, did_you_mean
from normkit_lab.errors import one_line, short_repr

MAX_INT = 2**31 - 1  # larger integers overflow the int32 sizes of many kernels


def _bad_number(value: Any) -> str | None:
    """Why `value` (or a number inside a list/dict) cannot be a parameter, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "is not finite"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return f"is beyond {MAX_INT:,}"
    if isinstance(value, (list, tuple)):
        return next((why for why in map(_bad_number, value) if why), None)
    if isinstance(value, dict):
        return next((why for why in map(_bad_number, value.values()) if why), None)
    return None


def typed_params(owner: str, declared: Iterable[Any], params: dict[str, Any]) -> dict[str, Any]:
    """`params` coerced by the declared Params of `owner` (e.g. "model 'wrn'"); one-line SpecErrors."""
    by_name = {p.name: p for p in declared}
    typed = {}
    for key, value in params.items():
        if key not in by_name:
            raise SpecError(f"{owner} has no parameter {short_repr(key)}{did_you_mean(str(key), by_name)}; "
                            f"valid: {', '.join(by_name) or 'none'}")
        why = _bad_number(value)
        if why is None:
            try:
                value = by_name[key].coerce(value, owner)
            except SpecError as exc:
                raise SpecError(one_line(str(exc))) from None
            why = _bad_number(value)
        if why is not None:
            raise SpecError(f"{owner}: parameter {key!r} {why} (got {short_repr(value)}); give a finite "
                            f"value in range")
        typed[key] = value
    return typed
