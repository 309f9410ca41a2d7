"""Running lambda of normality-norm layers (the Yeo-Johnson exponent the layer uses in eval).

lambda = 1 is the identity transform; lambda < 1 pulls in a right tail (undoes right skew),
lambda > 1 a left tail. Only batch-partition layers keep a running lambda; layer, group and
instance partitions estimate lambda per sample and have no trajectory to record.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from normkit_lab.diagnostics.layers import named_norm_layers


def running_lambdas(model: nn.Module) -> list[dict[str, Any]]:
    """Per layer with a `running_lambda` buffer (module order): name and channel mean/std/min/max."""
    rows = []
    for layer, name in named_norm_layers(model).items():
        lam = getattr(layer, "running_lambda", None)
        if lam is None:
            continue
        lam = lam.detach().float().cpu()
        rows.append({"layer": name, "mean": float(lam.mean()), "std": float(lam.std(unbiased=False)),
                     "min": float(lam.min()), "max": float(lam.max())})
    return rows
