"""Pre-activation ResNets (v2) and WideResNets, where every activation directly follows a norm.

These host post-activation specs such as `gn+pn` at every norm (proxy-normalization paper); the
final norm + ReLU before global pooling builds proxy norm without scaling.
"""

from __future__ import annotations

from torch import Tensor, nn

from normkit.errors import SpecError
from normkit_lab.limits import MAX_MODEL_DEPTH
from normkit_lab.models.blocks import ClassifierHead, conv1x1, conv3x3, final_norm_act
from normkit_lab.models.context import ModelContext

CITATION = ("He, Zhang, Ren & Sun, Identity Mappings in Deep Residual Networks, ECCV 2016, "
            "arXiv:1603.05027")
WRN_CITATION = "Zagoruyko & Komodakis, Wide Residual Networks, BMVC 2016, arXiv:1605.07146"


class PreActBlock(nn.Module):
    """norm-ReLU, conv, norm-ReLU, conv, + shortcut (conv1x1 of the pre-activated input if needed)."""

    def __init__(self, ctx: ModelContext, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.act1 = ctx.norm_layer(cin, activation="relu")
        self.conv1 = conv3x3(cin, cout, stride)
        self.act2 = ctx.norm_layer(cout, activation="relu")
        self.conv2 = conv3x3(cout, cout)
        self.shortcut = conv1x1(cin, cout, stride) if (stride != 1 or cin != cout) else None

    def forward(self, x: Tensor) -> Tensor:
        pre = self.act1(x)
        skip = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv2(self.act2(self.conv1(pre)))
        return out + skip


class PreActResNet(nn.Module):
    """3x3 stem conv, stages of PreActBlocks, final norm-ReLU, global pooling, linear."""

    def __init__(self, ctx: ModelContext, blocks: tuple[int, ...], widths: tuple[int, ...],
                 stem_width: int) -> None:
        super().__init__()
        self.stem = conv3x3(ctx.in_channels, stem_width)
        stages, cin = [], stem_width
        for i, (n, cout) in enumerate(zip(blocks, widths, strict=True)):
            for j in range(n):
                stages.append(PreActBlock(ctx, cin, cout, stride=2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*stages)
        self.final = final_norm_act(ctx, cin)
        self.head = ClassifierHead(cin, ctx.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.final(self.blocks(self.stem(x))))


def _widths(width: int) -> tuple[int, ...]:
    return (width, 2 * width, 4 * width, 8 * width)


def preact_resnet18(ctx: ModelContext, width: int = 64) -> nn.Module:
    """Pre-activation ResNet-18; `width` is the stem width (64 as in ResNet-18)."""
    if width < 1:
        raise SpecError(f"preact-resnet18: width must be >= 1, got {width}")
    ctx.require_downsampling("preact-resnet18", 3)
    return PreActResNet(ctx, (2, 2, 2, 2), _widths(width), width)


def preact_resnet34(ctx: ModelContext, width: int = 64) -> nn.Module:
    """Pre-activation ResNet-34; `width` is the stem width (64 as in ResNet-34)."""
    if width < 1:
        raise SpecError(f"preact-resnet34: width must be >= 1, got {width}")
    ctx.require_downsampling("preact-resnet34", 3)
    return PreActResNet(ctx, (3, 4, 6, 3), _widths(width), width)


def wide_resnet(ctx: ModelContext, depth: int = 16, width: int = 4) -> nn.Module:
    """WideResNet-depth-width (pre-activation): 3 stages of (depth-4)/6 blocks, 16k/32k/64k channels."""
    if depth < 10 or (depth - 4) % 6 or depth > MAX_MODEL_DEPTH:
        raise SpecError(f"wrn: depth must be 6n+4 with n >= 1 (10, 16, 22, 28, ...) and at most "
                        f"{MAX_MODEL_DEPTH}, got {depth}")
    if width < 1:
        raise SpecError(f"wrn: width (widening factor) must be >= 1, got {width}")
    ctx.require_downsampling("wrn", 2)
    n = (depth - 4) // 6
    return PreActResNet(ctx, (n, n, n), (16 * width, 32 * width, 64 * width), 16)
