"""One measurement pass over sample batches: Q-Q normality and power shares per norm layer."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from normkit.layer import NormLayer
from normkit_lab.diagnostics.layers import Mode, attached, execution_order, forward_all, measuring
from normkit_lab.diagnostics.normality import channel_values, pick_channels, qq_r2
from normkit_lab.diagnostics.power import PowerAccumulator

QQ_CHANNELS = 20  # the normality paper's Figure 5 averages 20 channels and 10 validation batches
QQ_BATCHES = 10


def measure_layers(model: nn.Module, batches: list[Tensor], *, mode: Mode = "eval",
                   channels: int = QQ_CHANNELS, seed: int = 0) -> list[dict[str, Any]]:
    """Per norm layer in depth order: name, mean/std Q-Q R^2 and the four power shares.

    R^2 is averaged over `channels` channels per layer (a seeded choice) and over the batches;
    the power shares span all samples of all batches. `mode` is described in `layers.measuring`.
    """
    if not batches:
        raise ValueError("measure_layers needs at least one batch")
    with measuring(model, mode) as target:
        order = execution_order(target, batches[0])
        picks = {layer: pick_channels(layer.num_channels, channels, seed + depth)
                 for depth, (_, layer) in enumerate(order)}
        r2: dict[NormLayer, list[Tensor]] = {layer: [] for _, layer in order}
        power = {layer: PowerAccumulator() for _, layer in order}

        def observe(layer: NormLayer, y3: Tensor) -> None:
            power[layer].add(y3)
            if y3.shape[0] * y3.shape[2] >= 3:
                r2[layer].append(qq_r2(channel_values(y3, picks[layer].to(y3.device))).cpu())

        with attached({layer: observe for _, layer in order}):
            forward_all(target, batches)
    rows = []
    for depth, (name, layer) in enumerate(order, start=1):
        values = torch.cat(r2[layer]) if r2[layer] else torch.zeros(0)
        rows.append({
            "depth": depth, "layer": name, "spec": layer.spec,
            "qq_r2": float(values.mean()) if values.numel() else None,
            "qq_r2_std": float(values.std(unbiased=False)) if values.numel() else None,
            "power": power[layer].shares(),
        })
    return rows
