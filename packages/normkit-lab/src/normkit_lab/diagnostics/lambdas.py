"""Lambda of normality-norm layers (the Yeo-Johnson exponent the layer uses).

lambda = 1 is the identity transform; lambda < 1 pulls in a right tail (undoes right skew),
lambda > 1 a left tail. Batch-partition layers keep a running lambda per channel (what eval
uses). Layer, group and instance partitions (e.g. lnn on the tokens of a transformer) estimate
lambda per sample or token and keep none: for them the trajectory is the distribution of the
lambdas the layer computes on a fixed sample of inputs, in eval mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from normkit.layer import NormLayer
from normkit_lab.diagnostics.layers import measuring, named_norm_layers


def _summary(name: str, lam: Tensor, source: str) -> dict[str, Any]:
    lam = lam.detach().float().flatten().cpu()
    return {"layer": name, "source": source, "mean": float(lam.mean()), "std": float(lam.std(unbiased=False)),
            "min": float(lam.min()), "max": float(lam.max())}


def running_lambdas(model: nn.Module) -> list[dict[str, Any]]:
    """Per layer with a `running_lambda` buffer (module order): name and channel mean/std/min/max."""
    rows = []
    for layer, name in named_norm_layers(model).items():
        lam = getattr(layer, "running_lambda", None)
        if lam is not None:
            rows.append(_summary(name, lam, "running"))
    return rows


def estimated_lambdas(model: nn.Module, batches: list[Tensor]) -> list[dict[str, Any]]:
    """Per layer without a running lambda whose steps record one: mean/std/min/max of the lambdas it
    computes on `batches` (eval mode, no gradients; the model and random generators are unchanged)."""
    with measuring(model, "eval") as target:
        layers = {layer: name for layer, name in named_norm_layers(target).items()
                  if getattr(layer, "running_lambda", None) is None}
        seen: dict[NormLayer, list[Tensor]] = {layer: [] for layer in layers}
        hooks = [layer.register_forward_hook(_LambdaCollector(seen[layer])) for layer in layers]
        for layer in layers:
            layer.recording = True
        try:
            with torch.no_grad():
                for batch in batches:
                    target(batch)
        finally:
            for hook in hooks:
                hook.remove()
            for layer in layers:
                layer.recording = False
                layer.records.clear()
    return [_summary(name, torch.cat(seen[layer]), "estimated") for layer, name in layers.items() if seen[layer]]


class _LambdaCollector:
    """Forward hook that keeps the lambda a recording layer just computed."""

    def __init__(self, into: list[Tensor]) -> None:
        self.into = into

    def __call__(self, layer: nn.Module, args: Any, output: Any) -> None:
        lam = getattr(layer, "records", {}).get("lambda")
        if lam is not None:
            self.into.append(lam.flatten().cpu())
            del layer.records["lambda"]
