"""The plugin's environment switches (`NORMKIT_NN_COMPILE`, `NORMKIT_NN_ROWS`), read on every step.

Read at each call, not once at import, so a switch set while a program runs (a test, a notebook) takes
effect at the next step. An unset variable costs `os.environ.get` a KeyError raised and caught twice,
about 8,000 machine instructions; a small step reads two switches, and its whole host work is 550,000
(lnn) to 715,000 (bnn) instructions (docs/performance.md, "Host work per training call"). The mapping's
own dict answers "unset" in about a hundred.
"""

from __future__ import annotations

import functools
import os


def setting(name: str, default: str) -> str:
    """`os.environ.get(name, default)`, stripped and lower-cased."""
    data = getattr(os.environ, "_data", None)  # os._Environ's store; absent if os.environ was replaced
    if data is not None and _key(name) not in data:
        return default
    return os.environ.get(name, default).strip().lower()


@functools.cache
def _key(name: str) -> object:
    """`name` as os.environ stores it (bytes on POSIX, upper case on Windows)."""
    return os.environ.encodekey(name)
