"""The thresholded linear unit (TLU) that completes filter response normalization."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from normkit.stages import BuildContext


class TLU(nn.Module):
    """`max(y, tau)` with a learned per-channel threshold `tau` (init 0), on (N, C, S) values."""

    def __init__(self, num_channels: int) -> None:
        super().__init__()
        self.tau = nn.Parameter(torch.zeros(num_channels))

    def forward(self, y: Tensor) -> Tensor:
        return torch.maximum(y, self.tau.to(y.dtype).view(1, -1, 1))


def tlu(ctx: BuildContext) -> TLU:
    """Activation stage factory: a TLU with one threshold per channel."""
    return TLU(ctx.num_channels)
