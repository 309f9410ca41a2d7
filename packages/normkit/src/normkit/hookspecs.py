"""The plugin hooks. Each receives a `register` callable so one plugin can add many items.

    @normkit.hookimpl
    def normkit_register_norms(register):
        register("bn", pipeline=batch_norm_pipeline, summary="...", citation="...")
        register("bnn", compose="bn+nn", summary="...")
        register("mynorm", factory=MyNorm)          # any (num_channels, **params) -> nn.Module

See `normkit.registry.Registry` for the keyword arguments each `register` accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("normkit")
hookimpl = pluggy.HookimplMarker("normkit")


@hookspec
def normkit_register_norms(register: Callable[..., Any]) -> None:
    """Register named norms: a pipeline builder, a composition of other names, or a factory."""


@hookspec
def normkit_register_stages(register: Callable[..., Any]) -> None:
    """Register composable stages usable after '+': steps, activations, post-activation steps."""


@hookspec
def normkit_register_models(register: Callable[..., Any]) -> None:
    """Register model builders for experiments (used by normkit-lab)."""


@hookspec
def normkit_register_datasets(register: Callable[..., Any]) -> None:
    """Register datasets for experiments (used by normkit-lab)."""
