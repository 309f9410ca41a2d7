"""Finding a model's norm layers in execution order and running it in a measurement mode.

Everything here is read-only for the model: probes are removed and training flags restored on
exit, the "batch" mode works on a deep copy, and the random number generators are forked.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from torch import Tensor, nn

from normkit.layer import NormLayer, Probe

Mode = Literal["eval", "batch"]


def named_norm_layers(model: nn.Module) -> dict[NormLayer, str]:
    """Every normkit norm layer of `model` with its module name, in module order."""
    return {m: name or type(m).__name__ for name, m in model.named_modules() if isinstance(m, NormLayer)}


def execution_order(model: nn.Module, batch: Tensor) -> list[tuple[str, NormLayer]]:
    """(name, layer) of the norm layers in the order one forward pass calls them (depth order)."""
    names = named_norm_layers(model)
    order: list[NormLayer] = []

    def note(layer: NormLayer, values: Tensor) -> None:
        if layer not in order:
            order.append(layer)

    with attached({layer: note for layer in names}), torch.no_grad():
        model(batch)
    return [(names[layer], layer) for layer in order]


@contextmanager
def attached(probes: dict[NormLayer, Probe]) -> Iterator[None]:
    """Attach one probe per layer for the duration of the block."""
    removers = [layer.add_probe(probe) for layer, probe in probes.items()]
    try:
        yield
    finally:
        for remove in removers:
            remove()


def _silence_noise(model: nn.Module) -> None:
    """Turn off training-time noise of steps that declare a `noise` factor (e.g. normality's nn)."""
    for layer in named_norm_layers(model):
        for step in layer.steps:
            if isinstance(getattr(step, "noise", None), float):
                step.noise = 0.0


@contextmanager
def measuring(model: nn.Module, mode: Mode) -> Iterator[nn.Module]:
    """Yield the model to measure, without changing `model`'s state or the random generators.

    eval: `model` itself in eval mode (running statistics), training flags restored afterwards.
    batch: a deep copy in training mode, so statistics come from the batch (what the layer does
    at initialization, when running statistics hold nothing yet), with its training noise off.
    """
    if mode not in ("eval", "batch"):
        raise ValueError(f"mode must be 'eval' or 'batch', got {mode!r}")
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        if mode == "batch":
            twin = copy.deepcopy(model).train()
            _silence_noise(twin)
            yield twin
            return
        flags = {m: m.training for m in model.modules()}
        model.eval()
        try:
            yield model
        finally:
            for m, flag in flags.items():
                m.training = flag


def forward_all(model: nn.Module, batches: list[Tensor]) -> None:
    """Run every batch through `model` without gradients."""
    with torch.no_grad():
        for batch in batches:
            model(batch)
