"""Drop the activation that directly consumes a norm's output, for norms that include their own.

A norm registered with `includes_activation=True` (FRN+TLU, EvoNorm) replaces norm *and*
activation. In an nn.Sequential the following activation module is simply replaced by
nn.Identity (convert's `_plan` does that); here, for modules whose forward calls the norm and
then an activation (torchvision's `relu(bn1(x))`, often through one ReLU module shared with the
post-residual ReLU), the parent's forward is traced with torch.fx and only that call is removed.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

from normkit.errors import SpecError

_ACTIVATION_MODULES = (nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.Mish, nn.LeakyReLU,
                       nn.ELU, nn.Hardswish)
_ACTIVATION_FUNCTIONS = (F.relu, torch.relu, F.silu, F.gelu, torch.tanh, torch.sigmoid, F.mish,
                         F.leaky_relu, F.elu, F.relu6, F.hardswish, torch.relu_)
del operator


class _ChildrenAreLeaves(fx.Tracer):
    """Trace only the parent's own forward: every submodule call stays one node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


@dataclass
class Drop:
    """One activation call removed after norm child `norm` of the module at `parent_path`."""

    parent_path: str
    norm: str
    activation: str


def _only_user(node: fx.Node, parent: nn.Module) -> fx.Node | None:
    """The one node reading `node`, past identity modules (timm's unused `drop_block`)."""
    while len(node.users) == 1:
        user = next(iter(node.users))
        if not (user.op == "call_module" and isinstance(parent.get_submodule(str(user.target)), nn.Identity)):
            return user
        node = user
    return None


def activation_user(graph: fx.Graph, parent: nn.Module, norm: str) -> tuple[fx.Node, str] | None:
    """The activation call that alone reads the norm child's output, and what it calls, if any."""
    for node in graph.nodes:
        if node.op == "call_module" and node.target == norm:
            user = _only_user(node, parent)
            if user is None:
                return None
            if user.op == "call_module" and isinstance(parent.get_submodule(str(user.target)),
                                                        _ACTIVATION_MODULES):
                return user, type(parent.get_submodule(str(user.target))).__name__
            if user.op == "call_function" and user.target in _ACTIVATION_FUNCTIONS:
                return user, getattr(user.target, "__name__", str(user.target))
            return None
    return None


def trace_children(parent: nn.Module) -> fx.Graph | None:
    """The graph of `parent.forward` with every submodule call as one node; None if untraceable."""
    try:
        return _ChildrenAreLeaves().trace(parent)
    except Exception:  # forward not traceable (data-dependent control flow): leave it alone
        return None


@dataclass
class DropPlan:
    """What `apply_drops` will change: activation children to swap, parents whose graph is rewritten."""

    drops: list[Drop]
    swaps: list[tuple[str, str]]  # (parent path, activation child) -> nn.Identity
    graphs: dict[str, fx.Graph]  # parent path -> traced graph without the dropped calls


def plan_drops(model: nn.Module, norms: dict[str, list[str]]) -> DropPlan:
    """Find the activation call right after each listed norm child; `norms`: parent path -> names.

    Changes nothing, so convert can refuse before touching the model: raises SpecError when the
    root's own forward shares the activation (its class cannot be rewritten in place).
    """
    plan = DropPlan([], [], {})
    for parent_path, names in norms.items():
        parent = model.get_submodule(parent_path)
        graph = trace_children(parent)
        if graph is None:
            continue
        for norm in names:
            found = activation_user(graph, parent, norm)
            if found is None:
                continue
            user, what = found
            calls = [n for n in graph.nodes if n.op == "call_module" and n.target == user.target]
            if user.op == "call_module" and len(calls) == 1 and "." not in str(user.target):
                plan.swaps.append((parent_path, str(user.target)))
            else:
                if not parent_path:
                    raise SpecError(f"cannot drop the activation after {norm}: the model's own forward "
                                    "shares it; wrap the model or build it from norm-activation blocks")
                user.replace_all_uses_with(user.args[0])  # the norm's output, or the identity after it
                graph.erase_node(user)
                plan.graphs[parent_path] = graph
            plan.drops.append(Drop(parent_path, norm, what))
    return plan


def apply_drops(model: nn.Module, plan: DropPlan) -> list[Drop]:
    """Swap single-use activations for nn.Identity; rebuild parents with a shared one as GraphModules.

    A rebuilt parent keeps its submodules (taken by name at this point, so after the norms were
    replaced), parameters and state_dict keys, and pickles.
    """
    for parent_path, child in plan.swaps:
        setattr(model.get_submodule(parent_path), child, nn.Identity())
    for parent_path, graph in plan.graphs.items():
        parent = model.get_submodule(parent_path)
        module = fx.GraphModule(parent, graph, class_name=type(parent).__name__)
        module.train(parent.training)
        owner_path, _, child = parent_path.rpartition(".")
        setattr(model.get_submodule(owner_path), child, module)
    return plan.drops
