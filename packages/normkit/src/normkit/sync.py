"""Batch statistics synced across processes, the counterpart of torch's SyncBatchNorm.

    model = normkit.convert_sync(model)            # before wrapping in DistributedDataParallel
    model = DistributedDataParallel(model, ...)

`convert_sync` marks every normkit layer whose statistics pool over the batch (bn, bnn, any
batch-partition pipeline). In training such a layer takes its reference path and computes every
group statistic through `Groups.mean` / `Groups.var_mean`, which then sum partial sums and
counts over the process group: K processes compute what one process computes on their
concatenated batch (means, variances, bnn's Newton sums and noise scale, running buffers), with
gradients through the reduction. Uneven batches and a process with an empty batch are weighed by
their element counts. Eval uses running statistics and never communicates.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from normkit.layer import NormLayer

if TYPE_CHECKING:
    from normkit.stages import Groups


class ProcessSync:
    """Where a synced layer reduces its statistics: a torch.distributed process group (None = world)."""

    def __init__(self, process_group: Any = None) -> None:
        self.process_group = process_group

    def active(self) -> bool:
        """Sync only inside an initialized process group of more than one process (as SyncBatchNorm)."""
        import torch.distributed as dist

        return (dist.is_available() and dist.is_initialized()
                and dist.get_world_size(self.process_group) > 1)

    def attach(self, groups: Groups, device: torch.device) -> Groups:
        """`groups` with the cross-process reducer and the total element count per group."""
        import torch.distributed as dist

        count = torch.tensor([float(groups.count)], dtype=torch.float64, device=device)
        dist.all_reduce(count, group=self.process_group)
        return dataclasses.replace(groups, reduce=self.reduce, count=int(count.item()))

    def reduce(self, t: Tensor) -> Tensor:
        """Sum of `t` over the process group, differentiable (the backward sums the gradients too)."""
        from torch.distributed.nn.functional import all_reduce

        return all_reduce(t, group=self.process_group)

    def __getstate__(self) -> dict[str, Any]:
        return {"process_group": None}  # process groups do not pickle; a loaded copy syncs over the world

    def __repr__(self) -> str:
        return "ProcessSync(world)" if self.process_group is None else "ProcessSync(group)"


def convert_sync(model: nn.Module, process_group: Any = None) -> nn.Module:
    """Make every batch-statistics normkit layer in `model` reduce its statistics across processes.

    In place, returns `model`. Layers whose partition does not pool over the batch (ln, gn, in,
    rms, ...) need no communication and are left alone. torch's own BatchNorm layers are torch's
    to convert (`nn.SyncBatchNorm.convert_sync_batchnorm`).
    """
    for module in model.modules():
        if isinstance(module, NormLayer) and module.partition is not None and module.partition.uses_batch:
            module.sync = ProcessSync(process_group)
    return model
