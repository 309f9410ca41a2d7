"""FX tracing of models that contain normkit layers: the norms are kept as leaf modules.

A norm layer checks shapes and dispatches on mode and dtype in Python, which `torch.fx` cannot
trace; a leaf is recorded as one `call_module` node instead, which is all that feature
extraction, graph rewrites and `normkit.fold` need.
"""

from __future__ import annotations

from typing import Any

import torch.fx
from torch import nn

from normkit import plugins
from normkit.layer import NormLayer


def _plugin_packages() -> set[str]:
    """Top-level packages of the plugins whose norms are their own module classes (dyt, ln2d...)."""
    packages = set()
    for entry in plugins.registry().of_kind("norm"):
        if entry.factory is not None:
            packages.add(entry.factory.__module__.split(".")[0])
    return packages


def is_norm_module(module: nn.Module, packages: set[str] | None = None) -> bool:
    """True for a module `normkit.build` makes: a NormLayer or a norm plugin's own class."""
    if isinstance(module, NormLayer):
        return True
    packages = _plugin_packages() if packages is None else packages
    return type(module).__module__.split(".")[0] in packages


def leaf_modules(model: nn.Module) -> list[type[nn.Module]]:
    """The normkit norm classes in `model`, for tracers that take `leaf_modules`, e.g.
    `create_feature_extractor(model, nodes, tracer_kwargs={"leaf_modules": leaf_modules(model)})`."""
    packages = _plugin_packages()
    found: list[type[nn.Module]] = []
    for module in model.modules():
        if is_norm_module(module, packages) and type(module) not in found:
            found.append(type(module))
    return found


class NormTracer(torch.fx.Tracer):
    """A `torch.fx.Tracer` that keeps normkit norms as leaves (as torch's own norms are)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._packages = _plugin_packages()

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_norm_module(m, self._packages) or super().is_leaf_module(m, module_qualified_name)


def symbolic_trace(model: nn.Module) -> torch.fx.GraphModule:
    """`torch.fx.symbolic_trace` with normkit norms as leaf modules."""
    graph = NormTracer().trace(model)
    return torch.fx.GraphModule(model, graph, model.__class__.__name__)
