"""Optimizer parameter groups with one weight-decay policy for norm parameters."""

from __future__ import annotations

from typing import Any

from torch import nn

from normkit.layer import NormLayer


def param_groups(model: nn.Module, weight_decay: float, *, norm_weight_decay: float | None = None,
                 plugin_policy: bool = False) -> list[dict[str, Any]]:
    """Split `model`'s parameters into groups with the weight decay each should get.

    By default every parameter of a norm layer (affines and extra parameters such as proxy norm's
    beta~/gamma~) gets `norm_weight_decay` (default: `weight_decay`, the proxy-norm paper's ResNet
    recipe, which decays every parameter), so models that differ only in their norms get the same
    policy. With `plugin_policy=True` a norm's own declared policy applies instead (proxy norm
    decays only beta~/gamma~, as in its reference code): declared-decayed parameters get
    `weight_decay`, declared-undecayed get 0, undeclared ones `norm_weight_decay`. Everything
    else gets `weight_decay`. Returns groups ready for `torch.optim.SGD(groups, ...)`.
    """
    norm_wd = weight_decay if norm_weight_decay is None else norm_weight_decay
    decay_of: dict[int, float] = {}
    for module in model.modules():
        if isinstance(module, NormLayer):
            policy = module.decay() if plugin_policy else {}
            for name, p in module.named_parameters(recurse=False):
                decay_of[id(p)] = (weight_decay if policy[name] else 0.0) if name in policy else norm_wd
    by_decay: dict[float, list[nn.Parameter]] = {}
    for p in model.parameters():
        if p.requires_grad:
            by_decay.setdefault(decay_of.get(id(p), weight_decay), []).append(p)
    return [{"params": ps, "weight_decay": wd} for wd, ps in sorted(by_decay.items(), reverse=True)]
