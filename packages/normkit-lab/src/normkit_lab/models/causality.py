"""Which norms keep a causal (decoder-only) model causal.

A next-token model may let position t see only positions <= t. Attention is masked for that, but
a norm whose statistics pool over the tokens of a sequence (batch partitions such as bn/bnn pool
over batch and tokens; instance and group partitions pool over each sequence's tokens) mixes
later tokens into the output at t: in training the model can read the future through the norm's
mean and variance, and the loss it reaches is not a real language model's loss.

Safe: a NormLayer whose partition is `layer` on channels-last tokens (statistics per token) and
a NormLayer with no statistics (no partition, e.g. `none`). A norm a plugin builds with its own
factory (not a NormLayer) is of unknown kind and counts as pooling unless its module declares

    per_token = True    # class attribute: the output at each token depends on that token only

(torch's LayerNorm and RMSNorm over the last dim, Identity, and Sequentials of safe modules are
recognized as well).
"""

from __future__ import annotations

from torch import nn

from normkit.layer import NormLayer

_POOLING = {
    "batch": "pools statistics over the batch and the tokens of every sequence",
    "instance": "pools statistics over the tokens of a sequence",
    "group": "pools statistics over the tokens of a sequence",
    "layer": "pools statistics over the whole sequence (channels-first layout)",
}


def token_pooling(module: nn.Module) -> str | None:
    """None when `module`'s output at each token depends on that token only, else why not."""
    if isinstance(module, NormLayer):
        partition = module.partition
        if partition is None or (partition.kind == "layer" and module.tokens):
            return None
        return _POOLING[partition.kind]
    if getattr(module, "per_token", False) is True or isinstance(module, nn.Identity):
        return None
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and len(module.normalized_shape) == 1:
        return None
    if isinstance(module, nn.Sequential) and len(module) > 0:
        reasons = [token_pooling(child) for child in module]
        return next((r for r in reasons if r is not None), None)
    return (f"is a norm of unknown kind ({type(module).__name__}, built by a plugin factory) that does "
            f"not declare per_token = True")
