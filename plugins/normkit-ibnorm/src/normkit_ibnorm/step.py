"""The ib step: centre over the NAP group, optionally scale to the group's standard deviation, then
compress, before the norm's standardization.

Two readings of lambda (docs/norms/ibnorm.md, "Which lambda"):

    units=std   (default) compress the standardized values c / s, s the group's standard deviation
                (its root mean square when not centring): lambda is in units of the group's scale, the
                layer does the same to x and to 10 * x, and ib-s and ib-t are bounded by lambda
    units=raw   compress c itself: lambda is in the input's units, so the effect depends on the
                activation scale (normkit-ibnorm 0.1's only reading)
"""

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
RUNNING_VAR = "ib_running_var"
UNITS = ("std", "raw")
EPS = 1e-5


class IBCompress(Step):
    """`compress((u - mean(u)) / s, lam)` per normalization group (units=std; units=raw skips the
    division by s); the norm then standardizes the result.

    centre=None follows the norm: centre when its base step centres (bn, ln, in, gn: Standardize),
    compress the raw values around 0 when it does not (rms). Batch partitions with running
    statistics keep `ib_running_mean` (and with units=std `ib_running_var`) so eval uses them, like
    their standardization.
    """

    def __init__(self, variant: str, lam: float, centre: bool | None, units: str = "std") -> None:
        if not (lam > 0 and math.isfinite(lam)):
            raise SpecError(f"ib-{variant}: lam must be a positive finite number (default "
                            f"{COMPRESSIONS[variant].default_lam:g}), got {lam}")
        if units not in UNITS:
            raise SpecError(f"ib-{variant}: units must be std (lambda in units of the group's standard "
                            f"deviation) or raw (lambda in the input's units), got {units!r}")
        self.name = f"ib-{variant}"
        self.compression = COMPRESSIONS[variant]
        self.lam = lam
        self.centre = centre
        self.units = units
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
            if self.units == "std":
                layer.register_buffer(RUNNING_VAR, torch.ones(layer.num_channels))
            self._running = standardize

    def _statistics(self, x: Tensor, groups: Groups, layer: NormLayer) -> tuple[Tensor | None, Tensor | None]:
        """(mean or None, variance or None): what centres and what scales `x` under this step's settings."""
        scaled = self.units == "std"
        if not self.centre:
            return None, groups.mean(x * x) if scaled else None
        running = self._running
        if running is not None and not layer.training:
            var = groups.per_channel(getattr(layer, RUNNING_VAR).to(x.dtype)) if scaled else None
            return groups.per_channel(getattr(layer, RUNNING_MEAN).to(x.dtype)), var
        if scaled:
            var, mean = groups.var_mean(x)
        else:
            var, mean = None, groups.mean(x)
        if running is not None:
            # Runs just before the standardize step, which bumps num_batches_tracked afterwards.
            momentum = running.momentum
            factor = momentum if momentum is not None else 1 / (float(layer.num_batches_tracked) + 1)
            with torch.no_grad():
                buffer = getattr(layer, RUNNING_MEAN)
                buffer.lerp_(groups.channel_stat(mean.detach()).to(buffer), factor)
                if var is not None:
                    n = groups.count
                    unbiased = groups.channel_stat(var.detach()) * (n / max(n - 1, 1))
                    getattr(layer, RUNNING_VAR).lerp_(unbiased.to(buffer), factor)
        return mean, var

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        if x.numel() == 0:  # an empty batch: no statistics to take (the norm's step handles it the same way)
            return self.compression.fn(x, self.lam)
        mean, var = self._statistics(x, groups, layer)
        c = x - mean if mean is not None else x
        if var is not None:
            c = c * torch.rsqrt(var + EPS)
        return self.compression.fn(c, self.lam)

    def describe(self) -> dict[str, Any]:
        if not self.centre:
            c = "u (raw values, no centring)"
        else:
            c = "u - mean(u) over the group" + (f" ({RUNNING_MEAN} in eval)" if self._running else "")
        if self.units == "std":
            c = f"({c}) / s, s = the group's {'standard deviation' if self.centre else 'root mean square'}"
        return {"lam": self.lam, "units": self.units, "compression": self.compression.formula, "c": c}
