"""`normkit.fold`: fold eval-mode norms that are a fixed per-channel affine into the conv/linear
before them, for deployment (one op fewer per norm, the same function up to rounding)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from normkit.errors import NormkitError, first_line
from normkit.interop.input_ranks import input_ranks
from normkit.interop.trace import NormTracer, is_norm_module
from normkit.layer import NormLayer

_TORCH_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm)
_FOLDS_INTO = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass
class FoldSummary:
    """What `fold` did: `folded` as (norm path, conv/linear path), `kept` as (norm path, why)."""

    model: nn.Module
    folded: list[tuple[str, str]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"folded {len(self.folded)} norm(s), kept {len(self.kept)}"]
        lines += [f"  folded {norm} into {into}" for norm, into in self.folded]
        lines += [f"  kept {norm}: {why}" for norm, why in self.kept]
        return "\n".join(lines)


def _torch_eval_affine(norm: nn.Module) -> tuple[Tensor, Tensor] | str:
    """torch's BatchNorm in eval with running statistics is `x * scale + shift`; other torch norms
    normalize each sample by its own statistics."""
    if not isinstance(norm, nn.modules.batchnorm._BatchNorm):
        return "uses per-sample statistics"
    if norm.training:
        return "in training mode (call model.eval() first)"
    if norm.running_var is None:
        return "has no running statistics (track_running_stats=False)"
    scale = torch.rsqrt(norm.running_var.double() + norm.eps)
    shift = -norm.running_mean.double() * scale
    if norm.weight is not None:
        scale, shift = scale * norm.weight.double(), shift * norm.weight.double()
    if norm.bias is not None:
        shift = shift + norm.bias.double()
    return scale, shift


def _eval_affine(norm: nn.Module) -> tuple[Tensor, Tensor] | str:
    if isinstance(norm, NormLayer):
        return norm.eval_affine(before_activation=True)
    if isinstance(norm, _TORCH_NORMS):
        return _torch_eval_affine(norm)
    return f"{type(norm).__name__} is not a fixed per-channel affine in eval"


_RESHAPE_METHODS = ("flatten", "reshape", "view")
_RESHAPE_FUNCTIONS = (torch.flatten, torch.reshape)
_SHAPE_METHODS = ("reshape_as", "view_as", "expand_as")  # read their argument's shape only


def _is_reshape(node: torch.fx.Node) -> bool:
    return ((node.op == "call_method" and node.target in _RESHAPE_METHODS)
            or (node.op == "call_function" and node.target in _RESHAPE_FUNCTIONS))


def _value_users(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The users of `node` that read its values (LeViT's `.reshape_as(x)` reads only x's shape)."""
    return [user for user in node.users
            if not (user.op == "call_method" and user.target in _SHAPE_METHODS and user.args[0] is not node)
            and not (user.op == "call_function" and user.target is getattr and user.args[1] == "shape")]


def _producer(norm_node: torch.fx.Node, modules: dict[str, nn.Module],
              calls: dict[str, int]) -> tuple[str, nn.Module] | str:
    """The conv/linear whose output only this norm reads (through reshapes that the caller checks
    keep the features last: LeViT's `bn(linear(x).flatten(0, 1))`), or why there is none."""
    src = norm_node.args[0] if norm_node.args else None
    reshaped = False
    while isinstance(src, torch.fx.Node) and _is_reshape(src) and len(src.users) == 1:
        src, reshaped = src.args[0], True
    if not isinstance(src, torch.fx.Node):
        return "no conv/linear right before it"
    if src.op != "call_module":
        what = "the model input" if src.op == "placeholder" else getattr(src.target, "__name__", str(src.target))
        return f"no conv/linear right before it (its input comes from {what})"
    module = modules[src.target]
    if type(module) not in _FOLDS_INTO:
        return f"no conv/linear right before it (its input comes from {type(module).__name__} {src.target})"
    if len(_value_users(src)) != 1:
        return f"{src.target}'s output is also used elsewhere"
    if calls[src.target] != 1:
        return f"{src.target} is called more than once"
    if reshaped and not isinstance(module, nn.Linear):
        return f"its input is {src.target}'s output reshaped, which moves a conv's channels"
    return src.target, module


def _consumer(norm_node: torch.fx.Node, modules: dict[str, nn.Module],
              calls: dict[str, int]) -> tuple[str, nn.Linear] | None:
    """The Linear that alone reads this norm's output (past eval dropouts: LeViT's head
    `linear(drop(bn(x)))`), called once, else None."""
    node = norm_node
    while len(node.users) == 1:
        user = next(iter(node.users))
        module = modules.get(user.target) if user.op == "call_module" else None
        if isinstance(module, (nn.Dropout, nn.Identity)) and not module.training:
            node = user
            continue
        if type(module) is nn.Linear and calls[user.target] == 1 and user.args[0] is node:
            return user.target, module
        return None
    return None


def _fold_before(layer: nn.Linear, scale: Tensor, shift: Tensor) -> None:
    """layer(x * scale + shift) as one Linear, computed in float64 and stored in place."""
    with torch.no_grad():
        w = layer.weight.double()
        b = layer.bias.double() if layer.bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
        new_bias = (b + w @ shift).to(layer.weight.dtype)
        layer.weight.copy_((w * scale.view(1, -1)).to(layer.weight.dtype))
        if layer.bias is None:
            layer.bias = nn.Parameter(new_bias)
        else:
            layer.bias.copy_(new_bias)


def _channels_match(norm: nn.Module, layer: nn.Module, channels: int, rank: int | None) -> str | None:
    out = layer.out_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer.out_features
    if out != channels:
        return f"its {channels} channels are not the {out} outputs of the layer before it"
    tokens = isinstance(norm, NormLayer) and (norm.tokens and not norm.per_position)
    if tokens and not isinstance(layer, nn.Linear):
        return "channels-last norm after a channels-first conv"
    if isinstance(layer, nn.Linear) and not tokens and rank != 2:
        # Linear writes features last; a channels-first norm reads dim 1, the same axis only on N,C inputs
        return ("a channels-first norm after a Linear normalizes dim 1, the Linear's outputs only on "
                f"(N, C) inputs ({'pass fold(model, example) to check' if rank is None else f'it sees {rank} dims'})")
    return None


def _input_matches(norm: nn.Module, layer: nn.Linear, channels: int, rank: int | None) -> str | None:
    """Why a norm cannot fold into the Linear after it: the Linear reads the last dim."""
    if layer.in_features != channels:
        return f"its {channels} channels are not the {layer.in_features} inputs of the linear after it"
    if isinstance(norm, NormLayer) and norm.tokens and not norm.per_position:
        return None
    if rank == 2:
        return None
    return ("a channels-first norm before a Linear folds into it only on (N, C) inputs "
            f"({'pass fold(model, example) to check' if rank is None else f'it sees {rank} dims'})")


def _fold_into(layer: nn.Module, scale: Tensor, shift: Tensor) -> None:
    """layer(x) * scale + shift, per output channel, computed in float64 and stored in place."""
    with torch.no_grad():
        w = layer.weight
        w.copy_((w.double() * scale.view(-1, *([1] * (w.dim() - 1)))).to(w.dtype))
        b = layer.bias.double() if layer.bias is not None else torch.zeros_like(shift)
        new_bias = (b * scale + shift).to(w.dtype)
        if layer.bias is None:
            layer.bias = nn.Parameter(new_bias)
        else:
            layer.bias.copy_(new_bias)


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent_path) if parent_path else model, name, module)


def fold(model: nn.Module, example: Tensor | tuple | None = None) -> FoldSummary:
    """Fold every foldable norm into the conv/linear before it, in place, and say what was kept.

    Foldable: a norm that is exactly a per-channel affine in eval (bn, brn and other batch norms
    with running statistics, torch's BatchNorm), whose input is the output of a Conv1d/2d/3d or
    Linear that nothing else reads (its shape aside: LeViT's `bn(linear(x).flatten(0, 1)).reshape_as(x)`);
    after a Linear also through flatten/reshape/view, which keep its features last when the norm
    sees (N, C). A norm with no conv/linear before it folds into the Linear that alone reads its
    output (past eval dropouts: LeViT's heads). Folded norms become nn.Identity, or their
    activation module when they apply one after the affine (`activation=`, a converted timm
    BatchNormAct2d); a post-activation stage (`+pn`) is not foldable. A channels-first norm next
    to a Linear folds only when `example` (one forward, no gradients) shows it sees (N, C)
    inputs: on N,C,L it normalizes another axis than the Linear's features.
    Call `model.eval()` first. The model must trace with torch.fx (normkit's norms are leaves).
    """
    modules = dict(model.named_modules())
    try:
        graph = NormTracer().trace(model)
    except Exception as exc:  # a model fx cannot trace (data-dependent Python control flow)
        raise NormkitError(f"fold: torch.fx cannot trace {type(model).__name__} ({first_line(exc)}); "
                           "fold the norms of its traceable submodules instead") from None
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    ranks = {} if example is None else input_ranks(
        model, example, lambda m: is_norm_module(m) or isinstance(m, _TORCH_NORMS))
    summary = FoldSummary(model)
    seen = set()
    for node in graph.nodes:
        if node.op != "call_module" or node.target in seen:
            continue
        norm = modules[node.target]
        if not (is_norm_module(norm) or isinstance(norm, _TORCH_NORMS)):
            continue
        seen.add(node.target)
        affine = _eval_affine(norm)
        if isinstance(affine, str):
            summary.kept.append((node.target, affine))
            continue
        if calls[node.target] != 1:
            summary.kept.append((node.target, "is called more than once"))
            continue
        if norm._forward_hooks or norm._forward_pre_hooks:
            summary.kept.append((node.target, "has forward hooks, which folding it away would drop"))
            continue
        producer = _producer(node, modules, calls)
        consumer = _consumer(node, modules, calls) if isinstance(producer, str) else None
        if consumer is not None and not (isinstance(norm, NormLayer) and norm.has_activation):
            mismatch = _input_matches(norm, consumer[1], affine[0].numel(), ranks.get(node.target))
            if mismatch is None:
                _fold_before(consumer[1], *affine)
                _set(model, node.target, nn.Identity())
                summary.folded.append((node.target, consumer[0]))
                continue
            producer = mismatch
        if isinstance(producer, str):
            summary.kept.append((node.target, producer))
            continue
        layer_path, layer = producer
        mismatch = _channels_match(norm, layer, affine[0].numel(), ranks.get(node.target))
        if mismatch:
            summary.kept.append((node.target, mismatch))
            continue
        _fold_into(layer, *affine)
        keeps_act = isinstance(norm, NormLayer) and norm.has_activation
        _set(model, node.target, norm.act if keeps_act else nn.Identity())
        summary.folded.append((node.target, layer_path))
    return summary
