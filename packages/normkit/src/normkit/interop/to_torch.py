"""`normkit.to_torch`: plain normkit layers back to torch's own modules, for tools that only know
those (quantizers, exporters, inference runtimes). Same function in eval, state copied."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from normkit.errors import SpecError
from normkit.interop.input_ranks import input_ranks
from normkit.interop.layouts import carry_hooks, check_hooks
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


def _plain_step(layer: NormLayer) -> Standardize | RMSScale | str:
    if layer.has_activation or layer.post is not None:
        return "has an activation or post-activation stage"
    if len(layer.steps) != 1 or type(layer.steps[0]) not in (Standardize, RMSScale):
        return "is not a plain bn/ln/gn/rms spec (" + " + ".join(s.name for s in layer.steps) + ")"
    return layer.steps[0]


def _adapted(layer: NormLayer) -> str | None:
    """Why a converted layer's adaptation to its source has no torch module, else None."""
    if layer.per_position:
        return "normalizes over C at each position of N,C,* (LayerNorm2d); torch has no such module"
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


def _torch_module(layer: NormLayer, ndim: int | None) -> nn.Module | str:
    """The torch module computing what `layer` computes, or why there is none."""
    step = _plain_step(layer)
    if isinstance(step, str):
        return step
    adapted = _adapted(layer)
    if adapted is not None:
        return adapted
    kind, c, recovery = layer.partition.kind, layer.num_channels, layer.recovery
    if layer.partition.ghost is not None:
        return "ghost batches (ghost=) have no torch module"
    if isinstance(step, RMSScale):
        if kind != "layer" or not layer.tokens:
            return "rms over channels and positions (N,C,*) has no torch module; only channels-last rms does"
        if recovery == "affine":
            return "torch's RMSNorm has no bias"
        return nn.RMSNorm(c, eps=step.eps, elementwise_affine=recovery == "gain")
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


def to_torch(model: nn.Module, example: Tensor | tuple | None = None) -> ToTorchSummary:
    """Replace plain normkit layers by torch's own modules, in place, copying their state.

    bn -> BatchNorm1d/2d/3d (chosen from the rank each layer sees when `example` is given, one
    forward without gradients; BatchNorm2d otherwise), in -> InstanceNorm1d/2d/3d (by that rank or
    the InstanceNorm it was converted from), ln -> LayerNorm (channels-last) or
    GroupNorm(1, C) (N,C,*), gn -> GroupNorm, rms -> RMSNorm (channels-last). Other specs are
    kept and listed with the reason. A model that is itself a NormLayer is returned converted
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
        carry_hooks(layer, new)
        new.train(layer.training)
        if path:
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, name, new)
        else:
            summary.model = new
        summary.replaced.append((path or type(layer).__name__, type(new).__name__))
    return summary
