"""Whether a model declares itself causal, and whether a norm would pool over its tokens.

A norm whose statistics pool over the tokens of a sequence (batch, group, instance partitions on
tokens) lets position t read later positions through its mean and variance.
"""

from __future__ import annotations

from torch import nn

from normkit.interop.sources import Source
from normkit.layer import NormLayer


def _config_says_causal(model: nn.Module, config: object) -> bool:
    """A Hugging Face config of a decoder, an encoder-decoder, or a causal-LM model type that is not
    also a masked-LM one (`model` is the module holding it, for its class name)."""
    if getattr(config, "is_decoder", False) or getattr(config, "is_encoder_decoder", False):
        return True
    if type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")):
        return True
    try:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        )
    except ImportError:
        return False
    return (config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def _mark(module: nn.Module) -> bool | None:
    """What one module says about causality: a `causal` attribute (normkit's GPT), a Hugging Face
    config, or an attention module's `is_causal`; None when it says nothing."""
    causal = getattr(module, "causal", None)
    if isinstance(causal, bool):
        return causal
    config = getattr(module, "config", None)
    if config is not None and isinstance(getattr(config, "model_type", None), str):
        return _config_says_causal(module, config)
    is_causal = vars(module).get("is_causal")
    return is_causal if isinstance(is_causal, bool) else None


_VISION_LIBRARIES = ("timm.", "torchvision.")


def causality(model: nn.Module) -> bool | None:
    """True when `model`, or any module inside it, says it is causal (a submodule of a causal model
    passed on its own: `llama.model.layers`), False when the model or its parts say they are not or
    it is built from a vision library's modules (timm, torchvision), None when nothing tells."""
    own = _mark(model)
    if own is not None:
        return own
    marks = [_mark(m) for m in model.modules()]
    if True in marks:
        return True
    if False in marks:
        return False
    if any(type(m).__module__.startswith(_VISION_LIBRARIES) for m in model.modules()):
        return False
    return None


def pools_same_values(source: Source, new: nn.Module) -> bool:
    """True when `new` pools its statistics over the values its source already pooled over (a
    BatchNorm1d converted to bn): converting it leaks nothing that the source did not."""
    if not isinstance(new, NormLayer) or new.partition is None or new.partition.kind != source.kind:
        return False
    if new.tokens != (source.channel_dim == -1) or new.per_position != source.per_position:
        return False
    return source.kind != "group" or new.partition.groups == source.settings.get("groups")


def pools_tokens(module: nn.Module) -> str | None:
    """None when each token's output depends on that token only, else why not."""
    if isinstance(module, NormLayer):
        partition = module.partition
        if partition is None or (partition.kind == "layer" and module.tokens):
            return None
        return f"pools statistics over tokens ({partition} partition)"
    if getattr(module, "per_token", False) is True:
        return None
    return f"is built by a plugin factory ({type(module).__name__}) that does not declare per_token = True"
