"""The readable math of normality normalization, differentiable by autograd.

These functions are the oracle: the layer's reference path uses them, and the fused path
(`fused.py`) and the Triton kernel must compute the same values and gradients.

Each Yeo-Johnson branch gets a masked *argument* (`where(h >= 0, h, 0)`), never a masked
result, so the branch that is not selected cannot produce NaN gradients, and the derivative at
h = 0 is the exact one (1) rather than the zero subgradient of `abs`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

GroupMean = Callable[[Tensor], Tensor]  # keepdim mean over each normalization group


def split_signs(h: Tensor) -> tuple[Tensor, Tensor]:
    """(h where h >= 0 else 0, -h where h < 0 else 0): both non-negative, each with exact gradients."""
    zero = torch.zeros((), dtype=h.dtype, device=h.device)
    return torch.where(h >= 0, h, zero), torch.where(h < 0, -h, zero)


def yeo_johnson(h: Tensor, lam: Tensor | float) -> Tensor:
    """The exact Yeo-Johnson transform psi(h; lam) in the stable expm1/log1p form.

    h >= 0: expm1(lam * log1p(h)) / lam  (log1p(h) at lam = 0);
    h <  0: -expm1((2 - lam) * log1p(-h)) / (2 - lam)  (-log1p(-h) at lam = 2).
    `lam` broadcasts against `h` (one value per normalization group).
    """
    lam = torch.as_tensor(lam, dtype=h.dtype, device=h.device)
    hp, hn = split_signs(h)
    return _power(torch.log1p(hp), lam) - _power(torch.log1p(hn), 2 - lam)


def _power(log1p_a: Tensor, mu: Tensor) -> Tensor:
    """expm1(mu * log1p(a)) / mu, and log1p(a) where mu == 0 (both branches gradient-safe)."""
    zero = mu == 0
    mu_safe = torch.where(zero, torch.ones_like(mu), mu)
    return torch.where(zero, log1p_a, torch.expm1(mu_safe * log1p_a) / mu_safe)


def newton_lambda(h: Tensor, dims: tuple[int, ...], alpha: float = 1.0, eps: float = 1e-5,
                  mean: GroupMean | None = None) -> Tensor:
    """lambda_hat per group: one Newton step on the Gaussian NLL of psi(h; lambda) around lambda = 1.

    `h` is standardized over `dims` (mean 0, variance 1 per group; the formula uses that).
    Returns a keepdim tensor with one value per group. A constant group (h = 0) gives 1.
    `mean`: the group mean to use (the layer's `Groups.mean`, which spans processes when synced);
    default: the keepdim mean over `dims`.
    """
    hp, hn = split_signs(h)
    lp, ln = torch.log1p(hp), torch.log1p(hn)
    a = hp + hn  # |h|
    log1p_a = lp + ln  # log1p(|h|)
    signed_log = lp - ln  # sign(h) * log1p(|h|), the log-Jacobian of psi at lambda = 1
    sign = torch.where(h >= 0, 1.0, -1.0).to(h.dtype)
    d = (1 + a) * log1p_a - a  # dpsi/dlambda at 1
    d2 = sign * ((1 + a) * log1p_a**2 - 2 * d)  # d2psi/dlambda2 at 1

    mean = mean or _local_mean(dims)
    s1 = mean(signed_log)
    dvar = 2 * mean(h * d)
    d2var = 2 * mean(h * d2 + (d - mean(d)) ** 2)
    g1 = 0.5 * dvar - s1
    g2 = -0.5 * dvar**2 + 0.5 * d2var
    return 1 - alpha * g1 / (g2 + math.sqrt(eps))


def clamp_lambda(lam: Tensor, lambda_min: float | None, lambda_max: float | None) -> Tensor:
    """Clamp lambda_hat to the configured range (no-op when both bounds are None)."""
    if lambda_min is None and lambda_max is None:
        return lam
    return lam.clamp(min=lambda_min, max=lambda_max)


def noise_scale(x: Tensor, dims: tuple[int, ...], mean: GroupMean | None = None) -> Tensor:
    """s = mean |x - mean x| per group, without gradient (the paper's scale for the additive noise)."""
    mean = mean or _local_mean(dims)
    with torch.no_grad():
        return mean((x - mean(x)).abs())


def _local_mean(dims: tuple[int, ...]) -> GroupMean:
    return functools.partial(torch.mean, dim=dims, keepdim=True)


def standard_normal_like(x3: Tensor, tokens: bool, buffer: Tensor | None = None) -> Tensor:
    """N(0, 1) noise for the layer's `(N, C, S)` view, drawn in the logical order of the layer's input.

    That is (N, C, S) order for `N, C, *` inputs and (N, S, C) order for channels-last tokens, so a
    channels_last-strided image gets the same noise as its contiguous copy. Both the reference and
    the fused path draw through this function, so under one `torch.manual_seed` they agree.
    `buffer`: an optional contiguous tensor of that logical shape to fill (the same values as a
    fresh draw, without allocating).
    """
    n, c, s = x3.shape
    shape = (n, s, c) if tokens else (n, c, s)
    if buffer is None:
        z = torch.randn(shape, dtype=x3.dtype, device=x3.device)
    else:
        z = buffer.normal_()
    return z.transpose(1, 2) if tokens else z
