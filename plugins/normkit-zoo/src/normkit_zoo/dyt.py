"""Dynamic Tanh: `weight * tanh(alpha * x) + bias`, a statistics-free replacement for a norm."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from normkit import SpecError


class DynamicTanh(nn.Module):
    """DyT with a learned scalar `alpha` (init `alpha`) and a per-channel affine (weight, bias).

    Computes in float32 under autocast or for half inputs and returns the input's dtype. Works on
    `N, C, *` (channel_dim=1) or channels-last `N, *, C` (channel_dim=-1).
    """

    per_token = True  # elementwise, no statistics: each token's output depends on that token only (causal models)

    def __init__(self, num_channels: int, alpha: float = 0.5, channel_dim: int = 1) -> None:
        super().__init__()
        if not (math.isfinite(alpha) and alpha > 0):
            raise SpecError(f"dyt: alpha must be a positive finite number (default 0.5), got {alpha}")
        if channel_dim not in (1, -1):
            raise SpecError(f"dyt: channel_dim must be 1 or -1, got {channel_dim}")
        self.num_channels, self.channel_dim = num_channels, channel_dim
        self.alpha = nn.Parameter(torch.full((1,), float(alpha)))
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            shape = [1] * x.dim()
            shape[self.channel_dim] = self.num_channels
            xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            y = torch.tanh(self.alpha * xf) * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, channel_dim={self.channel_dim}"
