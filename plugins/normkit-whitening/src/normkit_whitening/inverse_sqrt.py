"""`Sigma^(-1/2)` of symmetric positive definite matrices: float64 eigh with a stable gradient.

The gradient of `f(Sigma) = D f(L) D^T` (Daleckii-Krein) needs the divided differences
`(f(l_i) - f(l_j)) / (l_i - l_j)`, which torch's eigh backward forms as `1 / (l_i - l_j)` and
which blow up for repeated eigenvalues (rank-deficient batches, constant channels). For
f = l^(-1/2) the divided difference has the closed form `-1 / (s_i s_j (s_i + s_j))`, s = sqrt(l),
which is finite for equal eigenvalues too, so no guard or tolerance is needed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class InverseSqrt(torch.autograd.Function):
    """Batched `Sigma^(-1/2)` for (..., G, G) SPD matrices, computed in float64."""

    @staticmethod
    def forward(ctx: Any, sigma: Tensor, floor: float) -> Tensor:
        values, vectors = torch.linalg.eigh(sigma.detach().double())
        s = values.clamp(min=floor).sqrt()
        ctx.save_for_backward(s, vectors)
        ctx.dtype = sigma.dtype
        return ((vectors / s.unsqueeze(-2)) @ vectors.transpose(-1, -2)).to(sigma.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        s, vectors = ctx.saved_tensors
        g = grad.double()
        g = (g + g.transpose(-1, -2)) / 2
        inner = vectors.transpose(-1, -2) @ g @ vectors
        k = -1.0 / (s.unsqueeze(-1) * s.unsqueeze(-2) * (s.unsqueeze(-1) + s.unsqueeze(-2)))
        return (vectors @ (k * inner) @ vectors.transpose(-1, -2)).to(ctx.dtype), None


def inverse_sqrt(sigma: Tensor, floor: float) -> Tensor:
    """`Sigma^(-1/2)`; eigenvalues below `floor` are raised to it (eps is already on the diagonal)."""
    return InverseSqrt.apply(sigma, floor)
