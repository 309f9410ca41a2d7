"""Whether a model declares itself causal, and whether a norm would pool over its tokens.

A norm whose statistics pool over the tokens of a sequence (batch, group, instance partitions on
tokens) lets position t read later positions through its mean and variance.
"""

from __future__ import annotations

from torch import nn

from normkit.layer import NormLayer


def declares_causal(model: nn.Module) -> bool:
    """True for a model with `causal = True` (normkit's GPT) or a causal Hugging Face model."""
    if getattr(model, "causal", False) is True:
        return True
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type"):
        return False
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
