"""Vision transformer with every norm built from the spec on channels-last tokens.

Norms sit before each sublayer by default (pre-norm, as the paper); `placement=post|peri` and
`qk_norm=True` move or add them as in GPT (models/placement.py).

Token norms use channel_dim=-1, so `ln` normalizes each token and batch-type norms (`bn`, `bnn`)
pool each feature over batch and tokens. The norms feed attention and linear layers, not an
activation, so post-activation specs (`gn+pn`) cannot sit in a ViT.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from normkit.errors import SpecError
from normkit_lab.limits import MAX_MODEL_DEPTH
from normkit_lab.models.attention import SelfAttention
from normkit_lab.models.context import ModelContext
from normkit_lab.models.placement import check_placement, has_final_norm, placed

CITATION = ("Dosovitskiy et al., An Image is Worth 16x16 Words: Transformers for Image Recognition at "
            "Scale, ICLR 2021, arXiv:2010.11929")


def _token_norm(ctx: ModelContext) -> Callable[[int], nn.Module]:
    return lambda width: ctx.norm_layer(width, channel_dim=-1)


class EncoderBlock(nn.Module):
    """Attention and a GELU MLP, each a residual sublayer with its norms at `placement` (pre: x + f(norm(x)))."""

    def __init__(self, ctx: ModelContext, width: int, heads: int, mlp_width: int, placement: str = "pre",
                 qk_norm: bool = False) -> None:
        super().__init__()
        norm = _token_norm(ctx)
        self.placement = placement
        self.norm1 = norm(width)
        self.attn = SelfAttention(width, heads, qk_norm=norm if qk_norm else None)
        self.norm2 = norm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_width), nn.GELU(), nn.Linear(mlp_width, width))
        if placement == "peri":
            self.norm1_out = norm(width)
            self.norm2_out = norm(width)

    def forward(self, x: Tensor) -> Tensor:
        x = placed(self.placement, x, self.attn, self.norm1, getattr(self, "norm1_out", None))
        return placed(self.placement, x, self.mlp, self.norm2, getattr(self, "norm2_out", None))


class ViT(nn.Module):
    """Patch embedding, class token, learned positions, encoder blocks, final norm (pre/peri), linear head."""

    def __init__(self, ctx: ModelContext, patch: int, depth: int, heads: int, width: int,
                 mlp_width: int, placement: str = "pre", qk_norm: bool = False) -> None:
        super().__init__()
        tokens = (ctx.image_size // patch) ** 2
        self.embed = nn.Conv2d(ctx.in_channels, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.zeros(1, tokens + 1, width))
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.trunc_normal_(self.cls, std=0.02)
        self.blocks = nn.Sequential(*(EncoderBlock(ctx, width, heads, mlp_width, placement, qk_norm)
                                      for _ in range(depth)))
        self.norm = ctx.norm_layer(width, channel_dim=-1) if has_final_norm(placement) else nn.Identity()
        self.head = nn.Linear(width, ctx.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.blocks(t))[:, 0])


def vit(ctx: ModelContext, patch: int = 4, depth: int = 8, heads: int = 8, width: int = 768,
        mlp_width: int = 2304, placement: str = "pre", qk_norm: bool = False) -> nn.Module:
    """ViT as in the normality-normalization paper: patch 4, 8 layers, 8 heads, width 768, MLP 2304."""
    for key, value in (("patch", patch), ("depth", depth), ("heads", heads), ("width", width),
                       ("mlp_width", mlp_width)):
        if value < 1:
            raise SpecError(f"vit: {key} must be >= 1, got {value}")
    if depth > MAX_MODEL_DEPTH:
        raise SpecError(f"vit: depth must be at most {MAX_MODEL_DEPTH}, got {depth}")
    if ctx.image_size % patch:
        raise SpecError(f"vit: patch={patch} does not divide the image size {ctx.image_size}; "
                        f"choose a patch that divides it")
    if width % heads:
        raise SpecError(f"vit: width={width} is not divisible by heads={heads}")
    return ViT(ctx, patch, depth, heads, width, mlp_width, check_placement("vit", placement), qk_norm)


def vit_small(ctx: ModelContext, patch: int = 2, depth: int = 2, heads: int = 4, width: int = 64,
              mlp_width: int = 128, placement: str = "pre", qk_norm: bool = False) -> nn.Module:
    """A CPU-sized ViT preset (2 layers, width 64, patch 2) with the same structure as `vit`."""
    return vit(ctx, patch=patch, depth=depth, heads=heads, width=width, mlp_width=mlp_width,
               placement=placement, qk_norm=qk_norm)
