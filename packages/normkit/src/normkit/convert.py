"""`normkit.convert`: swap every torch norm layer in a model for a spec's layer, in place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from normkit.activation_drop import DropPlan, apply_drops, plan_drops
from normkit.build import build_with_settings
from normkit.errors import SpecError
from normkit.feeding_conv import conv_steps, feeding_convs, prepare_feeding_convs
from normkit.layer import NormLayer
from normkit.spec import Spec, parse
from normkit.sync import ProcessSync

_TORCH_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm,
                nn.modules.instancenorm._InstanceNorm)
_STATE = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@dataclass
class Replacement:
    path: str
    old: str
    new: str
    copied: list[str]
    activation: str | None = None


@dataclass
class ConversionSummary:
    """What `convert` replaced: one Replacement per norm layer."""

    spec: str
    replaced: list[Replacement] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.replaced)

    def __iter__(self):
        return iter(self.replaced)

    def __str__(self) -> str:
        lines = [f"converted {len(self.replaced)} norm layers to {self.spec!r}"]
        for r in self.replaced:
            extra = f", owns {r.activation}" if r.activation else ""
            if r.activation and r.activation.endswith(" dropped"):
                extra = f", {r.activation}: the norm includes its activation"
            lines.append(f"  {r.path}: {r.old} -> {r.new} (copied {', '.join(r.copied) or 'nothing'}{extra})")
        return "\n".join(lines)


def _activation_name(module: nn.Module) -> str | None:
    """The registered activation name a module computes with default settings, else None."""
    simple = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid",
              nn.Mish: "mish", nn.Identity: None}
    if type(module) in simple:
        return simple[type(module)]
    if type(module) is nn.GELU and module.approximate == "none":
        return "gelu"
    if type(module) is nn.LeakyReLU and module.negative_slope == 0.01:
        return "leaky-relu"
    if type(module) is nn.ELU and module.alpha == 1.0:
        return "elu"
    return None


def _layout(path: str, module: nn.Module) -> tuple[int, int, dict[str, Any]]:
    """(num_channels, channel_dim, settings to carry over) of a torch norm layer."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return module.num_features, 1, {"eps": module.eps, "momentum": module.momentum,
                                        "affine": module.affine,
                                        "track_running_stats": module.track_running_stats}
    if isinstance(module, nn.modules.instancenorm._InstanceNorm):
        return module.num_features, 1, {"eps": module.eps, "affine": module.affine}
    if isinstance(module, nn.GroupNorm):
        return module.num_channels, 1, {"eps": module.eps, "groups": module.num_groups,
                                        "affine": module.affine}
    shape = tuple(module.normalized_shape)
    if len(shape) != 1:
        raise SpecError(f"cannot convert {path} (LayerNorm over {shape}): only LayerNorm over the "
                        "last dim (channels-last tokens) is supported")
    return shape[0], -1, {"eps": module.eps, "affine": module.elementwise_affine}


def _needs_activation(spec: Spec) -> bool:
    return any(p.entry.kind in ("activation", "post_activation") for p in spec.parts)


def _plan(model: nn.Module, spec: Spec) -> list[tuple[nn.Module, str, str, nn.Module, str | None, str | None]]:
    """Find every norm (parent, child name, path, module, activation name, activation child)."""
    plan = []
    needs_act = _needs_activation(spec)
    includes_act = spec.norm.entry.includes_activation

    def visit(parent: nn.Module, prefix: str) -> None:
        children = list(parent.named_children())
        for i, (name, child) in enumerate(children):
            path = f"{prefix}{name}"
            if isinstance(child, _TORCH_NORMS):
                act_name = act_child = None
                if needs_act:
                    nxt = children[i + 1] if i + 1 < len(children) else None
                    if isinstance(parent, nn.Sequential) and nxt is not None:
                        act_name = _activation_name(nxt[1])
                        act_child = nxt[0] if act_name else None
                    if act_name is None:
                        raise SpecError(
                            f"cannot place {spec.text!r} at {path}: no activation module directly "
                            "follows it in an nn.Sequential, so there is no activation step to take "
                            "over; build the model from norm-activation blocks (docs/norms/proxy.md)"
                        )
                if includes_act and isinstance(parent, nn.Sequential) and i + 1 < len(children):
                    act_name = _activation_name(children[i + 1][1])
                    act_child = children[i + 1][0] if act_name else None
                plan.append((parent, name, path, child, act_name, act_child))
            else:
                visit(child, path + ".")

    visit(model, "")
    return plan


def convert(model: nn.Module, spec: str | Spec) -> ConversionSummary:
    """Replace every BatchNorm*/SyncBatchNorm/GroupNorm/LayerNorm/InstanceNorm* in `model`.

    Channel count and layout come from each layer; affine parameters, running statistics and
    settings (eps, momentum, groups, affine) are copied where the new layer has them. Specs with
    an activation or post-activation step take over the activation module that directly follows
    the norm in an nn.Sequential (replaced by nn.Identity). Norms that include their activation
    (frn, evonorm) drop the activation that directly follows them (activation_drop.py); steps that
    act on the conv feeding the norm (`+ws`) get it (feeding_conv.py). Nothing is changed when
    any layer cannot be converted. Returns a summary of what was replaced.
    """
    parsed = parse(spec)
    if isinstance(model, _TORCH_NORMS):
        raise SpecError("convert() replaces norms inside a model; use normkit.build() for one layer")
    plan = _plan(model, parsed)
    built = []
    for parent, name, path, old, act_name, act_child in plan:
        channels, channel_dim, settings = _layout(path, old)
        try:
            new = build_with_settings(parsed, channels, channel_dim=channel_dim, activation=act_name,
                                      overrides={}, norm_settings=settings)
        except SpecError as exc:
            raise SpecError(f"cannot convert {path} ({type(old).__name__}({channels})): {exc}") from exc
        copied = _copy_state(old, new)
        owned = f"{act_name} dropped" if parsed.norm.entry.includes_activation and act_name else act_name
        built.append((parent, name, new, act_child, Replacement(path, type(old).__name__, parsed.text,
                                                                copied, owned)))
    _check_feeding_convs(model, built)  # before any change: a '+ws' norm needs a conv before it
    drops = _plan_traced_drops(model, built) if parsed.norm.entry.includes_activation else None
    summary = ConversionSummary(parsed.text)
    for parent, name, new, act_child, record in built:
        setattr(parent, name, new)
        if act_child is not None:
            setattr(parent, act_child, nn.Identity())
        summary.replaced.append(record)
    if drops is not None:
        records = {r.path: r for r in summary.replaced}
        for drop in apply_drops(model, drops):
            path = f"{drop.parent_path}.{drop.norm}" if drop.parent_path else drop.norm
            records[path].activation = f"{drop.activation} dropped"
    prepare_feeding_convs(model)
    return summary


def _check_feeding_convs(model: nn.Module, built: list) -> None:
    wanting: dict[str, list[str]] = {}
    for _, name, new, _, record in built:
        if conv_steps(new):
            wanting.setdefault(record.path.rpartition(".")[0], []).append(name)
    feeding_convs(model, wanting)


def _plan_traced_drops(model: nn.Module, built: list) -> DropPlan:
    """Outside nn.Sequential, the activation call after each norm that includes its own."""
    by_parent: dict[str, list[str]] = {}
    for parent, name, _, act_child, record in built:
        if act_child is None and not isinstance(parent, nn.Sequential):
            by_parent.setdefault(record.path.rpartition(".")[0], []).append(name)
    return plan_drops(model, by_parent)


def _copy_state(old: nn.Module, new: nn.Module) -> list[str]:
    ref = next(iter(old.parameters()), None)
    if ref is None:
        ref = next(iter(old.buffers()), None)
    if ref is not None:
        new.to(device=ref.device, dtype=ref.dtype if ref.is_floating_point() else None)
    new.train(old.training)
    copied = []
    with torch.no_grad():
        for key in _STATE:
            src, dst = getattr(old, key, None), getattr(new, key, None)
            if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src.shape == dst.shape:
                dst.copy_(src)
                copied.append(key)
    return copied


def convert_sync(model: nn.Module, process_group: Any = None) -> nn.Module:
    """Make every batch-statistics normkit layer in `model` reduce its statistics across processes.

    In place, returns `model`. Layers whose partition does not pool over the batch (ln, gn, in,
    rms, ...) need no communication and are left alone. torch's own BatchNorm layers are torch's
    to convert (`nn.SyncBatchNorm.convert_sync_batchnorm`).
    """
    for module in model.modules():
        if isinstance(module, NormLayer) and module.partition is not None and module.partition.uses_batch:
            module.sync = ProcessSync(process_group)
    return model
