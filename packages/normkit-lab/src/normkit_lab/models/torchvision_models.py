"""torchvision's ImageNet ResNets with every BatchNorm swapped for the spec by `normkit.convert`.

convert can only hand an activation to a norm when the activation directly follows it in an
nn.Sequential, which torchvision's blocks do not do; post-activation specs therefore fail there.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

import normkit
from normkit_lab.models.context import MissingActivation, ModelContext, NormHostError

CITATION = ("He, Zhang, Ren & Sun, Deep Residual Learning for Image Recognition, CVPR 2016, "
            "arXiv:1512.03385 (torchvision implementation)")


def _converted(ctx: ModelContext, builder: Callable[..., nn.Module]) -> nn.Module:
    model = builder(weights=None, num_classes=ctx.num_classes)
    if ctx.in_channels != 3:
        old = model.conv1
        model.conv1 = nn.Conv2d(ctx.in_channels, old.out_channels, old.kernel_size, old.stride,
                                old.padding, bias=False)
    try:
        normkit.convert(model, ctx.norm)
    except normkit.SpecError as exc:
        error = MissingActivation if ctx.has_stage("activation", "post_activation") else NormHostError
        raise error(str(exc)) from exc
    return model


def tv_resnet18(ctx: ModelContext) -> nn.Module:
    """torchvision resnet18 (ImageNet stem), random init, norms converted to the spec."""
    from torchvision.models import resnet18

    return _converted(ctx, resnet18)


def tv_resnet50(ctx: ModelContext) -> nn.Module:
    """torchvision resnet50 (ImageNet stem), random init, norms converted to the spec."""
    from torchvision.models import resnet50

    return _converted(ctx, resnet50)
