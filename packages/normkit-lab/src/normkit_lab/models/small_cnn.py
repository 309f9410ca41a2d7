"""`small-cnn`: a few conv-norm-ReLU blocks, the bundled default that trains in seconds on CPU."""

from __future__ import annotations

from torch import Tensor, nn

from normkit.errors import SpecError
from normkit_lab.limits import MAX_MODEL_DEPTH
from normkit_lab.models.blocks import ClassifierHead, conv3x3, conv_norm_act, final_norm_act
from normkit_lab.models.context import ModelContext


class SmallCNN(nn.Module):
    """Blocks of conv3x3 -> norm -> ReLU; every norm is followed by an activation, so `gn+pn` fits.

    The first block keeps the resolution, the second halves it and doubles the width, the rest
    keep both (8x8 digits: 8x8 -> 4x4), then global average pooling and a linear layer. The last
    norm feeds the pooling, so proxy norm there runs without scaling (as in the paper).
    """

    def __init__(self, ctx: ModelContext, width: int, depth: int) -> None:
        super().__init__()
        layers, cin = [], ctx.in_channels
        for i in range(depth):
            cout = width if i == 0 else 2 * width
            stride = 2 if i == 1 else 1
            if i == depth - 1:  # feeds global pooling: proxy norm without scaling
                layers.append(nn.Sequential(conv3x3(cin, cout, stride), final_norm_act(ctx, cout)))
            else:
                layers.append(conv_norm_act(ctx, cin, cout, stride))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = ClassifierHead(cin, ctx.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def small_cnn(ctx: ModelContext, width: int = 32, depth: int = 3) -> nn.Module:
    """A small conv net for tiny images (8x8 digits) that trains in about a second per epoch on CPU."""
    if width < 1 or not 1 <= depth <= MAX_MODEL_DEPTH:
        raise SpecError(f"small-cnn: need width >= 1 and depth in [1, {MAX_MODEL_DEPTH}], got width={width}, "
                        f"depth={depth}")
    ctx.require_downsampling("small-cnn", 1 if depth > 1 else 0)
    return SmallCNN(ctx, width, depth)
