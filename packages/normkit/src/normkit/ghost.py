"""Ghost batches: a batch-statistics norm normalizing over groups of `ghost` samples of its batch.

`bn(ghost=2)` (any norm whose partition pools over the batch: bn, bnn, brn, a plugin's) splits a
training batch of N samples into N/ghost consecutive ghost batches and runs the whole layer on each
one alone, exactly as `torch.nn.functional.batch_norm` applied chunk by chunk: the batch the norm
normalizes over varies while the gradient batch (and so the gradient noise and the examples seen)
stays fixed (Hoffer et al., Train longer, generalize better, NeurIPS 2017, arXiv:1705.08741).

Steps that reduce only through the `Groups` API (`Step.reduces_through_groups`: bn's standardize, the
normality norm's nn) see all ghost batches at once as a `(N/ghost, ghost, C, S)` tensor reduced over
dims (1, 3), one call on the reference path; a fused path is offered that call only where its step
declares that it normalizes ghost batches itself (`Step.fused_ghost_batches`: bn's standardize and the
normality norm's nn, whose fused kernels take them regrouped, `stages.GhostRegroup`), since other fused
kernels pool the whole batch. Any other
layer (a plugin's step, a post-activation step, probes, a remainder) runs once per ghost batch. All
compute the same function.

Running buffers (running_mean/var, bnn's running_lambda, ...): every ghost batch starts from the same
buffers, and the layer keeps the mean of the values they end with, so one training step is one
update, with the mean of the ghost batches' statistics for an EMA or cumulative buffer; integer
buffers (num_batches_tracked) count steps, as without ghost batches. Eval uses running statistics
as usual (a layer without them, `track_running_stats=False`, also normalizes ghost batches in eval).

A batch that ghost does not divide ends with a smaller ghost batch of the N mod ghost samples left
(as `torch.split`), and the buffers are then averaged weighted by each ghost batch's samples.

Under `normkit.convert_sync` (DDP) a ghost batch never straddles processes: each process normalizes
its own ghost batches with their own statistics (no communication on the forward path), and the
running buffers are then averaged over the processes weighted by their samples (integer buffers:
the largest count), on every path, so every process holds the buffers one process would have after
the concatenated batch. The updates are affine in the statistics (EMA or cumulative mean), so that
average is exactly one process's mean over all ghost batches. Outputs equal one process's when each
process's batch is a multiple of ghost (the ghost batches are then the same); otherwise each process
ends with its own smaller ghost batch.

A ghost batch larger than the training batch is the whole batch: the layer then normalizes over the
batch it is given, which is what a mistaken ghost= (or a batch smaller than meant) does silently, so
the layer warns once (`GhostBatchTooLarge`) when it trains on fewer samples than ghost without ever
having trained on a batch of ghost or more. A shorter last batch of an epoch follows full batches,
so it does not warn.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

NormLayer = nn.Module  # a normkit.layer.NormLayer (not imported: the layer imports this module)


class GhostBatchTooLarge(UserWarning):
    """A ghost batch larger than every training batch the layer has seen: it normalizes whole batches."""


def applies(layer: NormLayer) -> bool:
    """True when the layer normalizes with batch statistics now (training, or no running statistics)."""
    if layer.training:
        return True
    return not any(name.startswith("running_") for name, _ in layer.named_buffers(recurse=False))


def forward_in_ghost_batches(layer: NormLayer, x: Tensor) -> Tensor:
    """The layer's output on `x` computed ghost batch by ghost batch (see the module docstring)."""
    size, n = layer.partition.ghost, x.shape[0]
    if layer.training:
        _warn_if_larger_than_batch(layer, n)
    whole = n <= size or (n % size == 0 and _groups_only(layer))  # one call: a single or grouped ghost batches
    synced = _synced(layer)
    if whole and not synced:
        return _forward(layer, x, grouped=n > size)
    chunks = [x] if whole else list(x.split(size))
    # Each call updates its own copy of the buffers (torch's batch_norm saves the running statistics it
    # updates for its backward, so the layer's own ones are written once, at the end, and synced then).
    names = [name for name, b in layer._buffers.items() if b is not None]
    own = {name: layer._buffers[name] for name in names}
    outs, ends = [], []
    try:
        for chunk in chunks:
            for name in names:
                layer._buffers[name] = own[name].detach().clone()
            outs.append(_forward(layer, chunk, grouped=whole and n > size))
            ends.append({name: layer._buffers[name] for name in names})
    finally:
        layer._buffers.update(own)
    weights = torch.tensor([float(max(1, c.shape[0])) for c in chunks], dtype=torch.float64)
    with torch.no_grad():
        for name, buffer in own.items():
            if buffer.is_floating_point():
                stacked = torch.stack([end[name] for end in ends])
                buffer.copy_(_mean_over_ghost_batches(stacked, weights))
            else:
                buffer.copy_(ends[-1][name])
    if synced:
        _sync_buffers(layer, n)
    out = outs[0] if whole else torch.cat(outs)
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return out.contiguous(memory_format=torch.channels_last)
    return out


def _warn_if_larger_than_batch(layer: NormLayer, n: int) -> None:
    """Warn once per layer when it trains on fewer than ghost samples and has never trained on a batch of
    ghost or more (a shorter last batch of an epoch comes after full ones, so it is not warned about)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    state = layer.__dict__.setdefault("_ghost_batches_seen", {"fits": False, "warned": False})
    size = layer.partition.ghost
    if n >= size:
        state["fits"] = True
    elif n and not state["fits"] and not state["warned"]:
        state["warned"] = True
        where = " on this process" if _synced(layer) else ""
        warnings.warn(GhostBatchTooLarge(
            f"normkit: {layer.spec or 'norm'} ({layer.num_channels} channels) has ghost={size} but trains on "
            f"batches of {n} samples{where}, so it normalizes over the whole batch of {n}, not ghost batches of "
            f"{size}; use ghost= at most the training batch size"), stacklevel=4)


def _synced(layer: NormLayer) -> bool:
    """True when the layer trains under convert_sync with several processes (buffers are then averaged)."""
    return layer.sync is not None and layer.training and layer.sync.active()


def _groups_only(layer: NormLayer) -> bool:
    """True when every step reduces through Groups (declared on its own class) and nothing else
    needs the per-call path: the whole batch then runs as one `(N/ghost, ghost, C, S)` tensor."""
    return (not layer.probes and layer.post is None and not layer.round_before_gain
            and all(type(step).__dict__.get("reduces_through_groups", False) or step.needs_conv
                    for step in layer.steps))


def _forward(layer: NormLayer, x: Tensor, grouped: bool = False) -> Tensor:
    """The layer on `x`, statistics in float32 even under autocast. `grouped`: `x` holds several ghost
    batches: a step's fused path runs only where it normalizes them itself (`Step.fused_ghost_batches`;
    other fused paths would pool the whole batch), else the steps' reference path on the grouped tensor."""
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return _forward(layer, x, grouped)
    return layer._forward(x, ghost_batches=grouped)


def _mean_over_ghost_batches(ends: Tensor, samples: Tensor) -> Tensor:
    """Mean over dim 0 (this process's ghost batches) weighted by their samples."""
    w = samples.to(ends).view(-1, *([1] * (ends.dim() - 1)))
    return (ends * w).sum(dim=0) / samples.sum().to(ends)


def _sync_buffers(layer: NormLayer, samples: int) -> None:
    """Every process's running buffers become their mean over the processes weighted by each one's samples
    (a process with an empty batch, whose buffers did not move, weighs 0); integer buffers take the largest
    count. Every process calls it once per synced training call, so the collectives match."""
    import torch.distributed as dist

    group = layer.sync.process_group
    names = [name for name, b in layer._buffers.items() if b is not None]
    floats = [layer._buffers[name] for name in names if layer._buffers[name].is_floating_point()]
    with torch.no_grad():
        if floats:
            flat = torch.cat([b.detach().reshape(-1).double() * samples for b in floats]
                             + [torch.tensor([float(samples)], dtype=torch.float64, device=floats[0].device)])
            dist.all_reduce(flat, group=group)
            if flat[-1] > 0:
                start = 0
                for b in floats:
                    b.copy_((flat[start:start + b.numel()] / flat[-1]).view_as(b))
                    start += b.numel()
        for name in names:
            if not layer._buffers[name].is_floating_point():
                dist.all_reduce(layer._buffers[name], op=dist.ReduceOp.MAX, group=group)
