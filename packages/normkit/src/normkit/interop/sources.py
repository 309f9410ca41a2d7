"""The table of norm classes `normkit.convert` knows how to replace, and what each one computes.

An entry reads a source layer into a `Source`: the kind of statistics it computes (its
partition), the layout it sees, its settings, parameters and the activation it applies, so a
conversion can keep all of them. Classes are matched exactly: a subclass with its own forward is
not assumed to compute what its parent does. Plugins (or users) add classes with
`register_source(cls, reader)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from normkit.errors import SpecError

Kind = str  # "batch", "group", "instance", "layer", "rms"


@dataclass
class Source:
    """What a source norm layer computes.

    kind: which values share statistics ("batch", "group", "instance", "layer", "rms").
    channel_dim: 1 for N,C,* inputs, -1 for channels-last tokens N,*,C.
    settings: eps, momentum, groups, affine, track_running_stats as the spec's parameters
        (`eps=None`: torch's RMSNorm default, the machine epsilon of the computing dtype).
    per_position: statistics over the channels at each position of an N,C,* input (LayerNorm2d).
    activation: the module the source applies after its affine (timm norm-act layers), else None.
    state: source state-dict key -> target key, for keys that are not named alike.
    bias: False when the source has a weight but no bias (torch's `bias=False`).
    unbatched_rank: the batched input rank of a source that also takes one sample without its
        batch dim (InstanceNorm1d/2d/3d: 3/4/5), else None.
    frozen: statistics and affine fixed, in training too (FrozenBatchNorm2d).
    gain_offset: the gain is the stored weight plus this (Gemma's `(1 + weight) * x`: 1.0).
    round_before_gain: in half precision the normalized values are rounded to the input's dtype
        before the gain (Hugging Face's Llama family), not after it (torch, Gemma, OLMo 2).
    """

    kind: Kind
    channels: int
    channel_dim: int
    settings: dict[str, Any]
    per_position: bool = False
    activation: nn.Module | None = None
    state: dict[str, str] = field(default_factory=dict)
    bias: bool = True
    unbatched_rank: int | None = None
    frozen: bool = False
    gain_offset: float = 0.0
    round_before_gain: bool = False


Reader = Callable[[nn.Module], Source]
_TABLE: dict[type, Reader] = {}
_NAMED: dict[tuple[str, str], Reader] = {}  # (module prefix, class name) of optional libraries
_TORCH_BASES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm,
                nn.modules.instancenorm._InstanceNorm, nn.RMSNorm)


def register_source(cls: type, reader: Reader) -> None:
    """Teach `convert` a norm class: `reader(module)` returns the `Source` it computes."""
    _TABLE[cls] = reader


def _has_bias(m: nn.Module) -> bool:
    return getattr(m, "weight", None) is None or getattr(m, "bias", None) is not None


def _batch(m: nn.Module) -> Source:
    return Source("batch", m.num_features, 1, {"eps": m.eps, "momentum": m.momentum, "affine": m.affine,
                                               "track_running_stats": m.track_running_stats},
                  activation=_act(m), bias=_has_bias(m))


def _frozen_batch(m: nn.Module) -> Source:
    """FrozenBatchNorm2d (torchvision, timm): eval-mode batch norm whose affine are buffers."""
    return Source("batch", m.weight.shape[0], 1, {"eps": m.eps, "affine": True, "track_running_stats": True},
                  activation=_act(m), frozen=True)


def _instance(m: nn.Module) -> Source:
    if m.track_running_stats:
        raise SpecError(f"{type(m).__name__}(track_running_stats=True): normkit's 'in' keeps no running "
                        "statistics, so eval outputs and the checkpoint would differ")
    rank = {"InstanceNorm1d": 3, "InstanceNorm2d": 4, "InstanceNorm3d": 5}[type(m).__name__]
    return Source("instance", m.num_features, 1, {"eps": m.eps, "affine": m.affine}, bias=_has_bias(m),
                  unbatched_rank=rank)


def _group(m: nn.Module) -> Source:
    return Source("group", m.num_channels, 1, {"eps": m.eps, "groups": m.num_groups, "affine": m.affine},
                  activation=_act(m), bias=_has_bias(m))


def _last_dim(m: nn.Module, what: str) -> int:
    shape = tuple(m.normalized_shape)
    if len(shape) != 1:
        raise SpecError(f"{type(m).__name__} over {shape}): only {what} over the last dim "
                        "(channels-last tokens) is supported; normkit's weights are per channel")
    return shape[0]


def _layer(m: nn.Module) -> Source:
    return Source("layer", _last_dim(m, "LayerNorm"), -1, {"eps": m.eps, "affine": m.elementwise_affine},
                  activation=_act(m), bias=_has_bias(m))


def _layer2d(m: nn.Module) -> Source:
    """LayerNorm2d (timm, torchvision): N,C,H,W normalized over C at each position."""
    return Source("layer", _last_dim(m, "LayerNorm2d"), 1, {"eps": m.eps, "affine": m.elementwise_affine},
                  per_position=True, activation=_act(m), bias=_has_bias(m))


def _hf_convnext_layer(m: nn.Module) -> Source:
    """Hugging Face ConvNextLayerNorm: a LayerNorm on channels-last, or per position of N,C,H,W."""
    return _layer2d(m) if m.data_format == "channels_first" else _layer(m)


def _rms(m: nn.Module) -> Source:
    return Source("rms", _last_dim(m, "RMSNorm"), -1, {"eps": m.eps, "affine": m.elementwise_affine},
                  activation=_act(m))


def _rms2d(m: nn.Module) -> Source:
    """timm RmsNorm2d: N,C,H,W divided by the RMS over C at each position."""
    return Source("rms", _last_dim(m, "RmsNorm2d"), 1, {"eps": m.eps, "affine": m.elementwise_affine},
                  per_position=True, activation=_act(m))


def _hf_rms(m: nn.Module) -> Source:
    """Llama's RMS norm, `weight * (x / sqrt(mean(x^2) + eps)).to(input dtype)`."""
    return Source("rms", m.weight.shape[0], -1, {"eps": m.variance_epsilon, "affine": True},
                  round_before_gain=True)


def _hf_rms_after_gain(m: nn.Module) -> Source:
    """OLMo 2's RMS norm: the gain applied in float32, then rounded (torch's order)."""
    return Source("rms", m.weight.shape[0], -1, {"eps": m.variance_epsilon, "affine": True})


def _hf_gemma_rms(m: nn.Module) -> Source:
    """Gemma's RMS norm: `(x / sqrt(mean(x^2) + eps)) * (1 + weight)` in float32, then rounded."""
    return Source("rms", m.weight.shape[0], -1, {"eps": m.eps, "affine": True}, gain_offset=1.0)


def _hf_olmo_layer(m: nn.Module) -> Source:
    """OLMo's LayerNorm: no weight or bias, eps 1e-5, in float32."""
    return Source("layer", _last_dim(m, "OlmoLayerNorm"), -1, {"eps": 1e-5, "affine": False})


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

# Optional libraries' classes, by module prefix and class name (imported only where installed).
_TIMM = {
    "BatchNormAct2d": _batch, "SyncBatchNormAct": _batch, "FrozenBatchNormAct2d": _frozen_batch,
    "GroupNorm": _group, "GroupNorm1": _group, "GroupNormAct": _group, "GroupNorm1Act": _group,
    "LayerNorm": _layer, "LayerNormFp32": _layer, "LayerNormAct": _layer, "LayerNormActFp32": _layer,
    "LayerNorm2d": _layer2d, "LayerNorm2dFp32": _layer2d, "LayerNormAct2d": _layer2d,
    "LayerNormAct2dFp32": _layer2d,
    "RmsNorm": _rms, "RmsNormFp32": _rms, "RmsNormAct": _rms, "RmsNormActFp32": _rms,
    "RmsNorm2d": _rms2d, "RmsNorm2dFp32": _rms2d, "RmsNormAct2d": _rms2d, "RmsNormAct2dFp32": _rms2d,
}
_HF_LLAMA_RMS = ("LlamaRMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm",
                 "Phi3RMSNorm", "MambaRMSNorm", "T5LayerNorm")
_HF = {**dict.fromkeys(_HF_LLAMA_RMS, _hf_rms), "Olmo2RMSNorm": _hf_rms_after_gain,
       "GemmaRMSNorm": _hf_gemma_rms, "Gemma2RMSNorm": _hf_gemma_rms, "Gemma3RMSNorm": _hf_gemma_rms,
       "OlmoLayerNorm": _hf_olmo_layer, "ConvNextLayerNorm": _hf_convnext_layer,
       "ConvNextV2LayerNorm": _hf_convnext_layer}
for _name, _reader in _TIMM.items():
    _NAMED[("timm.layers.", _name)] = _reader
for _name, _reader in _HF.items():
    _NAMED[("transformers.models.", _name)] = _reader
_NAMED[("torchvision.models.convnext", "LayerNorm2d")] = _layer2d
_NAMED[("torchvision.ops.misc", "FrozenBatchNorm2d")] = _frozen_batch
HF_RMS_NORMS = _HF_LLAMA_RMS  # the Hugging Face classes with Llama's function (docs/convert.md)


def _named_reader(cls: type) -> Reader | None:
    for (prefix, name), reader in _NAMED.items():
        if cls.__name__ == name and cls.__module__.startswith(prefix):
            return reader
    return None


def _plain_subclass_reader(module: nn.Module) -> Reader | None:
    """A known class's reader for a subclass that adds no forward and no submodules of its own."""
    if any(True for _ in module.children()):
        return None
    for base in type(module).__mro__:
        reader = _TABLE.get(base) or _named_reader(base)
        if reader is not None:
            return reader
        if "forward" in vars(base):
            return None
    return None


# Class names that say "norm layer" (BatchNorm2d, LlamaRMSNorm, EvoNorm2dS0, FilterResponseNormTlu2d,
# RmsNormAct2dFp32): `norm` or `normalization` as a word part, not `Normal`/`normalize`.
_NORM_NAME = re.compile(r"(Norm|norm|NORM)(alization|alizer)?(?![a-z])")


def looks_like_norm(module: nn.Module) -> bool:
    """A torch norm subclass, or a module named like a norm that holds no parameterized submodule
    (ConvNormAct and NormMlpClassifierHead are containers; their norms are visited on their own)."""
    if isinstance(module, _TORCH_BASES):
        return True
    cls = type(module)
    if cls.__module__.startswith(("torch.", "normkit")) or not _NORM_NAME.search(cls.__name__):
        return False
    return not any(any(True for _ in child.parameters()) for child in module.children())


def reader_for(module: nn.Module, path: str) -> Reader | None:
    """The table entry for `module`, None when it is not a norm; refuses unknown norm classes."""
    cls = type(module)
    reader = _TABLE.get(cls) or _named_reader(cls) or _plain_subclass_reader(module)
    if reader is not None:
        return reader
    if looks_like_norm(module):
        raise SpecError(
            f"cannot convert {path}: {cls.__module__}.{cls.__name__} is a norm class normkit does not know "
            "(its forward may differ from a known one's); register it with "
            "normkit.register_source(cls, reader) (docs/convert.md)")
    return None
