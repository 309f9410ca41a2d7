"""Building blocks shared by the convolutional models: conv followed by a norm that owns its activation."""

from __future__ import annotations

from torch import Tensor, nn

from normkit_lab.models.context import ModelContext


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


def conv_norm_act(ctx: ModelContext, cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    """conv3x3 -> norm -> ReLU, the ReLU owned by the norm layer (so `+pn` can take it over)."""
    return nn.Sequential(conv3x3(cin, cout, stride), ctx.norm_layer(cout, activation="relu"))


def final_norm_act(ctx: ModelContext, channels: int) -> nn.Module:
    """The norm + ReLU right before global pooling (pre-activation nets).

    Proxy norm drops its scaling here (paper: output z - mu~ only), so when the spec's
    post-activation step declares `scale`, this position builds it with scale=false.
    """
    overrides = {"scale": False} if ctx.post_activation_declares("scale") else {}
    return ctx.norm_layer(channels, activation="relu", **overrides)


class ClassifierHead(nn.Module):
    """Global average pooling and a linear classifier."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.mean(dim=(2, 3)))
