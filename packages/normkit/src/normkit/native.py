"""Fast paths: plain standardize/RMS pipelines run on torch's native kernels.

They compute exactly what the generic path computes (the tests check both against torch's own
layers); only the speed differs. Plain functions of tensors and settings: this module imports
nothing from normkit, so the stage model (`stages.py`) can use it without an import circle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def native_standardize(x: Tensor, *, kind: str, tokens: bool, num_channels: int, groups_per_sample: int,
                       weight: Tensor | None, bias: Tensor | None, eps: float,
                       running_mean: Tensor | None, running_var: Tensor | None,
                       use_batch_stats: bool, factor: float) -> Tensor:
    """Standardize over `kind` ("batch", "layer", "instance", "group") and apply the affine.

    For "batch": `use_batch_stats` normalizes with the batch's statistics (training, or no running
    statistics) and updates running_mean/var with `factor` when they are given. `groups_per_sample`: the
    statistics groups of one sample for the other kinds (`Partition.groups_per_sample`: 1, C or `groups`);
    unused for "batch".
    """
    # A half-precision module (`layer.to(torch.bfloat16)`) gets float32 x from the layer: its
    # parameters and running statistics are used in float32 too, the running statistics written back.
    weight, bias = _as(x, weight), _as(x, bias)
    if kind == "layer" and tokens:
        return F.layer_norm(x, (num_channels,), weight, bias, eps)
    xt = x.movedim(-1, 1) if tokens else x
    if kind == "batch":
        mean, var = _as(x, running_mean), _as(x, running_var)
        out = F.batch_norm(xt, mean, var, weight, bias, use_batch_stats, factor, eps)
        if mean is not running_mean and running_mean is not None and running_var is not None and var is not None:
            with torch.no_grad():
                running_mean.copy_(mean)
                running_var.copy_(var)
    else:
        out = F.group_norm(xt, groups_per_sample, weight, bias, eps)
    return out.movedim(1, -1) if tokens else out


def _as(x: Tensor, t: Tensor | None) -> Tensor | None:
    """`t` in x's dtype (the same tensor when it already is, without a dispatch: this is every call's path)."""
    return t if t is None or t.dtype == x.dtype else t.to(x.dtype)


def native_rms(x: Tensor, *, num_channels: int, weight: Tensor | None, bias: Tensor | None,
               eps: float) -> Tensor:
    """RMS norm over the last (channel) dim, then the gain and an optional bias."""
    out = F.rms_norm(x, (num_channels,), weight, eps)
    return out if bias is None else out + bias
