"""The whitening steps: ZCA by eigen-decomposition (dbn) and by Newton iterations (iternorm).

Both sit on a batch partition (N, C, S) and regroup channels into groups of `group_size`: per
group, the centred values X (G x m, m = N*S) get `W (X - mu)` with `W ~ Sigma^(-1/2)`,
`Sigma = X X^T / m + eps I`. Training keeps `running_mean` (C,) and `running_whitening`
(C/G, G, G) as exponential moving averages (momentum as BN); eval uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from normkit import SpecError
from normkit.stages import Groups, Standardize
from normkit_whitening.inverse_sqrt import inverse_sqrt

if TYPE_CHECKING:
    from normkit.layer import NormLayer


class Whiten(Standardize):
    """Base of the whitening steps: grouping, running statistics, train/eval; `matrix` differs."""

    name = "whiten"

    def __init__(self, group_size: int = 16, eps: float = 1e-3, momentum: float | None = 0.1) -> None:
        super().__init__(eps, momentum, track_running_stats=True)
        if group_size < 1:
            raise SpecError(f"{self.name}: group_size must be >= 1 (default 16), got {group_size}")
        self.group_size = group_size

    def setup(self, layer: NormLayer) -> None:
        c = layer.num_channels
        size = min(self.group_size, c)
        if c % size:
            near = sorted(d for d in range(1, c + 1) if c % d == 0 and d <= 4 * size)[-3:]
            raise SpecError(f"{layer.spec}: {c} channels do not split into groups of {size}; "
                            f"use group_size={' or group_size='.join(map(str, near))}")
        self._size = size
        self._batch = True
        layer.register_buffer("running_mean", torch.zeros(c))
        layer.register_buffer("running_whitening", torch.eye(size).repeat(c // size, 1, 1))
        layer.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def describe(self) -> dict[str, Any]:
        return {"group_size": self.group_size, "eps": self.eps, "momentum": self.momentum}

    def matrix(self, sigma: Tensor) -> Tensor:
        """The whitening matrix `~ sigma^(-1/2)` for (groups, G, G) covariances (eps included)."""
        raise NotImplementedError

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        n, c, s = x.shape
        g = self._size
        xg = x.reshape(n, c // g, g, s).permute(1, 2, 0, 3).reshape(c // g, g, n * s)
        if layer.training:
            m = n * s
            if m < 2:
                raise layer.shape_error("needs more than 1 value per channel when training")
            mean = xg.mean(dim=2, keepdim=True)
            centred = xg - mean
            eye = torch.eye(g, dtype=x.dtype, device=x.device)
            sigma = centred @ centred.transpose(1, 2) / m + self.eps * eye
            w = self.matrix(sigma)
            factor = self.update_factor(layer)
            with torch.no_grad():
                layer.running_mean.lerp_(mean.reshape(c).to(layer.running_mean), factor)
                layer.running_whitening.lerp_(w.detach().to(layer.running_whitening), factor)
        else:
            centred = xg - layer.running_mean.to(x.dtype).view(c // g, g, 1)
            w = layer.running_whitening.to(x.dtype)
        y = w @ centred
        return y.reshape(c // g, g, n, s).permute(2, 0, 1, 3).reshape(n, c, s)

    def fused_forward(self, x: Tensor, layer: NormLayer) -> Tensor | None:
        return None


class ZCAWhiten(Whiten):
    """dbn: `W = D L^(-1/2) D^T` from a float64 eigen-decomposition, with a finite gradient."""

    name = "zca-whiten"

    def matrix(self, sigma: Tensor) -> Tensor:
        return inverse_sqrt(sigma, self.eps)


class IterWhiten(Whiten):
    """iternorm: `P_k = (3 P_{k-1} - P_{k-1}^3 Sigma_N) / 2`, `W = P_T / sqrt(tr Sigma)`."""

    name = "iter-whiten"

    def __init__(self, group_size: int = 16, iters: int = 5, eps: float = 1e-5,
                 momentum: float | None = 0.1) -> None:
        super().__init__(group_size, eps, momentum)
        if not 1 <= iters <= 100:
            raise SpecError(f"iternorm: iters must be between 1 and 100 (default 5), got {iters}")
        self.iters = iters

    def describe(self) -> dict[str, Any]:
        return {"iters": self.iters, **super().describe()}

    def matrix(self, sigma: Tensor) -> Tensor:
        trace = sigma.diagonal(dim1=1, dim2=2).sum(dim=1).view(-1, 1, 1)
        sigma_n = sigma / trace
        p = torch.eye(sigma.shape[-1], dtype=sigma.dtype, device=sigma.device).expand_as(sigma)
        for _ in range(self.iters):
            p = 1.5 * p - 0.5 * (p @ p @ p @ sigma_n)
        return p / trace.sqrt()
