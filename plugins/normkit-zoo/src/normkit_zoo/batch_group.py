"""Batch group normalization: statistics per group of channels, pooled over the batch too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from normkit import SpecError
from normkit.stages import Groups, Standardize

if TYPE_CHECKING:
    from normkit.layer import NormLayer


class BatchGroupStandardize(Standardize):
    """Standardize each group of C/G channels over (N, C/G, S); running mean/var per group for eval.

    Sits on a batch partition (N, C, S) and regroups channels itself, so `running_mean` and
    `running_var` have G entries (one per group), updated like BN's (unbiased variance, EMA).
    """

    name = "batch-group-standardize"

    def __init__(self, groups: int = 32, eps: float = 1e-5, momentum: float | None = 0.1) -> None:
        super().__init__(eps, momentum, track_running_stats=True)
        if groups < 1:
            raise SpecError(f"bgn: groups must be >= 1, got {groups}")
        self.groups = groups

    def setup(self, layer: NormLayer) -> None:
        c = layer.num_channels
        if c % self.groups:
            divisors = [d for d in range(1, c + 1) if c % d == 0]
            near = sorted(divisors, key=lambda d: abs(d - self.groups))[:3]
            raise SpecError(f"{layer.spec}: {c} channels are not divisible into {self.groups} groups; "
                            f"use groups={' or groups='.join(map(str, sorted(near)))}")
        self._batch = True
        layer.register_buffer("running_mean", torch.zeros(self.groups))
        layer.register_buffer("running_var", torch.ones(self.groups))
        layer.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def describe(self) -> dict[str, Any]:
        return {"groups": self.groups, "eps": self.eps, "momentum": self.momentum}

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        n, c, s = x.shape
        g = x.reshape(n, self.groups, c // self.groups, s)
        if not layer.training:
            mean = layer.running_mean.to(x.dtype).view(1, -1, 1, 1)
            var = layer.running_var.to(x.dtype).view(1, -1, 1, 1)
        else:
            count = n * (c // self.groups) * s
            if count < 2:
                raise layer.shape_error("needs more than 1 value per group when training")
            var, mean = torch.var_mean(g, dim=(0, 2, 3), unbiased=False, keepdim=True)
            factor = self.update_factor(layer)
            with torch.no_grad():
                layer.running_mean.lerp_(mean.reshape(-1).to(layer.running_mean), factor)
                layer.running_var.lerp_((var.reshape(-1) * (count / (count - 1))).to(layer.running_var),
                                        factor)
        return ((g - mean) * torch.rsqrt(var + self.eps)).reshape(n, c, s)

    def fused_forward(self, x: Tensor, layer: NormLayer) -> Tensor | None:
        return None
