"""The lab's built-in models, datasets, presets and suite workloads, registered through the normkit plugin hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import normkit


@normkit.hookimpl
def normkit_register_models(register: Callable[..., Any]) -> None:
    from normkit_lab.models import register_builtin_models

    register_builtin_models(register)


@normkit.hookimpl
def normkit_register_datasets(register: Callable[..., Any]) -> None:
    from normkit_lab.datasets import register_builtin_datasets

    register_builtin_datasets(register)


@normkit.hookimpl
def normkit_register_presets(register: Callable[..., Any]) -> None:
    """The lab's own reproduction presets (language models), shipped in normkit_lab/presets/."""
    from importlib import resources

    for path in sorted(resources.files("normkit_lab").joinpath("presets").iterdir(), key=lambda p: p.name):
        if path.name.endswith(".yaml"):
            register(path.name.removesuffix(".yaml"), path)


@normkit.hookimpl
def normkit_register_workloads(register: Callable[..., Any]) -> None:
    """The suite's own workloads (`normkit suite --list`)."""
    from normkit_lab.suite.builtin import register_builtin_workloads

    register_builtin_workloads(register)
