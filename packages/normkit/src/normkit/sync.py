"""Batch statistics synced across processes (`ProcessSync`), the counterpart of torch's SyncBatchNorm.

    model = normkit.convert_sync(model)            # before wrapping in DistributedDataParallel
    model = DistributedDataParallel(model, ...)

`normkit.convert_sync` (in convert.py) marks every normkit layer whose statistics pool over the batch (bn, bnn, any
batch-partition pipeline). In training such a layer takes its reference path and computes every
group statistic through `Groups.mean` / `Groups.var_mean`, which then sum partial sums and
counts over the process group: K processes compute what one process computes on their
concatenated batch (means, variances, bnn's Newton sums and noise scale, running buffers), with
gradients through the reduction. Uneven batches and a process with an empty batch are weighed by
their element counts. Eval uses running statistics and never communicates.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from normkit.stages import Groups


class PerProcessBatchStatistics(UserWarning):
    """A batch-statistics layer trains inside a process group of several processes without syncing."""


_warned_per_process = False


def warn_if_per_process(layer: torch.nn.Module) -> None:
    """Warn once per process when an unsynced batch-statistics layer trains under torch.distributed.

    Tools that sync torch's BatchNorm (Lightning's `Trainer(sync_batchnorm=True)`,
    `nn.SyncBatchNorm.convert_sync_batchnorm`) do not see normkit's layers; this says so instead of
    leaving them silently per-process. Silence it with `warnings.filterwarnings("ignore",
    category=PerProcessBatchStatistics)` where per-process statistics are meant.
    """
    global _warned_per_process
    if _warned_per_process or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    dist = torch.distributed  # imported by torch itself; no import statement on every training call
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        _warned_per_process = True
        warnings.warn(PerProcessBatchStatistics(
            f"normkit: {type(layer).__name__} layers with batch statistics compute them per process "
            f"({dist.get_world_size()} processes); call normkit.convert_sync(model) before wrapping it in "
            f"DDP (with Lightning: plugins=[normkit.interop.lightning_sync.NormkitSyncBatchNorm()]) for statistics "
            f"over all processes"), stacklevel=4)


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
        return _SumOverProcesses.apply(t, self.process_group)

    def __getstate__(self) -> dict[str, Any]:
        return {"process_group": None}  # process groups do not pickle; a loaded copy syncs over the world

    def __repr__(self) -> str:
        return "ProcessSync(world)" if self.process_group is None else "ProcessSync(group)"


class _SumOverProcesses(torch.autograd.Function):
    """all_reduce(SUM) with its adjoint: every process's output is the same sum, so the gradient of
    the total loss with respect to one process's input is the sum of all processes' output gradients."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, group: Any) -> Tensor:
        import torch.distributed as dist

        ctx.group = group
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
