"""Hand each norm layer whose steps need it (e.g. `ws`) the conv module that feeds it.

A norm layer cannot reach the conv before it, so model-level code does: in an nn.Sequential
the conv is the previous child; elsewhere the parent's forward is traced with torch.fx and the
conv is the submodule whose output the norm takes. normkit.convert and normkit-lab's models call
`prepare_feeding_convs` after building; plain `normkit.build` layers are not touched.
"""

from __future__ import annotations

from torch import nn

from normkit.errors import SpecError
from normkit.interop.activation_drop import trace_children
from normkit.layer import NormLayer
from normkit.stages import Step

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def conv_steps(module: nn.Module) -> list[Step]:
    return [s for s in module.steps if s.needs_conv] if isinstance(module, NormLayer) else []


def _feeding(parent: nn.Module, names: list[str]) -> dict[str, str]:
    """Norm child name -> name of the conv child whose output it normalizes."""
    children = list(parent.named_children())
    if isinstance(parent, nn.Sequential):
        return {name: children[i - 1][0] for i, (name, _) in enumerate(children)
                if name in names and i > 0 and isinstance(children[i - 1][1], _CONVS)}
    graph = trace_children(parent)
    found = {}
    for node in graph.nodes if graph is not None else ():
        if node.op == "call_module" and node.target in names and node.args:
            source = node.args[0]
            if getattr(source, "op", None) == "call_module" and isinstance(
                    parent.get_submodule(str(source.target)), _CONVS):
                found[str(node.target)] = str(source.target)
    return found


def feeding_convs(model: nn.Module, wanting: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(parent path, norm name, conv name) for each listed norm child; `wanting`: parent path -> names.

    Raises SpecError (one line) when a listed norm has no conv directly before it.
    """
    found = []
    for parent_path, names in wanting.items():
        feeding = _feeding(model.get_submodule(parent_path), names)
        for name in names:
            if name not in feeding:
                path = f"{parent_path}.{name}" if parent_path else name
                raise SpecError(f"{path}: no conv directly feeds this norm, so its conv step (e.g. "
                                "'+ws') has no conv weight to act on; use it only after convolutions")
            found.append((parent_path, name, feeding[name]))
    return found


def prepare_feeding_convs(model: nn.Module) -> list[str]:
    """Call `prepare_conv` of every step that needs the conv feeding its norm; returns conv paths."""
    wanting: dict[str, list[str]] = {}
    for parent_path, parent in model.named_modules():
        names = [name for name, child in parent.named_children() if conv_steps(child)]
        if names:
            wanting[parent_path] = names
    prepared = []
    for parent_path, name, conv_name in feeding_convs(model, wanting):
        parent = model.get_submodule(parent_path)
        for step in conv_steps(parent.get_submodule(name)):
            step.prepare_conv(parent.get_submodule(conv_name))
        prepared.append(f"{parent_path}.{conv_name}" if parent_path else conv_name)
    return prepared
