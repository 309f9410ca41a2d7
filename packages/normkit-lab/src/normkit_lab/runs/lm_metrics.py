"""Language-model metrics derived from the mean next-token cross-entropy (in nats).

Bits per byte is the loss in bits for a byte-level model (one token = one byte), the unit that
compares across tokenizers and corpora; perplexity is exp(loss). Both are monotone in the loss,
so lower is better for all three.
"""

from __future__ import annotations

import math

LN2 = math.log(2.0)


def bits_per_token(loss_nats: float) -> float:
    """Mean cross-entropy in bits: loss / ln 2."""
    return loss_nats / LN2


def bits_per_byte(loss_nats: float, bytes_per_token: float = 1.0) -> float:
    """Bits per byte of text: loss / (ln 2 * bytes per token); byte-level models have 1 byte per token."""
    if not bytes_per_token > 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    return loss_nats / (LN2 * bytes_per_token)


def perplexity(loss_nats: float) -> float:
    """exp(loss), inf when the loss is too large to exponentiate."""
    try:
        return math.exp(loss_nats)
    except OverflowError:
        return math.inf
