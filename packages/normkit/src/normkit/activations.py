"""Activation stages the core knows (`bn+relu`, `pn(act=silu)`), registered as a built-in plugin.

Third-party plugins add their own with `register(name, factory, kind="activation")`.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from normkit.hookspecs import RegisterStage, hookimpl
from normkit.stages import BuildContext


def _build(cls: type[nn.Module], ctx: BuildContext) -> nn.Module:
    return cls()


def _simple(cls: type[nn.Module]) -> Any:
    """A picklable factory `(ctx) -> cls()` (functools.partial, not a closure)."""
    return functools.partial(_build, cls)


def _leaky_relu(ctx: BuildContext, negative_slope: float = 0.01) -> nn.Module:
    return nn.LeakyReLU(negative_slope)


def _elu(ctx: BuildContext, alpha: float = 1.0) -> nn.Module:
    return nn.ELU(alpha)


def _gelu(ctx: BuildContext, approximate: str = "none") -> nn.Module:
    return nn.GELU(approximate=approximate)


_ACTIVATIONS: dict[str, tuple[Any, str]] = {
    "relu": (_simple(nn.ReLU), "max(x, 0)"),
    "silu": (_simple(nn.SiLU), "x * sigmoid(x) (swish)"),
    "gelu": (_gelu, "Gaussian error linear unit"),
    "tanh": (_simple(nn.Tanh), "hyperbolic tangent"),
    "sigmoid": (_simple(nn.Sigmoid), "logistic sigmoid"),
    "mish": (_simple(nn.Mish), "x * tanh(softplus(x))"),
    "leaky-relu": (_leaky_relu, "max(x, slope * x)"),
    "elu": (_elu, "exponential linear unit"),
    "identity": (_simple(nn.Identity), "no activation"),
}


@hookimpl
def normkit_register_stages(register: RegisterStage) -> None:
    for name, (factory, summary) in _ACTIVATIONS.items():
        register(name, factory, kind="activation", summary=f"activation: {summary}")
