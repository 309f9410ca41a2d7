"""Triton-free description of a call: how the `(N, C, S)` tensor splits into groups, and the options.

Kept apart from the kernels so the fake (meta) implementation of the custom op and the argument
checks work without importing Triton.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

# Partition codes, the kernels' constexpr PART: which (n, c, s) element (group, row r, column t) is.
BATCH = 0  # group = channel c; rows = samples n; columns = s
LAYER = 1  # group = sample n; rows = channels c; columns = s
GROUP = 2  # group = (n, g); rows = the CG channels of g; columns = s (instance: CG = 1)
TOKENS = 3  # group = (n, s); rows = channels c; one column

# Columns of the per-group statistics table (float32, shape (groups, NSTAT)) the forward saves.
MEAN, RSTD, LAM, SCALE, MEAN_D, COEF_D, COEF_E, COEF_S, VAR = range(9)
NSTAT = 9


@dataclass(frozen=True)
class Geometry:
    """How the `(N, C, S)` tensor splits into normalization groups of `rows x cols` elements.

    `classes` groups in a row share one element -> channel map (gid % classes picks the map),
    so the row backward can accumulate weight/bias gradients per element across them.
    """

    part: int
    n: int
    c: int
    s: int
    n_groups: int
    rows: int
    cols: int
    classes: int
    groups: int = 1
    group_channels: int = 1

    @property
    def size(self) -> int:
        return self.rows * self.cols


def geometry(shape: torch.Size, partition: str, groups: int, tokens: bool) -> Geometry:
    """The groups of a partition ("batch", "layer", "instance", "group") of an `(N, C, S)` shape."""
    n, c, s = shape
    if partition == "batch":
        return Geometry(BATCH, n, c, s, c, n, s, c)
    if partition == "layer" and tokens:
        return Geometry(TOKENS, n, c, s, n * s, c, 1, 1)
    if partition == "layer":
        return Geometry(LAYER, n, c, s, n, c, s, 1)
    g = c if partition == "instance" else groups
    return Geometry(GROUP, n, c, s, n * g, c // g, s, g, g, c // g)


@dataclass(frozen=True)
class Options:
    """The scalar settings of one call, as the kernels take them."""

    training: bool
    eps: float
    alpha: float
    noise: float
    lambda_min: float | None
    lambda_max: float | None
    detach_lambda: bool

    @property
    def clamp_args(self) -> dict[str, object]:
        return {"lmin": 0.0 if self.lambda_min is None else self.lambda_min,
                "lmax": 0.0 if self.lambda_max is None else self.lambda_max}

    @property
    def clamp_flags(self) -> dict[str, bool]:
        return {"CLAMP_MIN": self.lambda_min is not None, "CLAMP_MAX": self.lambda_max is not None}


Built = TypeVar("Built")


def cached(builder: Callable[..., Built], *key: object) -> Built:
    """`builder(*key)` from its `functools.lru_cache`, or built afresh where a cache cannot serve: while
    Dynamo traces (it would warn about the wrapper and ignore it) and when the key holds symbolic sizes
    (dynamic-shape tracing: a SymInt does not hash)."""
    if torch.compiler.is_compiling():
        return builder.__wrapped__(*key)
    try:
        return builder(*key)
    except TypeError:
        try:
            hash(key)
        except TypeError:
            return builder.__wrapped__(*key)
        raise
