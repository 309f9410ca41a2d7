"""Point-wise replacements for a norm: Dynamic Tanh `weight * tanh(alpha * x) + bias` and Dynamic erf
`weight * erf(alpha * x + shift) + bias`. No statistics: each value's output depends on that value alone."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from normkit import SpecError


class _DynamicPointwise(nn.Module):
    """`weight * f(alpha * x [+ shift]) + bias` with a learned scalar alpha (and shift) and a per-channel affine.

    Computes in float32 under autocast or for half inputs and returns the input's dtype. Works on
    `N, C, *` (channel_dim=1) or channels-last `N, *, C` (channel_dim=-1).
    """

    per_token = True  # elementwise, no statistics: each token's output depends on that token only (causal models)
    spec_name = ""
    function: Callable[[Tensor], Tensor]

    def __init__(self, num_channels: int, alpha: float, channel_dim: int, shift: float | None) -> None:
        super().__init__()
        if not (math.isfinite(alpha) and alpha > 0):
            raise SpecError(f"{self.spec_name}: alpha must be a positive finite number, got {alpha}")
        if shift is not None and not math.isfinite(shift):
            raise SpecError(f"{self.spec_name}: shift must be a finite number, got {shift}")
        if channel_dim not in (1, -1):
            raise SpecError(f"{self.spec_name}: channel_dim must be 1 or -1, got {channel_dim}")
        self.num_channels, self.channel_dim = num_channels, channel_dim
        self.alpha = nn.Parameter(torch.full((1,), float(alpha)))
        if shift is not None:
            self.shift = nn.Parameter(torch.full((1,), float(shift)))
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            shape = [1] * x.dim()
            shape[self.channel_dim] = self.num_channels
            xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            z = self.alpha * xf
            if hasattr(self, "shift"):
                z = z + self.shift
            y = type(self).function(z) * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, channel_dim={self.channel_dim}"


class DynamicTanh(_DynamicPointwise):
    """DyT (Zhu et al. 2025): `weight * tanh(alpha * x) + bias`, alpha a learned scalar (init 0.5)."""

    spec_name = "dyt"
    function = torch.tanh

    def __init__(self, num_channels: int, alpha: float = 0.5, channel_dim: int = 1) -> None:
        super().__init__(num_channels, alpha, channel_dim, shift=None)


class DynamicErf(_DynamicPointwise):
    """Derf (Chen et al. 2025): `weight * erf(alpha * x + shift) + bias`, alpha and shift learned scalars
    (init 0.5 and 0, as the reference code)."""

    spec_name = "derf"
    function = torch.erf

    def __init__(self, num_channels: int, alpha: float = 0.5, shift: float = 0.0, channel_dim: int = 1) -> None:
        super().__init__(num_channels, alpha, channel_dim, shift=shift)
