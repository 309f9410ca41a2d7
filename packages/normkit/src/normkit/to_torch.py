"""`normkit.to_torch`: plain normkit layers back to torch's own modules, for tools that only know
those (quantizers, exporters, inference runtimes). Same function in eval, state copied."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from normkit.layer import NormLayer
from normkit.stages import RMSScale, Standardize

_BATCH_NORMS = {3: nn.BatchNorm1d, 2: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}


@dataclass
class ToTorchSummary:
    """What `to_torch` did: `replaced` as (path, torch class name), `kept` as (path, why)."""

    model: nn.Module
    replaced: list[tuple[str, str]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"replaced {len(self.replaced)} layer(s) by torch modules, kept {len(self.kept)}"]
        lines += [f"  {path} -> {name}" for path, name in self.replaced]
        lines += [f"  kept {path}: {why}" for path, why in self.kept]
        return "\n".join(lines)


def _plain_step(layer: NormLayer) -> Standardize | RMSScale | str:
    if layer.has_activation or layer.post is not None:
        return "has an activation or post-activation stage"
    if len(layer.steps) != 1 or type(layer.steps[0]) not in (Standardize, RMSScale):
        return "is not a plain bn/ln/gn/rms spec (" + " + ".join(s.name for s in layer.steps) + ")"
    return layer.steps[0]


def _torch_module(layer: NormLayer, ndim: int | None) -> nn.Module | str:
    """The torch module computing what `layer` computes, or why there is none."""
    step = _plain_step(layer)
    if isinstance(step, str):
        return step
    kind, c, recovery = layer.partition.kind, layer.num_channels, layer.recovery
    if isinstance(step, RMSScale):
        if kind != "layer" or not layer.tokens:
            return "rms over channels and positions (N,C,*) has no torch module; only channels-last rms does"
        if recovery == "affine":
            return "torch's RMSNorm has no bias"
        return nn.RMSNorm(c, eps=step.eps, elementwise_affine=recovery == "gain")
    if kind == "batch":
        if layer.tokens:
            return "channels-last batch norm has no torch module"
        if recovery == "gain":
            return "torch's BatchNorm has no weight-only (gain) form"
        if ndim is not None and ndim not in _BATCH_NORMS:
            return f"torch's BatchNorm takes 2-5 dims, this layer saw {ndim}"
        cls = _BATCH_NORMS[ndim] if ndim is not None else nn.BatchNorm2d
        return cls(c, eps=step.eps, momentum=step.momentum, affine=recovery == "affine",
                   track_running_stats=step.track_running_stats)
    if kind == "layer" and layer.tokens:
        return nn.LayerNorm(c, eps=step.eps, elementwise_affine=recovery != "none", bias=recovery == "affine")
    if kind in ("layer", "group") and not layer.tokens:  # ln on N,C,* is GroupNorm with one group
        if recovery == "gain":
            return "torch's GroupNorm has no weight-only (gain) form"
        groups = 1 if kind == "layer" else layer.partition.groups
        return nn.GroupNorm(groups, c, eps=step.eps, affine=recovery == "affine")
    return f"{kind} partition in layout {'N,*,C' if layer.tokens else 'N,C,*'} has no torch module"


def _input_ranks(model: nn.Module, example: Tensor | tuple) -> dict[str, int]:
    """The rank of the input each NormLayer sees in one forward of `example`."""
    ranks: dict[str, int] = {}

    def remember(path: str) -> Callable[[nn.Module, tuple], None]:
        def hook(_module: nn.Module, args: tuple) -> None:
            ranks.setdefault(path, args[0].dim())
        return hook

    hooks = [m.register_forward_pre_hook(remember(p)) for p, m in model.named_modules()
             if isinstance(m, NormLayer)]
    try:
        with torch.no_grad():
            model(*(example if isinstance(example, tuple) else (example,)))
    finally:
        for hook in hooks:
            hook.remove()
    return ranks


def to_torch(model: nn.Module, example: Tensor | tuple | None = None) -> ToTorchSummary:
    """Replace plain normkit layers by torch's own modules, in place, copying their state.

    bn -> BatchNorm1d/2d/3d (chosen from the rank each layer sees when `example` is given, one
    forward without gradients; BatchNorm2d otherwise), ln -> LayerNorm (channels-last) or
    GroupNorm(1, C) (N,C,*), gn -> GroupNorm, rms -> RMSNorm (channels-last). Other specs are
    kept and listed with the reason. A model that is itself a NormLayer is returned converted
    in `summary.model`.
    """
    ranks = _input_ranks(model, example) if example is not None else {}
    summary = ToTorchSummary(model)
    targets = [(p, m) for p, m in model.named_modules() if isinstance(m, NormLayer)]
    for path, layer in targets:
        new = _torch_module(layer, ranks.get(path))
        if isinstance(new, str):
            summary.kept.append((path or type(layer).__name__, new))
            continue
        ref = next(iter([*layer.parameters(), *layer.buffers()]), None)
        if ref is not None:
            new = new.to(device=ref.device, dtype=ref.dtype if ref.is_floating_point() else None)
        missing, unexpected = new.load_state_dict(layer.state_dict(), strict=False)
        if missing or unexpected:
            summary.kept.append((path, f"state does not map ({missing or unexpected})"))
            continue
        new.train(layer.training)
        if path:
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, name, new)
        else:
            summary.model = new
        summary.replaced.append((path or type(layer).__name__, type(new).__name__))
    return summary
