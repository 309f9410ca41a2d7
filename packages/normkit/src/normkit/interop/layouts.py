"""Fitting a built layer to what the layer it replaces computed: layout, activation, bias, frozen
statistics, gain offset, rounding order and the hooks registered on it."""

from __future__ import annotations

from torch import Tensor, nn

from normkit.errors import SpecError
from normkit.interop.sources import Source
from normkit.layer import NormLayer
from normkit.stages import RMSScale

# Hooks a converted layer cannot carry over: they act on gradients or on checkpoints, whose
# parameter layout the new layer need not share.
_REFUSED_HOOKS = ("_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
                  "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
_FORWARD_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                  "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def _channels_last_in(module: nn.Module, args: tuple) -> tuple:
    return (args[0].movedim(1, -1),)


def _channels_first_out(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
    return out.movedim(-1, 1).contiguous()


def per_position(layer: NormLayer) -> NormLayer:
    """A token layer (`channel_dim=-1`) applied to N,C,* inputs: statistics over C at each position.

    That is what LayerNorm2d computes; hooks (not a wrapper module) keep the state-dict keys, and
    `carry_hooks` keeps them innermost, so hooks carried over from the source see N,C,* tensors.
    """
    layer.register_forward_pre_hook(_channels_last_in)
    layer.register_forward_hook(_channels_first_out)
    layer.per_position = True
    return layer


def drop_layout_hooks(layer: NormLayer) -> None:
    """Remove the hooks `per_position` added (for a module that is per position by itself)."""
    for name, hook in (("_forward_pre_hooks", _channels_last_in), ("_forward_hooks", _channels_first_out)):
        hooks = getattr(layer, name)
        for key in [k for k, fn in hooks.items() if fn is hook]:
            del hooks[key]


def keep_activation(layer: NormLayer, activation: nn.Module) -> NormLayer:
    """Apply `activation` (a norm-act source's drop + act) after the layer's affine."""
    layer.act = activation
    layer.has_activation = True
    return layer


def check_hooks(old: nn.Module, path: str) -> None:
    """Refuse a layer whose hooks act on gradients or checkpoints, or whose forward was replaced on
    the instance (accelerate's hooks): a new layer cannot keep them."""
    refused = [name.strip("_") for name in _REFUSED_HOOKS if getattr(old, name, None)]
    if "forward" in vars(old):
        refused.append("a forward replaced on the instance")
    if refused:
        raise SpecError(f"cannot convert {path}: {type(old).__name__} has {', '.join(refused)}, which a new "
                        "layer cannot keep; remove them before converting")


def carry_hooks(old: nn.Module, new: nn.Module) -> None:
    """Give `new` the forward hooks and pre-hooks of `old` (checked with `check_hooks`), with their
    handles: the hook dicts move over, so a handle from `old` removes the hook from `new`. `new`'s
    own hooks (a layout's) stay innermost: its pre-hooks run after the carried ones, its forward
    hooks before them. Changes `old`'s dicts: call it only once the conversion is decided."""
    for name in _FORWARD_HOOKS:
        carried, own = getattr(old, name), getattr(new, name)
        if not carried:
            continue
        carried.update(own)
        if name == "_forward_hooks":
            for key in reversed(list(own)):
                carried.move_to_end(key, last=False)
        setattr(new, name, carried)


def fit_to_source(layer: nn.Module, source: Source, path: str) -> nn.Module:
    """Give a built layer what its source computed beyond the spec's settings: bias=False, `eps=None`
    (RMS steps), the stored weight's meaning, the rounding order, frozen statistics (the caller
    allows those only for plain `bn`) and unbatched inputs."""
    if not isinstance(layer, NormLayer):
        if not source.bias or source.frozen or source.gain_offset:
            raise SpecError(f"cannot convert {path}: the spec is built by a plugin factory, which cannot keep "
                            "the source's bias=False, frozen statistics or gain offset; use a pipeline norm")
        return layer
    if not source.bias and layer.bias is not None:
        layer.recovery = "gain"
        layer.register_parameter("bias", None)
    for step in layer.steps:
        if isinstance(step, RMSScale) and source.settings.get("eps", 0.0) is None:
            step.eps = None
    layer.gain_offset = source.gain_offset if layer.weight is not None else 0.0
    layer.round_before_gain = source.round_before_gain
    if source.frozen:
        layer.frozen = True
        layer.register_buffer("num_batches_tracked", None)  # FrozenBatchNorm2d's checkpoint has none
        layer.eval()
        for param in layer.parameters(recurse=False):
            param.requires_grad_(False)
    layer.unbatched_rank = source.unbatched_rank
    return layer
