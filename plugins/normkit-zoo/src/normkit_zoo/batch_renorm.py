"""Batch renormalization: BN whose training output is corrected towards the running statistics."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from normkit import SpecError
from normkit.stages import Groups, Standardize

if TYPE_CHECKING:
    from normkit.layer import NormLayer


class BatchRenormalize(Standardize):
    """`(x - mu_B) / sigma_B * r + d` in training, plain BN with running statistics in eval.

    r = clip(sigma_B / sigma, 1/r_max, r_max) and d = clip((mu_B - mu) / sigma, -d_max, d_max)
    are computed against the running statistics *before* this batch updates them and carry no
    gradient. With `warmup` > 0 the clip limits grow linearly from (1, 0) to (r_max, d_max) over
    that many training steps (plain BN at the start, as the paper's schedule).
    """

    name = "batch-renormalize"

    def __init__(self, r_max: float = 3.0, d_max: float = 5.0, warmup: int = 0, eps: float = 1e-5,
                 momentum: float | None = 0.1) -> None:
        super().__init__(eps, momentum, track_running_stats=True)
        if not (math.isfinite(r_max) and r_max >= 1):
            raise SpecError(f"brn: r_max must be a finite number >= 1 (default 3), got {r_max}")
        if not (math.isfinite(d_max) and d_max >= 0):
            raise SpecError(f"brn: d_max must be a finite number >= 0 (default 5), got {d_max}")
        if warmup < 0:
            raise SpecError(f"brn: warmup must be >= 0 steps (0 = no warm-up), got {warmup}")
        self.r_max, self.d_max, self.warmup = r_max, d_max, warmup

    def describe(self) -> dict[str, Any]:
        return {"r_max": self.r_max, "d_max": self.d_max, "warmup": self.warmup, **super().describe()}

    def eval_is_batch_norm(self) -> bool:
        """In eval batch renorm is plain BN with running statistics (so `normkit.fold` folds it)."""
        return True

    def _limits(self, layer: NormLayer, like: Tensor) -> tuple[Tensor | float, Tensor | float]:
        if self.warmup == 0:
            return self.r_max, self.d_max
        progress = (layer.num_batches_tracked.to(like.dtype) / self.warmup).clamp(max=1.0)
        return 1 + (self.r_max - 1) * progress, self.d_max * progress

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        if not layer.training:
            return super().forward(x, groups, layer)
        with torch.no_grad():
            r_max, d_max = self._limits(layer, x)
            sigma = groups.per_channel((layer.running_var.to(x.dtype) + self.eps).sqrt())
            mu = groups.per_channel(layer.running_mean.to(x.dtype, copy=True))
        mean, var = self.statistics(x, groups, layer)  # updates the running statistics afterwards
        std = (var + self.eps).sqrt()
        with torch.no_grad():
            r = (std / sigma).clamp(1 / r_max, r_max)
            d = ((mean - mu) / sigma).clamp(-d_max, d_max)
        return (x - mean) / std * r + d

    def fused_forward(self, x: Tensor, layer: NormLayer) -> Tensor | None:
        return None
