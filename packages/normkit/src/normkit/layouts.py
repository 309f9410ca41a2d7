"""Fitting a built NormLayer to what the layer it replaces computed: its layout and activation."""

from __future__ import annotations

from torch import Tensor, nn

from normkit.layer import NormLayer


def _channels_last_in(module: nn.Module, args: tuple) -> tuple:
    return (args[0].movedim(1, -1),)


def _channels_first_out(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
    return out.movedim(-1, 1).contiguous()


def per_position(layer: NormLayer) -> NormLayer:
    """A token layer (`channel_dim=-1`) applied to N,C,* inputs: statistics over C at each position.

    That is what LayerNorm2d computes; hooks (not a wrapper module) keep the state-dict keys.
    """
    layer.register_forward_pre_hook(_channels_last_in)
    layer.register_forward_hook(_channels_first_out)
    layer.per_position = True
    return layer


def keep_activation(layer: NormLayer, activation: nn.Module) -> NormLayer:
    """Apply `activation` (a norm-act source's drop + act) after the layer's affine."""
    layer.act = activation
    layer.has_activation = True
    return layer
