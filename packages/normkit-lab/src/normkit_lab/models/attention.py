"""Multi-head self-attention for the transformer models (ViT, and GPT with `causal=True`)."""

from __future__ import annotations

from torch import Tensor, nn


class SelfAttention(nn.Module):
    """Multi-head self-attention on channels-last tokens `(N, T, width)`, through torch's
    scaled_dot_product_attention; `causal` masks every position from the positions after it."""

    def __init__(self, width: int, heads: int, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))
