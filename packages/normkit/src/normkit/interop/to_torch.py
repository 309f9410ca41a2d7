"""`normkit.to_torch`: plain normkit layers back to torch's own modules (and the libraries'
LayerNorm2d and BatchNormAct2d, which subclass them), for tools that only know those (quantizers,
exporters, inference runtimes, timm's `reparameterize_model`). Same function in eval, state copied."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from normkit.errors import SpecError
from normkit.interop.input_ranks import input_ranks
from normkit.interop.layouts import carry_hooks, check_hooks, drop_layout_hooks
from normkit.layer import NormLayer
from normkit.stages import RMSScale, Standardize

_BATCH_NORMS = {3: nn.BatchNorm1d, 2: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}
_INSTANCE_NORMS = {3: nn.InstanceNorm1d, 4: nn.InstanceNorm2d, 5: nn.InstanceNorm3d}


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


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over C at each position of N,C,H,W (timm's and torchvision's LayerNorm2d), for
    `to_torch` where neither library is installed: an nn.LayerNorm, with its state-dict keys."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _layer_norm_2d(c: int, eps: float, affine: bool, bias: bool) -> nn.Module:
    """timm's LayerNorm2d, else torchvision's, else normkit's: whichever is installed."""
    try:
        from timm.layers import LayerNorm2d as TimmLayerNorm2d
    except ImportError:
        pass
    else:
        return TimmLayerNorm2d(c, eps=eps, affine=affine, bias=bias)
    try:
        from torchvision.models.convnext import LayerNorm2d as TorchvisionLayerNorm2d
    except ImportError:
        return LayerNorm2d(c, eps=eps, elementwise_affine=affine, bias=bias)
    return TorchvisionLayerNorm2d(c, eps=eps, elementwise_affine=affine, bias=bias)


def _rms_norm_2d(c: int, eps: float | None, recovery: str) -> nn.Module | str:
    try:
        from timm.layers import RmsNorm2d
    except ImportError:
        return "rms over C at each position of N,C,* (RmsNorm2d) is timm's module, and timm is not installed"
    if recovery == "affine" or eps is None:
        return "timm's RmsNorm2d has no bias and a fixed eps"
    return RmsNorm2d(c, eps=eps, affine=recovery == "gain")


def _plain_step(layer: NormLayer) -> Standardize | RMSScale | str:
    if layer.post is not None:
        return "has a post-activation stage"
    if len(layer.steps) != 1 or type(layer.steps[0]) not in (Standardize, RMSScale):
        return "is not a plain bn/ln/gn/rms spec (" + " + ".join(s.name for s in layer.steps) + ")"
    return layer.steps[0]


def _adapted(layer: NormLayer) -> str | None:
    """Why a converted layer's adaptation to its source has no torch module, else None."""
    if layer.frozen:
        return "is a frozen batch norm (statistics and affine fixed in training); torch's BatchNorm is not"
    if layer.gain_offset:
        return f"its gain is weight + {layer.gain_offset} (Gemma); torch's modules use the weight itself"
    if layer.unbatched_rank and layer.partition.kind != "instance":
        return "takes unbatched inputs, as the InstanceNorm it replaced did; torch's other norms do not"
    if layer.round_before_gain:
        return ("rounds half-precision values before its gain (Hugging Face's order); torch's RMSNorm "
                "rounds after it")
    return None


def _with_activation(module: nn.Module, layer: NormLayer) -> nn.Module | str:
    """`module` followed by the layer's activation: timm's BatchNormAct2d (a BatchNorm2d) for bn."""
    why = "applies an activation after its affine, which torch's modules do not"
    if type(module) is not nn.BatchNorm2d:
        return why
    try:
        from timm.layers import BatchNormAct2d
    except ImportError:
        return why + " (timm's BatchNormAct2d does; timm is not installed)"
    new = BatchNormAct2d(module.num_features, eps=module.eps, momentum=module.momentum, affine=module.affine,
                         track_running_stats=module.track_running_stats, apply_act=False)
    if module.affine and module.bias is None:
        return why + " without a bias (timm's BatchNormAct2d has one)"
    new.act = layer.act
    return new


def _norm_module(layer: NormLayer, step: Standardize | RMSScale, ndim: int | None) -> nn.Module | str:
    """The torch module computing the layer's normalization and affine, or why there is none."""
    kind, c, recovery = layer.partition.kind, layer.num_channels, layer.recovery
    if layer.partition.ghost is not None:
        return "ghost batches (ghost=) have no torch module"
    if isinstance(step, RMSScale):
        if kind == "layer" and layer.per_position:
            return _rms_norm_2d(c, step.eps, recovery)
        if kind != "layer" or not layer.tokens:
            return "rms over channels and positions (N,C,*) has no torch module; only channels-last rms does"
        if recovery == "affine":
            return "torch's RMSNorm has no bias"
        return nn.RMSNorm(c, eps=step.eps, elementwise_affine=recovery == "gain")
    if kind == "layer" and layer.per_position:
        return _layer_norm_2d(c, step.eps, recovery != "none", recovery == "affine")
    if kind == "batch":
        if layer.tokens:
            return "channels-last batch norm has no torch module"
        if ndim is not None and ndim not in _BATCH_NORMS:
            return f"torch's BatchNorm takes 2-5 dims, this layer saw {ndim}"
        cls = _BATCH_NORMS[ndim] if ndim is not None else nn.BatchNorm2d
        return cls(c, eps=step.eps, momentum=step.momentum, affine=recovery != "none",
                   track_running_stats=step.track_running_stats, bias=recovery == "affine")
    if kind == "instance" and not layer.tokens:
        rank = layer.unbatched_rank or ndim
        if rank not in _INSTANCE_NORMS:
            return "instance norm: pass an example input to pick InstanceNorm1d/2d/3d by its rank"
        return _INSTANCE_NORMS[rank](c, eps=step.eps, affine=recovery != "none", bias=recovery == "affine")
    if kind == "layer" and layer.tokens:
        return nn.LayerNorm(c, eps=step.eps, elementwise_affine=recovery != "none", bias=recovery == "affine")
    if kind in ("layer", "group") and not layer.tokens:  # ln on N,C,* is GroupNorm with one group
        groups = 1 if kind == "layer" else layer.partition.groups
        return nn.GroupNorm(groups, c, eps=step.eps, affine=recovery != "none", bias=recovery == "affine")
    return f"{kind} partition in layout {'N,*,C' if layer.tokens else 'N,C,*'} has no torch module"


def _torch_module(layer: NormLayer, ndim: int | None) -> nn.Module | str:
    """The torch module computing what `layer` computes, or why there is none."""
    step = _plain_step(layer)
    if isinstance(step, str):
        return step
    adapted = _adapted(layer)
    if adapted is not None:
        return adapted
    module = _norm_module(layer, step, ndim)
    if isinstance(module, str) or not layer.has_activation:
        return module
    return _with_activation(module, layer)


def to_torch(model: nn.Module, example: Tensor | tuple | None = None) -> ToTorchSummary:
    """Replace plain normkit layers by torch's own modules, in place, copying their state.

    bn -> BatchNorm1d/2d/3d (chosen from the rank each layer sees when `example` is given, one
    forward without gradients; BatchNorm2d otherwise), in -> InstanceNorm1d/2d/3d (by that rank or
    the InstanceNorm it was converted from), ln -> LayerNorm (channels-last) or
    GroupNorm(1, C) (N,C,*), gn -> GroupNorm, rms -> RMSNorm (channels-last). Per-position layers
    (converted LayerNorm2d/RmsNorm2d) become timm's LayerNorm2d/RmsNorm2d (torchvision's or
    normkit's `LayerNorm2d` without timm); a bn that applies an activation (a converted
    BatchNormAct2d) becomes timm's BatchNormAct2d, a BatchNorm2d. Other specs are kept and
    listed with the reason. A model that is itself a NormLayer is returned converted
    in `summary.model`.
    """
    ranks = input_ranks(model, example, lambda m: isinstance(m, NormLayer)) if example is not None else {}
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
        try:
            check_hooks(layer, path)
        except SpecError as exc:
            summary.kept.append((path, str(exc).partition(": ")[2]))
            continue
        if layer.per_position:
            drop_layout_hooks(layer)  # the new module is per position by itself
        carry_hooks(layer, new)
        new.train(layer.training)
        if path:
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, name, new)
        else:
            summary.model = new
        summary.replaced.append((path or type(layer).__name__, type(new).__name__))
    return summary
