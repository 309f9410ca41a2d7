"""The proxy-normalization paper's random-net experiment (Definition 1, Figure 2), CPU-sized.

A deep stack of conv3x3 (circular padding, no bias) -> norm -> affine -> ReLU with random affine
parameters (gamma ~ N(1, 0.2^2), beta ~ N(0, 0.2^2)) and no training. The power decomposition of
each layer's post-norm values shows LN's dataset-scale share (channel-wise collapse) growing with
depth, while BN's and LN+PN's stay low.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import normkit
from normkit_lab.diagnostics.layers import attached, named_norm_layers
from normkit_lab.diagnostics.power import PowerAccumulator
from normkit_lab.stats import mean_sem, t_interval

DEFAULT_NORMS = ("bn", "ln", "ln+pn")
AFFINE_STD = 0.2


class RandomConvNet(nn.Module):
    """`depth` layers of conv3x3 (periodic boundary) -> norm (which owns affine and ReLU)."""

    def __init__(self, norm: str, depth: int, width: int, in_channels: int) -> None:
        super().__init__()
        blocks, cin = [], in_channels
        for _ in range(depth):
            conv = nn.Conv2d(cin, width, 3, padding=1, padding_mode="circular", bias=False)
            blocks.append(nn.Sequential(conv, normkit.build(norm, width, activation="relu")))
            cin = width
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(x)


def randomize(model: nn.Module, generator: torch.Generator) -> None:
    """Truncated-normal fan-in-scaled conv weights and the paper's random affine parameters."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                fan_in = module.weight[0].numel()
                w = torch.randn(module.weight.shape, generator=generator).clamp_(-2, 2)
                module.weight.copy_(w / math.sqrt(fan_in))
        for layer in named_norm_layers(model):
            if layer.weight is not None:
                layer.weight.copy_(1 + AFFINE_STD * torch.randn(layer.weight.shape, generator=generator))
            if layer.bias is not None:
                layer.bias.copy_(AFFINE_STD * torch.randn(layer.bias.shape, generator=generator))


def random_net_power(norm: str, *, depth: int = 20, width: int = 24, batch: int = 16, image_size: int = 16,
                     in_channels: int = 3, seed: int = 0) -> list[dict[str, float]]:
    """Power shares of each layer's post-norm values (depth order) in one random net, no training.

    The input is a batch of i.i.d. Gaussian images; statistics are batch statistics (training mode,
    as in the paper), computed without gradients.
    """
    generator = torch.Generator().manual_seed(seed)
    model = RandomConvNet(norm, depth, width, in_channels).train()
    randomize(model, generator)
    x = torch.randn((batch, in_channels, image_size, image_size), generator=generator)
    accs = {layer: PowerAccumulator() for layer in named_norm_layers(model)}
    with attached({layer: lambda lay, v: accs[lay].add(v) for layer in accs}), torch.no_grad():
        model(x)
    return [acc.shares() for acc in accs.values()]


def installed_norms(specs: tuple[str, ...] = DEFAULT_NORMS) -> list[str]:
    """The specs among `specs` whose plugins are installed (e.g. ln+pn needs normkit-proxynorm)."""
    found = []
    for spec in specs:
        try:
            normkit.parse(spec)
        except normkit.SpecError:
            continue
        found.append(spec)
    return found


def check_settings(norms: list[str], *, depth: int, width: int, batch: int, image_size: int, seeds: int,
                   in_channels: int = 3) -> None:
    """Refuse bad settings and every spec that cannot build a layer of this net (e.g. `gn` whose 32
    groups do not divide the width) before anything is computed: one SpecError, at once."""
    if depth < 1 or width < 1 or batch < 2 or image_size < 1 or seeds < 1:
        raise normkit.SpecError(f"random net: depth, width, image size and seeds must be >= 1 and batch >= 2, "
                                f"got depth={depth}, width={width}, batch={batch}, image_size={image_size}, "
                                f"seeds={seeds}")
    for norm in norms:
        normkit.parse(norm)
        RandomConvNet(norm, 1, width, in_channels)  # builds the norm at this width: the cheap check


def random_net_runs(norms: list[str], *, depth: int = 20, width: int = 24, batch: int = 16,
                    image_size: int = 16, seeds: int = 3) -> dict[str, list[list[dict[str, float]]]]:
    """Per norm, per random net (seeds 0..seeds-1), the power shares per depth; specs checked first."""
    check_settings(norms, depth=depth, width=width, batch=batch, image_size=image_size, seeds=seeds)
    return {norm: [random_net_power(norm, depth=depth, width=width, batch=batch, image_size=image_size, seed=s)
                   for s in range(seeds)] for norm in norms}


def mean_over_nets(runs: dict[str, list[list[dict[str, float]]]]) -> dict[str, list[dict[str, float]]]:
    """Per norm, the power shares per depth averaged over its nets."""
    return {norm: [{t: sum(net[d][t] for net in nets) / len(nets) for t in nets[0][d]}
                   for d in range(len(nets[0]))] for norm, nets in runs.items()}


def spread_over_nets(runs: dict[str, list[list[dict[str, float]]]], term: str = "dataset"
                     ) -> dict[str, list[dict[str, float | None]]]:
    """Per norm and depth, the mean, sd and 95% t interval of one power share over the nets (the
    nets are independent draws, so this says how much the mean could move with other draws). A share
    lies in [0, 1], so the interval is clipped to it."""
    out: dict[str, list[dict[str, float | None]]] = {}
    for norm, nets in runs.items():
        rows = []
        for d in range(len(nets[0])):
            values = [net[d][term] for net in nets]
            ms, ci = mean_sem(values), t_interval(values)
            rows.append({"depth": d + 1, "n": len(values), "mean": ms.mean,
                         "sd": None if ms.sem is None else ms.sem * math.sqrt(len(values)),
                         "ci95_low": max(0.0, ci[0]) if ci else None, "ci95_high": min(1.0, ci[1]) if ci else None})
        out[norm] = rows
    return out


def random_net_experiment(norms: list[str], *, depth: int = 20, width: int = 24, batch: int = 16,
                          image_size: int = 16, seeds: int = 3) -> dict[str, list[dict[str, float]]]:
    """Per norm, the power shares per depth averaged over `seeds` random nets (seeds 0..seeds-1)."""
    return mean_over_nets(random_net_runs(norms, depth=depth, width=width, batch=batch, image_size=image_size,
                                          seeds=seeds))
