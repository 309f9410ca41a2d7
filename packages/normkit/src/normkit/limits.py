"""Limits on values a spec or a build call takes, checked before anything is allocated.

A value past a limit cannot be meaningful (no layer has 10^10 channels), and letting it through
turns a typo into a memory error or an endless loop. docs/index.md lists these limits.
"""

from __future__ import annotations

import math
from typing import Any

from normkit.errors import SpecError

MAX_CHANNELS = 2**24  # 16,777,216: far above any real layer; one fp32 vector of it is 64 MiB


def check_num_channels(num_channels: Any, owner: str) -> int:
    """`num_channels` as a positive int no larger than MAX_CHANNELS, else a one-line SpecError."""
    if not isinstance(num_channels, int) or isinstance(num_channels, bool) or num_channels < 1:
        raise SpecError(f"{owner}: num_channels must be a positive int, got {num_channels!r}")
    if num_channels > MAX_CHANNELS:
        raise SpecError(f"{owner}: num_channels={num_channels} is above normkit's limit of "
                        f"{MAX_CHANNELS:,} channels; check the channel count")
    return num_channels


def check_positive(value: float, owner: str, name: str, hint: str = "") -> None:
    """A finite number > 0 (eps, step sizes, ...), else a one-line SpecError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise SpecError(f"{owner}: {name} must be > 0 and finite{hint}, got {value!r}")


def check_range(value: float, owner: str, name: str, low: float, high: float) -> None:
    """A finite number in [low, high], else a one-line SpecError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and low <= value <= high):
        raise SpecError(f"{owner}: {name} must be in [{low:g}, {high:g}], got {value!r}")
