"""Weight standardization (`+ws`): the conv feeding the norm standardizes its weight per filter.

`gn+ws` builds a GN layer carrying a `ws` step. The step does nothing to activations; it marks
the layer so that normkit.convert and normkit-lab's models (through
`normkit.prepare_feeding_convs`) turn the conv that feeds the norm into a `WSConv*d`: same
parameters and state_dict keys, but every forward uses `(W - mean(W)) / sqrt(var(W) + eps)`
per output channel (over in-channels and kernel positions), so gradients flow through the
standardization, as in the paper.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from normkit import SpecError
from normkit.stages import BuildContext, Groups, Step

if TYPE_CHECKING:
    from normkit.layer import NormLayer


def standardize_weight(weight: Tensor, eps: float) -> Tensor:
    """Per output channel: subtract the mean, divide by sqrt(biased variance + eps)."""
    dims = tuple(range(1, weight.dim()))
    var, mean = torch.var_mean(weight, dim=dims, unbiased=False, keepdim=True)
    return (weight - mean) * torch.rsqrt(var + eps)


class WSConv1d(nn.Conv1d):
    """Conv1d whose forward uses the standardized weight (`ws_eps` set by the ws step)."""

    ws_eps: float = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, standardize_weight(self.weight, self.ws_eps), self.bias)


class WSConv2d(nn.Conv2d):
    """Conv2d whose forward uses the standardized weight (`ws_eps` set by the ws step)."""

    ws_eps: float = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, standardize_weight(self.weight, self.ws_eps), self.bias)


class WSConv3d(nn.Conv3d):
    """Conv3d whose forward uses the standardized weight (`ws_eps` set by the ws step)."""

    ws_eps: float = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, standardize_weight(self.weight, self.ws_eps), self.bias)


_WS_CLASSES: dict[type, type] = {nn.Conv1d: WSConv1d, nn.Conv2d: WSConv2d, nn.Conv3d: WSConv3d}


class WeightStandardization(Step):
    """Marks the norm: the conv feeding it standardizes its weight (identity on activations)."""

    name = "ws"
    needs_conv = True

    def __init__(self, eps: float = 1e-5) -> None:
        if not (math.isfinite(eps) and eps > 0):
            raise SpecError(f"ws: eps must be a positive finite number (default 1e-5), got {eps}")
        self.eps = eps

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        return x

    def prepare_conv(self, conv: Any) -> None:
        if type(conv) in _WS_CLASSES.values():
            return  # already standardized (convert, then a model builder, may both ask)
        cls = _WS_CLASSES.get(type(conv))
        if cls is None:
            raise SpecError(f"ws: cannot standardize the weight of {type(conv).__name__}; "
                            "only plain nn.Conv1d/2d/3d are supported")
        conv.__class__ = cls  # same parameters, buffers and state_dict keys; only forward changes
        conv.ws_eps = self.eps

    def describe(self) -> dict[str, Any]:
        return {"eps": self.eps, "acts on": "the weight of the conv feeding this norm (convert, lab models)"}


def ws(ctx: BuildContext, eps: float = 1e-5) -> WeightStandardization:
    """Stage factory for `+ws`."""
    return WeightStandardization(eps)
