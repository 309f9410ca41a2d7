"""The ib step: centre over the NAP group, then compress, before the norm's standardization."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from normkit import SpecError
from normkit.stages import Centre, Groups, Standardize, Step
from normkit_ibnorm.compression import COMPRESSIONS

if TYPE_CHECKING:
    from normkit.layer import NormLayer

RUNNING_MEAN = "ib_running_mean"


class IBCompress(Step):
    """`compress(u - mean(u), lam)` per normalization group; the norm then standardizes the result.

    centre=None follows the norm: centre when its base step centres (bn, ln, in, gn: Standardize),
    compress the raw values around 0 when it does not (rms). Batch partitions with running
    statistics keep `ib_running_mean` so eval centres with it, like their standardization.
    """

    def __init__(self, variant: str, lam: float, centre: bool | None) -> None:
        if not (lam > 0 and math.isfinite(lam)):
            raise SpecError(f"ib-{variant}: lam must be a positive finite number (default "
                            f"{COMPRESSIONS[variant].default_lam:g}), got {lam}")
        self.name = f"ib-{variant}"
        self.compression = COMPRESSIONS[variant]
        self.lam = lam
        self.centre = centre
        self._running: Standardize | None = None

    def setup(self, layer: NormLayer) -> None:
        if self.centre is None:
            self.centre = any(isinstance(s, (Standardize, Centre)) for s in layer.steps)
        standardize = next((s for s in layer.steps if isinstance(s, Standardize)), None)
        if (self.centre and layer.partition.uses_batch and standardize is not None
                and standardize.track_running_stats):
            if hasattr(layer, RUNNING_MEAN):
                raise SpecError(f"{layer.spec}: one ib step per batch-statistics layer; drop the others")
            layer.register_buffer(RUNNING_MEAN, torch.zeros(layer.num_channels))
            self._running = standardize

    def _mean(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        running = self._running
        if running is None:
            return groups.mean(x)
        buffer = getattr(layer, RUNNING_MEAN)
        if not layer.training:
            return groups.per_channel(buffer.to(x.dtype))
        mean = groups.mean(x)
        # Runs just before the standardize step, which bumps num_batches_tracked afterwards.
        momentum = running.momentum
        factor = momentum if momentum is not None else 1 / (float(layer.num_batches_tracked) + 1)
        buffer.lerp_(groups.channel_stat(mean.detach()).to(buffer), factor)
        return mean

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        c = x - self._mean(x, groups, layer) if self.centre else x
        return self.compression.fn(c, self.lam)

    def describe(self) -> dict[str, Any]:
        if not self.centre:
            c = "u (raw values, no centring)"
        else:
            c = "u - mean(u) over the group" + (f" ({RUNNING_MEAN} in eval)" if self._running else "")
        return {"lam": self.lam, "compression": self.compression.formula, "c": c}
