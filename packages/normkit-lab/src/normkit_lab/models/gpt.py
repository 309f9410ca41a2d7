"""GPT-style decoder-only transformer over bytes, with every norm built from the spec per token.

Input (N, T) int64 token ids (bytes), output logits (N, T, vocab). Learned positions, tied input
and output embeddings, causal attention through `scaled_dot_product_attention(is_causal=True)`,
GELU MLP, GPT-2 initialization (normal 0.02, residual projections scaled by 1/sqrt(2 depth)).

Norm placement (`placement`, models/placement.py):
- pre (default, GPT-2): x + f(norm(x)) for attention and MLP, a final norm before the head;
- post (original Transformer, GPT-1): norm(x + f(x)), no final norm (the last block ends in one);
- peri (Peri-LN, Kim et al. 2025; "sandwich" in CogView, Gemma 2/3, OLMo 2): x + norm(f(norm(x))), a
  final norm before the head.
`qk_norm=True` adds a norm on the queries and keys of every head (QK-norm), built from the same spec.

Every norm is built on channels-last tokens (channel_dim=-1). Norms whose statistics pool over
the tokens of a sequence would leak future tokens (see models/causality.py); building refuses them
unless `allow_token_pooling=True`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from normkit.errors import SpecError
from normkit_lab.models.attention import SelfAttention
from normkit_lab.models.causality import token_pooling
from normkit_lab.models.context import ModelContext
from normkit_lab.models.placement import check_placement, has_final_norm, placed

CITATION = ("Radford et al., Language Models are Unsupervised Multitask Learners (GPT-2), OpenAI 2019; "
            "Vaswani et al., Attention Is All You Need, NeurIPS 2017, arXiv:1706.03762")
INIT_STD = 0.02


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class DecoderBlock(nn.Module):
    """Attention and MLP sublayers with their norms in `placement` order (see the module doc)."""

    def __init__(self, norm: NormFactory, width: int, heads: int, hidden: int, placement: str,
                 qk_norm: bool) -> None:
        super().__init__()
        self.placement = placement
        self.attn = SelfAttention(width, heads, causal=True, qk_norm=norm if qk_norm else None)
        self.mlp = MLP(width, hidden)
        self.norm1 = norm(width)
        self.norm2 = norm(width)
        if placement == "peri":
            self.norm1_out = norm(width)
            self.norm2_out = norm(width)

    def forward(self, x: Tensor) -> Tensor:
        x = placed(self.placement, x, self.attn, self.norm1, getattr(self, "norm1_out", None))
        return placed(self.placement, x, self.mlp, self.norm2, getattr(self, "norm2_out", None))


class NormFactory:
    """Builds the model's token norms from the spec and refuses norms that break causality."""

    def __init__(self, ctx: ModelContext, model_name: str, allow_token_pooling: bool) -> None:
        self.ctx = ctx
        self.model_name = model_name
        self.allow = allow_token_pooling

    def __call__(self, width: int) -> nn.Module:
        layer = self.ctx.norm_layer(width, channel_dim=-1)
        reason = None if self.allow else token_pooling(layer)
        if reason is not None:
            raise SpecError(
                f"{self.model_name} is causal: {self.ctx.norm!r} {reason} and would leak future tokens; "
                f"use a per-token norm (ln, rms, lnn, dyt) or pass --model-param allow_token_pooling=true")
        return layer


class GPT(nn.Module):
    """Token and position embeddings, decoder blocks, final norm (pre/peri), tied head."""

    causal = True  # normkit.convert refuses token-pooling norms here unless told causal=False

    def __init__(self, norm: NormFactory, vocab: int, context: int, width: int, depth: int, heads: int,
                 hidden: int, placement: str, qk_norm: bool = False) -> None:
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(DecoderBlock(norm, width, heads, hidden, placement, qk_norm)
                                      for _ in range(depth)))
        self.norm = norm(width) if has_final_norm(placement) else nn.Identity()
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied embeddings
        self._init(depth)

    def _init(self, depth: int) -> None:
        """GPT-2's: linear and embedding weights N(0, 0.02), the residual projections' (`proj`, the
        last layer of each sublayer) scaled by 1/sqrt(2 depth), biases zero; norms keep their own."""
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and module is not self.head:  # head: tied
                scale = 1 / math.sqrt(2 * depth) if name.endswith(".proj") else 1.0
                nn.init.normal_(module.weight, std=INIT_STD * scale)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"GPT takes token ids of shape (N, T), got {tuple(idx.shape)} {idx.dtype}")
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens is longer than the context ({self.context})")
        positions = torch.arange(t, device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(positions))
        return self.head(self.norm(x))


def gpt(ctx: ModelContext, width: int = 64, depth: int = 2, heads: int = 4, mlp_ratio: float = 4.0,
        context: int = 128, placement: str = "pre", qk_norm: bool = False,
        allow_token_pooling: bool = False) -> nn.Module:
    """A decoder-only transformer over the dataset's vocabulary (256 for byte-level text)."""
    return build_gpt("gpt", ctx, width, depth, heads, mlp_ratio, context, placement, qk_norm, allow_token_pooling)


def build_gpt(name: str, ctx: ModelContext, width: int, depth: int, heads: int, mlp_ratio: float,
              context: int, placement: str, qk_norm: bool, allow_token_pooling: bool) -> nn.Module:
    """`gpt` under the name its error messages use (the preset's)."""
    for key, value in (("width", width), ("depth", depth), ("heads", heads), ("context", context)):
        if value < 1:
            raise SpecError(f"{name}: {key} must be >= 1, got {value}")
    if not (math.isfinite(mlp_ratio) and mlp_ratio > 0):
        raise SpecError(f"{name}: mlp_ratio must be a number > 0, got {mlp_ratio}")
    if width % heads:
        raise SpecError(f"{name}: width={width} is not divisible by heads={heads}")
    placement = check_placement(name, placement)
    if ctx.image_size > context:
        raise SpecError(f"{name}: the dataset's sequences have {ctx.image_size} tokens, more than "
                        f"context={context}; pass --model-param context={ctx.image_size} or a shorter "
                        f"--dataset-param seq_len")
    norm = NormFactory(ctx, name, allow_token_pooling)
    return GPT(norm, ctx.num_classes, context, width, depth, heads, max(1, round(width * mlp_ratio)),
               placement, qk_norm)


def gpt_tiny(ctx: ModelContext, width: int = 64, depth: int = 2, heads: int = 4, mlp_ratio: float = 4.0,
             context: int = 128, placement: str = "pre", qk_norm: bool = False,
             allow_token_pooling: bool = False) -> nn.Module:
    """CPU preset: width 64, 2 layers, 4 heads, context 128 (about 0.1M parameters)."""
    return build_gpt("gpt-tiny", ctx, width, depth, heads, mlp_ratio, context, placement, qk_norm,
                     allow_token_pooling)


def gpt2_small(ctx: ModelContext, width: int = 768, depth: int = 12, heads: int = 12, mlp_ratio: float = 4.0,
               context: int = 1024, placement: str = "pre", qk_norm: bool = False,
               allow_token_pooling: bool = False) -> nn.Module:
    """GPT-2 small (124M with GPT-2's 50257 tokens; 86M with 256 bytes): width 768, 12 layers, 12 heads."""
    return build_gpt("gpt2-small", ctx, width, depth, heads, mlp_ratio, context, placement, qk_norm,
                     allow_token_pooling)
