"""`normkit.norm_layer(spec)`: a factory for the `norm_layer=` argument of torchvision and timm.

torchvision calls `norm_layer(channels)`; timm's norm-act builders call it with `act_layer`,
`apply_act`, `inplace`, `drop_layer`, `device` and `dtype` and expect the activation applied
inside the layer. The factory is a plain function (timm accepts functions, and unwraps
`functools.partial`, losing positional arguments).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from normkit.build import build
from normkit.errors import SpecError
from normkit.interop.convert import _activation_name
from normkit.interop.layouts import keep_activation
from normkit.layer import NormLayer
from normkit.spec import parse


def _make_activation(act_layer: Any, inplace: bool) -> nn.Module:
    if isinstance(act_layer, nn.Module):
        return act_layer
    if isinstance(act_layer, str):
        from timm.layers import get_act_layer  # a string names a timm activation
        act_layer = get_act_layer(act_layer)
    try:
        return act_layer(inplace=inplace)
    except TypeError:
        return act_layer()


def norm_layer(spec: str, *, channel_dim: int = 1, **params: Any) -> Callable[..., nn.Module]:
    """A `norm_layer=` factory building `spec` (extra `params` go to `normkit.build`).

    `channel_dim=-1` for models whose norms see channels-last tokens (ViT, GPT blocks).
    """
    parsed = parse(spec)
    owns_activation = parsed.norm.entry.includes_activation or any(
        p.entry.kind in ("activation", "post_activation") for p in parsed.parts)

    def make(num_features: int, *args: Any, act_layer: Any = None, apply_act: bool = True,
             inplace: bool = False, drop_layer: Any = None, device: Any = None, dtype: Any = None,
             **_ignored: Any) -> nn.Module:
        act = _make_activation(act_layer, inplace) if act_layer is not None and apply_act else None
        if owns_activation:
            name = _activation_name(act) if act is not None else None
            if name is None:
                raise SpecError(f"norm_layer({parsed.text!r}): the spec owns its activation but the model "
                                f"asks for {act!r}; use a spec without an activation step")
            layer = build(parsed, num_features, channel_dim=channel_dim, activation=name, **params)
        else:
            layer = build(parsed, num_features, channel_dim=channel_dim, **params)
            parts = [m for m in (drop_layer() if drop_layer is not None else None, act) if m is not None]
            if parts:
                if not isinstance(layer, NormLayer):
                    raise SpecError(f"norm_layer({parsed.text!r}): a plugin-factory norm cannot apply the "
                                    "model's activation; use a pipeline norm")
                keep_activation(layer, parts[0] if len(parts) == 1 else nn.Sequential(*parts))
        if device is not None or dtype is not None:
            layer = layer.to(device=device, dtype=dtype if dtype is not None else torch.get_default_dtype())
        return layer

    make.__name__ = make.__qualname__ = f"norm_layer_{parsed.text}"
    _ask_timm_for_activation(make)
    return make


def _ask_timm_for_activation(factory: Callable[..., nn.Module]) -> None:
    """timm's get_norm_act_layer hands the model's act_layer only to layers in its
    `_NORM_ACT_REQUIRES_ARG` set (a plain function otherwise gets none, and activations vanish)."""
    try:
        from timm.layers import create_norm_act
    except ImportError:
        return
    requires = getattr(create_norm_act, "_NORM_ACT_REQUIRES_ARG", None)
    if isinstance(requires, set):
        requires.add(factory)
