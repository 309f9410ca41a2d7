"""CIFAR-style ResNet-18/34 (v1, post-activation) as used in the normality-normalization paper.

3x3 stem without max-pooling, BasicBlocks, and a norm in the downsample shortcut. The norm that
ends each block feeds the residual add, not an activation, so post-activation specs such as
`gn+pn` cannot sit there: use the pre-activation models for those.
"""

from __future__ import annotations

from torch import Tensor, nn

from normkit.errors import SpecError
from normkit_lab.models.blocks import ClassifierHead, conv1x1, conv3x3, conv_norm_act
from normkit_lab.models.context import ModelContext

CITATION = ("He, Zhang, Ren & Sun, Deep Residual Learning for Image Recognition, CVPR 2016, "
            "arXiv:1512.03385")


class BasicBlock(nn.Module):
    """conv-norm-ReLU, conv-norm, + shortcut (conv1x1-norm when the shape changes), ReLU."""

    def __init__(self, ctx: ModelContext, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv_act = conv_norm_act(ctx, cin, cout, stride)
        self.conv2 = conv3x3(cout, cout)
        self.norm2 = ctx.norm_layer(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(conv1x1(cin, cout, stride), ctx.norm_layer(cout))
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.norm2(self.conv2(self.conv_act(x)))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, ctx: ModelContext, blocks: tuple[int, ...], width: int) -> None:
        super().__init__()
        self.stem = conv_norm_act(ctx, ctx.in_channels, width)
        stages, cin = [], width
        for i, n in enumerate(blocks):
            cout = width * 2**i
            for j in range(n):
                stages.append(BasicBlock(ctx, cin, cout, stride=2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*stages)
        self.head = ClassifierHead(cin, ctx.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)))


def _check_width(name: str, width: int) -> None:
    if width < 1:
        raise SpecError(f"{name}: width must be >= 1, got {width}")


def resnet18(ctx: ModelContext, width: int = 64) -> nn.Module:
    """ResNet-18 for small images; `width` is the stem width (64 in the paper)."""
    _check_width("resnet18", width)
    ctx.require_downsampling("resnet18", 3)
    return ResNet(ctx, (2, 2, 2, 2), width)


def resnet34(ctx: ModelContext, width: int = 64) -> nn.Module:
    """ResNet-34 for small images; `width` is the stem width (64 in the paper)."""
    _check_width("resnet34", width)
    ctx.require_downsampling("resnet34", 3)
    return ResNet(ctx, (3, 4, 6, 3), width)
