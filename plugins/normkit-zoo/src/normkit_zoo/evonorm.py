"""EvoNorm-S0 and EvoNorm-B0: normalization layers that include their nonlinearity."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from normkit.stages import Groups, Standardize, Step
from normkit_zoo.stats import biased_var_mean

if TYPE_CHECKING:
    from normkit.layer import NormLayer


class EvoS0(Step):
    """`x * sigmoid(v * x) / sqrt(group_var(x) + eps)` on a group partition; `v` per channel, init 1."""

    name = "evonorm-s0"

    def __init__(self, eps: float = 1e-5) -> None:
        Standardize(eps)  # validates eps
        self.eps = eps

    def setup(self, layer: NormLayer) -> None:
        layer.register_parameter("v", nn.Parameter(torch.ones(layer.num_channels)))

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        var = biased_var_mean(x, groups.dims)[0]
        v = groups.per_channel(layer.v.to(x.dtype))
        return x * torch.sigmoid(v * x) * torch.rsqrt(var + self.eps)


class EvoB0(Standardize):
    """`x / max(sqrt(batch_var + eps), v * x + sqrt(instance_var + eps))` on a batch partition.

    The batch variance per channel keeps `running_var` (unbiased, EMA as BN) for eval; the
    instance variance is per sample and channel. `v` per channel, init 1. x is not centred.
    """

    name = "evonorm-b0"

    def __init__(self, eps: float = 1e-3, momentum: float | None = 0.1) -> None:
        super().__init__(eps, momentum, track_running_stats=True)

    def setup(self, layer: NormLayer) -> None:
        self._batch = True
        c = layer.num_channels
        layer.register_parameter("v", nn.Parameter(torch.ones(c)))
        layer.register_buffer("running_var", torch.ones(c))
        layer.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def describe(self) -> dict[str, Any]:
        return {"eps": self.eps, "momentum": self.momentum}

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        n, c, s = x.shape
        if layer.training:
            if n * s < 2:
                raise layer.shape_error("needs more than 1 value per channel when training")
            var = biased_var_mean(x, (0, 2))[0]
            factor = self.update_factor(layer)
            with torch.no_grad():
                unbiased = var.reshape(c) * (n * s / (n * s - 1))
                layer.running_var.lerp_(unbiased.to(layer.running_var), factor)
        else:
            var = layer.running_var.to(x.dtype).view(1, c, 1)
        instance_std = (biased_var_mean(x, 2)[0] + self.eps).sqrt()
        v = layer.v.to(x.dtype).view(1, c, 1)
        return x / torch.maximum((var + self.eps).sqrt(), v * x + instance_std)

    def fused_forward(self, x: Tensor, layer: NormLayer) -> Tensor | None:
        return None
