"""Learning-rate schedules as per-step factors: linear warm-up, then cosine, step or constant."""

from __future__ import annotations

import math
from collections.abc import Callable

SCHEDULES = ("cosine", "step", "none")


def lr_factor(schedule: str, *, total_steps: int, steps_per_epoch: int, warmup_epochs: int = 0,
              step_size: int = 30, gamma: float = 0.1) -> Callable[[int], float]:
    """Factor of the base lr at optimizer step `i` (for torch.optim.lr_scheduler.LambdaLR).

    The schedule spans the run's `total_steps` (its budget, however many passes over the data that
    is): warm-up rises linearly over `warmup_epochs` passes of `steps_per_epoch` steps; cosine then
    decays to 0 at the last step; step multiplies by `gamma` every `step_size` passes (counted from
    the start of training).
    """
    warm = warmup_epochs * steps_per_epoch

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * (i - warm) / max(1, total_steps - warm)))
        if schedule == "step":
            return gamma ** (i // (step_size * steps_per_epoch))
        return 1.0

    return factor
