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


def random_net_experiment(norms: list[str], *, depth: int = 20, width: int = 24, batch: int = 16,
                          image_size: int = 16, seeds: int = 3) -> dict[str, list[dict[str, float]]]:
    """Per norm, the power shares per depth averaged over `seeds` random nets (seeds 0..seeds-1)."""
    if depth < 1 or width < 1 or batch < 2 or image_size < 1 or seeds < 1:
        raise normkit.SpecError(f"random net: depth, width, image size and seeds must be >= 1 and batch >= 2, "
                                f"got depth={depth}, width={width}, batch={batch}, image_size={image_size}, "
                                f"seeds={seeds}")
    for norm in norms:
        normkit.parse(norm)
    result = {}
    for norm in norms:
        runs = [random_net_power(norm, depth=depth, width=width, batch=batch, image_size=image_size, seed=s)
                for s in range(seeds)]
        result[norm] = [{t: sum(run[d][t] for run in runs) / seeds for t in runs[0][d]} for d in range(depth)]
    return result
