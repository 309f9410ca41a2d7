"""The table of norm classes `normkit.convert` knows how to replace, and what each one computes.

An entry reads a source layer into a `Source`: the kind of statistics it computes (its
partition), the layout it sees, its settings, parameters and the activation it applies, so a
conversion can keep all of them. Classes are matched exactly: a subclass with its own forward is
not assumed to compute what its parent does. Plugins (or users) add classes with
`register_source(cls, reader)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from normkit.errors import SpecError

Kind = str  # "batch", "group", "instance", "layer", "rms"


@dataclass
class Source:
    """What a source norm layer computes.

    kind: which values share statistics ("batch", "group", "instance", "layer", "rms").
    channel_dim: 1 for N,C,* inputs, -1 for channels-last tokens N,*,C.
    per_position: statistics over the channels at each position of an N,C,* input (LayerNorm2d).
    activation: the module the source applies after its affine (timm norm-act layers), else None.
    state: source state-dict key -> target key, for keys that are not named alike.
    """

    kind: Kind
    channels: int
    channel_dim: int
    settings: dict[str, Any]
    per_position: bool = False
    activation: nn.Module | None = None
    state: dict[str, str] = field(default_factory=dict)


Reader = Callable[[nn.Module], Source]
_TABLE: dict[type, Reader] = {}
_TORCH_BASES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm,
                nn.modules.instancenorm._InstanceNorm, nn.RMSNorm)


def register_source(cls: type, reader: Reader) -> None:
    """Teach `convert` a norm class: `reader(module)` returns the `Source` it computes."""
    _TABLE[cls] = reader


def _batch(m: nn.Module) -> Source:
    return Source("batch", m.num_features, 1, {"eps": m.eps, "momentum": m.momentum, "affine": m.affine,
                                               "track_running_stats": m.track_running_stats},
                  activation=_act(m))


def _instance(m: nn.Module) -> Source:
    return Source("instance", m.num_features, 1, {"eps": m.eps, "affine": m.affine})


def _group(m: nn.Module) -> Source:
    return Source("group", m.num_channels, 1, {"eps": m.eps, "groups": m.num_groups, "affine": m.affine},
                  activation=_act(m))


def _last_dim(m: nn.Module, what: str) -> int:
    shape = tuple(m.normalized_shape)
    if len(shape) != 1:
        raise SpecError(f"{type(m).__name__} over {shape}): only {what} over the last dim "
                        "(channels-last tokens) is supported")
    return shape[0]


def _layer(m: nn.Module) -> Source:
    return Source("layer", _last_dim(m, "LayerNorm"), -1, {"eps": m.eps, "affine": m.elementwise_affine})


def _layer2d(m: nn.Module) -> Source:
    """LayerNorm2d (timm, torchvision): N,C,H,W normalized over C at each position."""
    return Source("layer", _last_dim(m, "LayerNorm2d"), 1, {"eps": m.eps, "affine": m.elementwise_affine},
                  per_position=True)


def _rms(m: nn.Module) -> Source:
    eps = m.eps if m.eps is not None else torch.finfo(torch.float32).eps
    return Source("rms", _last_dim(m, "RMSNorm"), -1, {"eps": eps, "affine": m.elementwise_affine})


def _hf_rms(m: nn.Module) -> Source:
    """Hugging Face RMS norms computing `weight * x / sqrt(mean(x^2) + variance_epsilon)`."""
    return Source("rms", m.weight.shape[0], -1, {"eps": m.variance_epsilon, "affine": True})


def _act(m: nn.Module) -> nn.Module | None:
    """A timm norm-act layer's drop + act modules (None for a plain norm or an identity pair)."""
    act, drop = getattr(m, "act", None), getattr(m, "drop", None)
    parts = [p for p in (drop, act) if isinstance(p, nn.Module) and not isinstance(p, nn.Identity)]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else nn.Sequential(*parts)


for _cls in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm):
    register_source(_cls, _batch)
for _cls in (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d):
    register_source(_cls, _instance)
register_source(nn.GroupNorm, _group)
register_source(nn.LayerNorm, _layer)
register_source(nn.RMSNorm, _rms)

# Hugging Face RMS norms with Llama's function (Gemma's `(1 + weight)` is not, and is refused).
HF_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm",
                "Phi3RMSNorm", "T5LayerNorm")


def _register_libraries() -> None:
    """timm, torchvision and transformers classes, for the libraries that are installed."""
    try:
        from timm.layers import norm as timm_norm
        from timm.layers import norm_act as timm_norm_act
    except ImportError:
        pass
    else:
        register_source(timm_norm_act.BatchNormAct2d, _batch)
        register_source(timm_norm_act.GroupNormAct, _group)
        register_source(timm_norm.LayerNorm, _layer)
        register_source(timm_norm.LayerNorm2d, _layer2d)
        register_source(timm_norm.RmsNorm, _rms)
        register_source(timm_norm.GroupNorm, _group)
    try:
        from torchvision.models.convnext import LayerNorm2d as TvLayerNorm2d
    except ImportError:
        pass
    else:
        register_source(TvLayerNorm2d, _layer2d)


_libraries_loaded = False


def _plain_subclass_reader(module: nn.Module) -> Reader | None:
    """A known class's reader for a subclass that adds no forward and no submodules of its own."""
    if any(True for _ in module.children()):
        return None
    for base in type(module).__mro__:
        if base in _TABLE:
            return _TABLE[base]
        if "forward" in vars(base):
            return None
    return None


def reader_for(module: nn.Module, path: str) -> Reader | None:
    """The table entry for `module`, None when it is not a norm; refuses unknown norm subclasses."""
    global _libraries_loaded
    if not _libraries_loaded:
        _register_libraries()
        _libraries_loaded = True
    cls = type(module)
    if cls in _TABLE:
        return _TABLE[cls]
    inherited = _plain_subclass_reader(module)
    if inherited is not None:
        return inherited
    name = cls.__name__
    if name in HF_RMS_NORMS and cls.__module__.startswith("transformers."):
        return _hf_rms
    if isinstance(module, _TORCH_BASES) or name.lower().endswith("rmsnorm"):
        raise SpecError(
            f"cannot convert {path}: {cls.__module__}.{name} is a norm class normkit does not know (its "
            "forward may differ from its parent's); register it with "
            "normkit.register_source(cls, reader) (docs/convert.md)")
    return None
