"""Fast paths: plain standardize/RMS pipelines run on torch's native kernels.

They compute exactly what the generic path computes (the tests check both against torch's own
layers); only the speed differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from normkit.layer import NormLayer
    from normkit.stages import RMSScale, Standardize


def native_standardize(step: Standardize, x: Tensor, layer: NormLayer) -> Tensor:
    weight, bias = layer.recovery_params()
    kind = layer.partition.kind
    if kind == "layer" and layer.tokens:
        return F.layer_norm(x, (layer.num_channels,), weight, bias, step.eps)
    xt = x.movedim(-1, 1) if layer.tokens else x
    if kind == "batch":
        if layer.training and xt.numel() // layer.num_channels < 2:
            raise layer.shape_error("needs more than 1 value per channel when training")
        if step.track_running_stats:
            factor = step.update_factor(layer) or 0.0
            out = F.batch_norm(xt, layer.running_mean, layer.running_var, weight, bias,
                               layer.training, factor, step.eps)
        else:
            out = F.batch_norm(xt, None, None, weight, bias, True, 0.0, step.eps)
    else:
        groups = {"layer": 1, "instance": layer.num_channels, "group": layer.partition.groups}[kind]
        out = F.group_norm(xt, groups, weight, bias, step.eps)
    return out.movedim(1, -1) if layer.tokens else out


def native_rms(step: RMSScale, x: Tensor, layer: NormLayer) -> Tensor:
    weight, bias = layer.recovery_params()
    out = F.rms_norm(x, (layer.num_channels,), weight, step.eps)
    return out if bias is None else out + bias
