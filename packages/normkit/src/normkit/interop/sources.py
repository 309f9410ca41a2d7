"""The table of norm classes `normkit.convert` knows how to replace, and what each one computes.

An entry reads a source layer into a `Source`: the kind of statistics it computes (its
partition), the layout it sees, its settings, parameters and the activation it applies, so a
conversion can keep all of them. Classes are matched exactly: a subclass with its own forward is
not assumed to compute what its parent does, while a class whose code repeats a known class's under
another name (Hugging Face's copies of `LlamaRMSNorm`) is read as that class. Plugins (or users) add
classes with `register_source(cls, reader)`, using the public `read_*` readers or their own, and
mark norm-named classes that are not norms to replace with `register_not_norm(cls)`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from normkit.errors import SpecError
from normkit.interop.clones import same_code, same_forward

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
_NOT_NORMS: set[type] = set()
_TORCH_BASES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm,
                nn.modules.instancenorm._InstanceNorm, nn.RMSNorm)


def register_source(cls: type, reader: Reader) -> None:
    """Teach `convert` a norm class: `reader(module)` returns the `Source` it computes (one of the
    `read_*` readers of `normkit.interop`, or your own)."""
    _NOT_NORMS.discard(cls)
    _TABLE[cls] = reader


def register_not_norm(cls: type) -> None:
    """Tell `convert` that `cls` is not a norm to replace (timm's GlobalResponseNorm): it is left as
    it is, with its submodules, and listed in the summary's `left`."""
    _TABLE.pop(cls, None)
    _NOT_NORMS.add(cls)


def _has_bias(m: nn.Module) -> bool:
    return getattr(m, "weight", None) is None or getattr(m, "bias", None) is not None


def read_batch_norm(m: nn.Module) -> Source:
    """torch's BatchNorm1d/2d/3d and SyncBatchNorm, timm's BatchNormAct2d (with its activation)."""
    return Source("batch", m.num_features, 1, {"eps": m.eps, "momentum": m.momentum, "affine": m.affine,
                                               "track_running_stats": m.track_running_stats},
                  activation=_act(m), bias=_has_bias(m))


def read_frozen_batch_norm(m: nn.Module) -> Source:
    """FrozenBatchNorm2d (torchvision, timm): eval-mode batch norm whose affine are buffers."""
    return Source("batch", m.weight.shape[0], 1, {"eps": m.eps, "affine": True, "track_running_stats": True},
                  activation=_act(m), frozen=True)


def read_instance_norm(m: nn.Module) -> Source:
    """torch's InstanceNorm1d/2d/3d (which also take one sample without its batch dim)."""
    if m.track_running_stats:
        raise SpecError(f"{type(m).__name__}(track_running_stats=True): normkit's 'in' keeps no running "
                        "statistics, so eval outputs and the checkpoint would differ")
    return Source("instance", m.num_features, 1, {"eps": m.eps, "affine": m.affine}, bias=_has_bias(m),
                  unbatched_rank=m._get_no_batch_dim() + 1)


def read_group_norm(m: nn.Module) -> Source:
    """torch's GroupNorm (`num_groups`, `num_channels`, `eps`, `affine`), timm's GroupNorm(Act)."""
    return Source("group", m.num_channels, 1, {"eps": m.eps, "groups": m.num_groups, "affine": m.affine},
                  activation=_act(m), bias=_has_bias(m))


def _last_dim(m: nn.Module, what: str) -> int:
    shape = tuple(m.normalized_shape)
    if len(shape) != 1:
        raise SpecError(f"{type(m).__name__} over {shape}): only {what} over the last dim "
                        "(channels-last tokens) is supported; normkit's weights are per channel")
    return shape[0]


def read_layer_norm(m: nn.Module) -> Source:
    """torch's LayerNorm over the last dim (`normalized_shape`, `eps`, `elementwise_affine`), timm's."""
    return Source("layer", _last_dim(m, "LayerNorm"), -1, {"eps": m.eps, "affine": m.elementwise_affine},
                  activation=_act(m), bias=_has_bias(m))


def read_layer_norm_2d(m: nn.Module) -> Source:
    """LayerNorm2d (timm, torchvision): N,C,H,W normalized over C at each position."""
    return Source("layer", _last_dim(m, "LayerNorm2d"), 1, {"eps": m.eps, "affine": m.elementwise_affine},
                  per_position=True, activation=_act(m), bias=_has_bias(m))


def read_hf_convnext_layer_norm(m: nn.Module) -> Source:
    """Hugging Face ConvNextLayerNorm: a LayerNorm on channels-last, or per position of N,C,H,W."""
    return read_layer_norm_2d(m) if m.data_format == "channels_first" else read_layer_norm(m)


def read_rms_norm(m: nn.Module) -> Source:
    """torch's RMSNorm over the last dim (`normalized_shape`, `eps`, `elementwise_affine`), timm's RmsNorm."""
    return Source("rms", _last_dim(m, "RMSNorm"), -1, {"eps": m.eps, "affine": m.elementwise_affine},
                  activation=_act(m))


def read_rms_norm_2d(m: nn.Module) -> Source:
    """timm RmsNorm2d: N,C,H,W divided by the RMS over C at each position."""
    return Source("rms", _last_dim(m, "RmsNorm2d"), 1, {"eps": m.eps, "affine": m.elementwise_affine},
                  per_position=True, activation=_act(m))


def read_llama_rms_norm(m: nn.Module) -> Source:
    """Llama's RMS norm (`weight`, `variance_epsilon`), `weight * (x / sqrt(mean(x^2) + eps)).to(dtype)`:
    in half precision the normalized values are rounded before the gain."""
    return Source("rms", m.weight.shape[0], -1, {"eps": m.variance_epsilon, "affine": True},
                  round_before_gain=True)


def read_olmo2_rms_norm(m: nn.Module) -> Source:
    """OLMo 2's RMS norm (`weight`, `variance_epsilon`): the gain applied in float32, then rounded."""
    return Source("rms", m.weight.shape[0], -1, {"eps": m.variance_epsilon, "affine": True})


def read_gemma_rms_norm(m: nn.Module) -> Source:
    """Gemma's RMS norm (`weight`, `eps`): `(x / sqrt(mean(x^2) + eps)) * (1 + weight)` in float32."""
    return Source("rms", m.weight.shape[0], -1, {"eps": m.eps, "affine": True}, gain_offset=1.0)


def read_olmo_layer_norm(m: nn.Module) -> Source:
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
    register_source(_cls, read_batch_norm)
for _cls in (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d):
    register_source(_cls, read_instance_norm)
register_source(nn.GroupNorm, read_group_norm)
register_source(nn.LayerNorm, read_layer_norm)
register_source(nn.RMSNorm, read_rms_norm)

# Optional libraries' classes by (module, class name), imported only to compare code with a clone.
_TIMM = {
    "BatchNormAct2d": read_batch_norm, "SyncBatchNormAct": read_batch_norm,
    "FrozenBatchNormAct2d": read_frozen_batch_norm,
    "GroupNorm": read_group_norm, "GroupNorm1": read_group_norm, "GroupNormAct": read_group_norm,
    "GroupNorm1Act": read_group_norm,
    "LayerNorm": read_layer_norm, "LayerNormFp32": read_layer_norm, "LayerNormAct": read_layer_norm,
    "LayerNormActFp32": read_layer_norm,
    "LayerNorm2d": read_layer_norm_2d, "LayerNorm2dFp32": read_layer_norm_2d,
    "LayerNormAct2d": read_layer_norm_2d, "LayerNormAct2dFp32": read_layer_norm_2d,
    "RmsNorm": read_rms_norm, "RmsNormFp32": read_rms_norm, "RmsNormAct": read_rms_norm,
    "RmsNormActFp32": read_rms_norm,
    "RmsNorm2d": read_rms_norm_2d, "RmsNorm2dFp32": read_rms_norm_2d, "RmsNormAct2d": read_rms_norm_2d,
    "RmsNormAct2dFp32": read_rms_norm_2d,
}
# Hugging Face class -> (model folder, reader); the first of each code is the one refusals name.
_HF = {
    "LlamaRMSNorm": ("llama", read_llama_rms_norm), "MistralRMSNorm": ("mistral", read_llama_rms_norm),
    "MixtralRMSNorm": ("mixtral", read_llama_rms_norm), "Qwen2RMSNorm": ("qwen2", read_llama_rms_norm),
    "Qwen3RMSNorm": ("qwen3", read_llama_rms_norm), "Phi3RMSNorm": ("phi3", read_llama_rms_norm),
    "MambaRMSNorm": ("mamba", read_llama_rms_norm), "T5LayerNorm": ("t5", read_llama_rms_norm),
    "Olmo2RMSNorm": ("olmo2", read_olmo2_rms_norm), "GemmaRMSNorm": ("gemma", read_gemma_rms_norm),
    "Gemma2RMSNorm": ("gemma2", read_gemma_rms_norm), "Gemma3RMSNorm": ("gemma3", read_gemma_rms_norm),
    "OlmoLayerNorm": ("olmo", read_olmo_layer_norm),
    "ConvNextLayerNorm": ("convnext", read_hf_convnext_layer_norm),
    "ConvNextV2LayerNorm": ("convnextv2", read_hf_convnext_layer_norm),
}
HF_RMS_NORMS = tuple(n for n, (_, r) in _HF.items() if r is read_llama_rms_norm)  # docs/convert.md

# (module to import, class name, module prefix a class must come from, reader)
_NAMED: list[tuple[str, str, str, Reader]] = [
    *(("timm.layers", name, "timm.layers.", reader) for name, reader in _TIMM.items()),
    *((f"transformers.models.{folder}.modeling_{folder}", name, "transformers.models.", reader)
      for name, (folder, reader) in _HF.items()),
    ("torchvision.models.convnext", "LayerNorm2d", "torchvision.models.convnext", read_layer_norm_2d),
    ("torchvision.ops.misc", "FrozenBatchNorm2d", "torchvision.ops.misc", read_frozen_batch_norm),
]
# Norm-named classes that are not norms to replace: timm's GlobalResponseNorm (ConvNeXt-V2) is a
# gated response scaling inside the MLP; Hugging Face's ConvNextV2GRN, the same code, is not norm-named.
_NAMED_NOT_NORMS = {("timm.layers.", "GlobalResponseNorm")}


def _named_reader(cls: type) -> Reader | None:
    for _, name, prefix, reader in _NAMED:
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


@functools.cache
def _known_classes() -> dict[type, Reader]:
    """Every class normkit reads whose library is installed, imported (for code comparison)."""
    known = dict(_TABLE)
    for module_name, name, _, reader in _NAMED:
        if importlib.util.find_spec(module_name.partition(".")[0]) is None:
            continue
        try:
            cls = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):  # another version of the library
            continue
        known.setdefault(cls, reader)
    return known


def clone_of(cls: type) -> type | None:
    """The class normkit reads whose code `cls` repeats under another name (`Qwen3MoeRMSNorm` ->
    `LlamaRMSNorm`), None when there is none. Registered classes count too."""
    known = {**_known_classes(), **_TABLE}
    return same_code(cls, list(known))


def _clone_reader(cls: type) -> Reader | None:
    twin = clone_of(cls)
    if twin is None:
        return None
    return _TABLE.get(twin) or _named_reader(twin) or _known_classes()[twin]


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


def is_not_norm(module: nn.Module) -> bool:
    """True for a class registered with `register_not_norm` (or one normkit leaves by default)."""
    cls = type(module)
    if cls in _NOT_NORMS:
        return True
    return any(cls.__name__ == name and cls.__module__.startswith(prefix) for prefix, name in _NAMED_NOT_NORMS)


def reader_for(module: nn.Module, path: str) -> Reader | None:
    """The table entry for `module`, None when it is not a norm; refuses unknown norm classes."""
    cls = type(module)
    reader = _TABLE.get(cls) or _named_reader(cls) or _plain_subclass_reader(module)
    if reader is not None:
        return reader
    if not looks_like_norm(module):
        return None
    reader = _clone_reader(cls)
    if reader is not None:
        return reader
    twin = same_forward(cls, list({**_known_classes(), **_TABLE}))
    hint = ""
    if twin is not None:
        hint = (f"; its forward is the code of {twin.__module__}.{twin.__name__}, its other methods differ: if it "
                "stores what that class stores, register it with normkit.register_source(cls, "
                f"normkit.interop.{_known_classes()[twin].__name__})")
    raise SpecError(
        f"cannot convert {path}: {cls.__module__}.{cls.__name__} is a norm class normkit does not know "
        "(its forward may differ from a known one's); register it with "
        "normkit.register_source(cls, reader), or leave it as it is with leave= or "
        f"normkit.register_not_norm(cls) (docs/convert.md){hint}")
