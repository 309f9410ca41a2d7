"""The compression functions behind ib-s, ib-l and ib-t, in one replaceable table.

Each maps values `c` (standardized, or raw with units=raw: step.py) to compressed values with slope 1
at 0 and tails squashed beyond |c| ~ lam. ib-s and ib-t are bounded (|f(c)| < lam, the abstract's
"bounded compression"); ib-l is not: sign(c) * lam * log1p(|c| / lam) grows without bound, only
logarithmically. These are normkit's reading of IBNorm (the authors' code and exact formulas are not
published). To try other forms, replace an entry of COMPRESSIONS before building layers:

    COMPRESSIONS["t"] = Compression(lambda c, lam: ..., default_lam=4.0, formula="...")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Compression:
    """One compression: `fn(c, lam)`, its default tail scale and the formula `normkit show` prints."""

    fn: Callable[[Tensor, float], Tensor]
    default_lam: float
    formula: str


class _SignedLog1p(torch.autograd.Function):
    """`sign(c) * lam * log1p(|c| / lam)` with the true slope 1 at c = 0 (autograd of sign/abs gives 0)."""

    @staticmethod
    def forward(c: Tensor, lam: float) -> Tensor:
        return torch.sign(c) * lam * torch.log1p(c.abs() / lam)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, float], output: Tensor) -> None:
        c, lam = inputs
        ctx.save_for_backward(c)
        ctx.lam = lam

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (c,) = ctx.saved_tensors
        return grad / (1 + c.abs() / ctx.lam), None


def tanh_compression(c: Tensor, lam: float) -> Tensor:
    return lam * torch.tanh(c / lam)


def log_compression(c: Tensor, lam: float) -> Tensor:
    return _SignedLog1p.apply(c, lam)


def softsign_compression(c: Tensor, lam: float) -> Tensor:
    return c / (1 + c.abs() / lam)


COMPRESSIONS: dict[str, Compression] = {
    "s": Compression(softsign_compression, 3.0, "c / (1 + |c| / lam)"),
    "l": Compression(log_compression, 4.0, "sign(c) * lam * log1p(|c| / lam)"),
    "t": Compression(tanh_compression, 4.0, "lam * tanh(c / lam)"),
}
