"""LayerNorm2d: layer norm over the channels at each position of a channels-first map."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from normkit import SpecError


class LayerNorm2d(nn.Module):
    """timm's / ConvNeXt's `LayerNorm2d`: move channels last, `F.layer_norm` over C, move back.

    Same definition as timm (biased variance, eps inside the sqrt, default eps 1e-6), for any
    rank `N, C, *`; with channel_dim=-1 it is plain layer norm over the last dim. Statistics are
    float32 under autocast and for half inputs; the output has the input's dtype.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6, affine: bool = True, channel_dim: int = 1) -> None:
        super().__init__()
        if not eps > 0:
            raise SpecError(f"ln2d: eps must be > 0 (default 1e-6), got {eps}")
        if channel_dim not in (1, -1):
            raise SpecError(f"ln2d: channel_dim must be 1 or -1, got {channel_dim}")
        self.num_channels, self.eps, self.channel_dim = num_channels, eps, channel_dim
        self.weight = nn.Parameter(torch.ones(num_channels)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_channels)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            if self.channel_dim == 1:
                xf = xf.movedim(1, -1)
            weight, bias = (None if t is None else t.to(xf.dtype) for t in (self.weight, self.bias))  # half module
            y = F.layer_norm(xf, (self.num_channels,), weight, bias, self.eps)
            if self.channel_dim == 1:
                y = y.movedim(-1, 1)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, channel_dim={self.channel_dim}"
