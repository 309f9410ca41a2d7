"""`normality_norm`: the whole normality-normalization layer as one pure function.

This is the contract the Triton kernel (`triton_kernels.normality_triton`) mirrors argument for
argument; the layer's fast path calls it.
"""

from __future__ import annotations

import torch
from normkit import NormShapeError, SpecError
from normkit.stages import Partition
from torch import Tensor

from normkit_normalnorm.fused import FusedConfig, NormalityFunction


def normality_norm(
    x3: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    *,
    partition: str,
    groups: int = 1,
    tokens: bool = False,
    training: bool,
    eps: float = 1e-5,
    alpha: float = 1.0,
    noise: float = 0.0,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    running_lambda: Tensor | None = None,
    momentum: float | None = 0.1,
    lambda_min: float | None = None,
    lambda_max: float | None = None,
    detach_lambda: bool = False,
    num_batches_tracked: Tensor | None = None,
) -> Tensor:
    """Standardize, estimate lambda, Yeo-Johnson transform, add noise, per-channel affine.

    x3: the layer's float32 `(N, C, S)` view (S = product of spatial/token dims; any strides).
    weight, bias: `(C,)` or None.
    partition: "batch" (per channel over N and S), "layer" (per sample over C and S; with
        `tokens=True` per (n, s) column over C), "instance" (per (n, c) over S) or "group"
        (per sample and block of C/groups channels over S).
    training: batch statistics, noise, running-buffer updates; in eval a batch partition with
        running buffers uses running_mean/var/lambda, every other case estimates per group.
    eps: added to the variance, and sqrt(eps) to the Newton denominator.
    alpha: Newton step size; noise: the noise factor xi, already resolved (0 disables).
    running_mean, running_var, running_lambda: `(C,)` buffers of a batch partition, updated in
        place when training (running_var with the unbiased n/(n-1) factor, like torch BN), or None.
    momentum: EMA factor of the running buffers; None means the cumulative average
        1/num_batches_tracked, where `num_batches_tracked` is the layer's counter already
        incremented for this step (as torch's BatchNorm modules do before calling F.batch_norm).
    lambda_min, lambda_max: optional clamp of lambda_hat (and of running_lambda in eval).
    detach_lambda: stop gradients through lambda_hat.
    Returns the `(N, C, S)` output in x3's layout.
    """
    if x3.dim() != 3:
        raise NormShapeError(f"normality_norm expects an (N, C, S) tensor, got shape {tuple(x3.shape)}")
    if partition not in ("batch", "layer", "instance", "group"):
        raise SpecError(f"normality_norm: partition must be batch, layer, instance or group, got {partition!r}")
    Partition(partition, groups).check(x3.shape[1], "normality_norm")
    tracked = partition == "batch" and running_mean is not None
    if tracked and (running_var is None or running_lambda is None):
        raise SpecError("normality_norm: pass running_mean, running_var and running_lambda together (or none)")
    if partition == "batch" and training and x3.shape[0] * x3.shape[2] < 2:
        raise NormShapeError("normality_norm: needs more than 1 value per channel when training")
    factor = ema_factor(momentum, num_batches_tracked) if tracked and training else 0.0
    cfg = FusedConfig(partition, groups, tokens, training, eps, alpha, noise, factor, lambda_min, lambda_max,
                      detach_lambda, torch.is_grad_enabled())
    return NormalityFunction.apply(x3, weight, bias, cfg, running_mean if tracked else None,
                                   running_var if tracked else None, running_lambda if tracked else None)


def ema_factor(momentum: float | None, num_batches_tracked: Tensor | None) -> float:
    """The running-buffer EMA factor: momentum, or 1/num_batches_tracked when momentum is None."""
    if momentum is not None:
        return momentum
    if num_batches_tracked is None or int(num_batches_tracked) < 1:
        raise SpecError("normality_norm: momentum=None (cumulative average) needs num_batches_tracked >= 1")
    return 1.0 / float(num_batches_tracked)


def update_running(mean: Tensor, var: Tensor, lam: Tensor, count: int, factor: float,
                   running_mean: Tensor, running_var: Tensor, running_lambda: Tensor) -> None:
    """EMA of batch mean, unbiased variance and lambda_hat into the `(C,)` running buffers, in place."""
    with torch.no_grad():
        unbiased = var * (count / max(count - 1, 1))
        running_mean.lerp_(mean.to(running_mean), factor)
        running_var.lerp_(unbiased.to(running_var), factor)
        running_lambda.lerp_(lam.to(running_lambda), factor)

