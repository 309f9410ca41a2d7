"""Optimizer parameter groups that respect what norm layers declare about weight decay."""

from __future__ import annotations

from typing import Any

from torch import nn

from normkit.layer import NormLayer


def param_groups(model: nn.Module, weight_decay: float, *,
                 norm_weight_decay: float | None = None) -> list[dict[str, Any]]:
    """Split `model`'s parameters into groups with the weight decay each should get.

    Norm layers may declare a policy per parameter (proxy norm decays only its proxy
    parameters beta~/gamma~, as in the paper); parameters a layer declares decayed get
    `weight_decay`, declared undecayed get 0. Other norm-layer parameters get
    `norm_weight_decay` (default: `weight_decay`, as in the ResNet recipes), everything else
    `weight_decay`. Returns groups ready for `torch.optim.SGD(groups, ...)`.
    """
    norm_wd = weight_decay if norm_weight_decay is None else norm_weight_decay
    decay_of: dict[int, float] = {}
    for module in model.modules():
        if isinstance(module, NormLayer):
            policy = module.decay()
            for name, p in module.named_parameters(recurse=False):
                decay_of[id(p)] = (weight_decay if policy[name] else 0.0) if name in policy else norm_wd
    by_decay: dict[float, list[nn.Parameter]] = {}
    for p in model.parameters():
        if p.requires_grad:
            by_decay.setdefault(decay_of.get(id(p), weight_decay), []).append(p)
    return [{"params": ps, "weight_decay": wd} for wd, ps in sorted(by_decay.items(), reverse=True)]
