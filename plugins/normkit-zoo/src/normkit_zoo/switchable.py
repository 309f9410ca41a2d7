"""Switchable normalization: a learned softmax mixture of IN, LN and BN means and variances."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from normkit.stages import Groups, Standardize
from normkit_zoo.stats import biased_var_mean

if TYPE_CHECKING:
    from normkit.layer import NormLayer


class SwitchableStandardize(Standardize):
    """`(x - sum_k w_k mu_k) / sqrt(sum_k w'_k var_k + eps)` for k in (IN, LN, BN).

    Sits on an instance partition (N, C, S). w = softmax(mean_weight), w' = softmax(var_weight),
    both learned and initialised equal. The BN part keeps `running_mean` / `running_var` (EMA as
    BN, unbiased variance) and uses them in eval; the IN and LN parts stay per sample.
    """

    name = "switchable-standardize"

    def __init__(self, eps: float = 1e-5, momentum: float | None = 0.1) -> None:
        super().__init__(eps, momentum, track_running_stats=True)

    def setup(self, layer: NormLayer) -> None:
        self._batch = True
        c = layer.num_channels
        layer.register_parameter("mean_weight", nn.Parameter(torch.ones(3)))
        layer.register_parameter("var_weight", nn.Parameter(torch.ones(3)))
        layer.register_buffer("running_mean", torch.zeros(c))
        layer.register_buffer("running_var", torch.ones(c))
        layer.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def describe(self) -> dict[str, Any]:
        return {"mixture": "softmax(mean_weight), softmax(var_weight) over IN, LN, BN",
                "eps": self.eps, "momentum": self.momentum}

    def decay(self) -> dict[str, bool]:
        return {"mean_weight": False, "var_weight": False}

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        n, c, s = x.shape
        var_in, mean_in = biased_var_mean(x, 2)  # (N, C, 1)
        square_in = var_in + mean_in * mean_in
        mean_ln = mean_in.mean(dim=1, keepdim=True)
        var_ln = square_in.mean(dim=1, keepdim=True) - mean_ln * mean_ln
        if layer.training:
            mean_bn = mean_in.mean(dim=0, keepdim=True)
            var_bn = square_in.mean(dim=0, keepdim=True) - mean_bn * mean_bn
            count = n * s
            layer.num_batches_tracked.add_(1)  # on an instance partition, so not update_factor's batch rule
            factor = self.momentum if self.momentum is not None else 1.0 / float(layer.num_batches_tracked)
            with torch.no_grad():
                layer.running_mean.lerp_(mean_bn.reshape(c).to(layer.running_mean), factor)
                unbiased = var_bn.reshape(c) * (count / max(count - 1, 1))
                layer.running_var.lerp_(unbiased.to(layer.running_var), factor)
        else:
            mean_bn = layer.running_mean.to(x.dtype).view(1, c, 1)
            var_bn = layer.running_var.to(x.dtype).view(1, c, 1)
        wm = torch.softmax(layer.mean_weight.to(x.dtype), 0)
        wv = torch.softmax(layer.var_weight.to(x.dtype), 0)
        mean = wm[0] * mean_in + wm[1] * mean_ln + wm[2] * mean_bn
        var = wv[0] * var_in + wv[1] * var_ln + wv[2] * var_bn
        return (x - mean) * torch.rsqrt(var.clamp(min=0) + self.eps)

    def fused_forward(self, x: Tensor, layer: NormLayer) -> Tensor | None:
        return None
