"""Reusable CPU scratch buffers for the fused path.

On CPU every fresh activation-sized tensor costs page faults when first written (glibc maps
allocations above 32 MB afresh each time), which costs about as much as a pass over the data. The
fused forward and backward build their temporaries in a few numbered slots that live across calls
(per thread, per dtype); CUDA tensors use torch's caching allocator instead. The slots hold seven
times the largest activation seen; `release()` frees them.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

_local = threading.local()


def scratch(slot: int, like: Tensor) -> Tensor:
    """An uninitialized tensor with `like`'s shape and dense strides; its memory is reused on CPU."""
    return scratch_stack(slot, like, 1)[0]


def scratch_stack(slot: int, like: Tensor, count: int) -> Tensor:
    """`count` scratch tensors like `like`, stacked along a new first dim (one reduction sums them all)."""
    if like.device.type != "cpu":
        return torch.empty((count, *like.shape), dtype=like.dtype, device=like.device)
    strides = torch.empty_like(like, device="meta").stride()
    slots: dict[tuple[int, torch.dtype], Tensor] = _local.__dict__.setdefault("slots", {})
    key, numel = (slot, like.dtype), like.numel()
    flat = slots.get(key)
    if flat is None or flat.numel() < count * numel:
        flat = slots[key] = torch.empty(count * numel, dtype=like.dtype)
    return flat.as_strided((count, *like.shape), (numel, *strides))


def release() -> None:
    """Free this thread's scratch buffers (they are re-created on the next fused call)."""
    _local.__dict__.pop("slots", None)
