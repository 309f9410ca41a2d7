"""Q-Q normality of post-norm values (normality-normalization paper, Figure 5).

For each sampled channel, the values of one batch (over batch and spatial positions) are sorted
and paired with normal quantiles at the order-statistic medians (Filliben's estimate, as
`scipy.stats.probplot` does); R^2 is the squared correlation of the pairs: 1 for a perfectly
Gaussian sample, lower for skewed or heavy-tailed ones.
"""

from __future__ import annotations

import torch
from torch import Tensor


def normal_order_medians(n: int, *, device: torch.device | None = None) -> Tensor:
    """Normal quantiles at the uniform order-statistic medians of a sample of size `n`."""
    i = torch.arange(1, n + 1, dtype=torch.float64, device=device)
    m = (i - 0.3175) / (n + 0.365)
    m[-1] = 0.5 ** (1.0 / n)
    m[0] = 1 - m[-1]
    return torch.special.ndtri(m)


def qq_r2(samples: Tensor) -> Tensor:
    """R^2 of the normal Q-Q plot of each row of `samples` `(K, M)`; 0 for a constant row.

    Computed in float64 (the correlation of sorted values is sensitive to rounding).
    """
    if samples.dim() != 2 or samples.shape[1] < 3:
        raise ValueError(f"qq_r2 needs a (rows, >= 3 values) tensor, got shape {tuple(samples.shape)}")
    x = samples.detach().double().sort(dim=1).values
    q = normal_order_medians(x.shape[1], device=x.device)
    xc = x - x.mean(dim=1, keepdim=True)
    qc = q - q.mean()
    cov = (xc * qc).sum(dim=1)
    var_x = (xc * xc).sum(dim=1)
    r2 = cov * cov / (var_x * (qc * qc).sum()).clamp_min(torch.finfo(torch.float64).tiny)
    r2 = torch.where(var_x > 1e-24 * x.shape[1], r2, torch.zeros_like(r2))
    return r2.clamp(0, 1).float()


def channel_values(y3: Tensor, channels: Tensor) -> Tensor:
    """Rows of the chosen channels' values of a `(N, C, S)` batch: shape `(len(channels), N*S)`."""
    return y3[:, channels, :].transpose(0, 1).reshape(len(channels), -1)


def pick_channels(num_channels: int, count: int, seed: int) -> Tensor:
    """A seeded choice of `count` channels (all of them when there are fewer)."""
    if num_channels <= count:
        return torch.arange(num_channels)
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_channels, generator=generator)[:count].sort().values
