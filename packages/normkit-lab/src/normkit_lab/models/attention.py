"""Multi-head self-attention for the transformer models (ViT, and GPT with `causal=True`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


class SelfAttention(nn.Module):
    """Multi-head self-attention on channels-last tokens `(N, T, width)`, through torch's
    scaled_dot_product_attention; `causal` masks every position from the positions after it.

    `qk_norm` (QK-norm, as in OLMo 2, Gemma 3, Qwen3, Llama 4): a factory of the norm applied to the
    queries and to the keys of every head over the head's channels, before the dot product (one norm
    for queries and one for keys, shared by the heads, as those models do)."""

    def __init__(self, width: int, heads: int, causal: bool = False,
                 qk_norm: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        if qk_norm is not None:
            self.q_norm = qk_norm(width // heads)
            self.k_norm = qk_norm(width // heads)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))
