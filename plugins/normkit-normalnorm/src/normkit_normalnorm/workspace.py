"""Reusable CPU scratch buffers for the fused path.

On CPU every fresh activation-sized tensor that outlives the next allocations costs page faults when
first written (glibc returns and maps such memory afresh), about as much as a pass over the data. The
fused forward and backward build their temporaries in a few numbered slots that live across calls
(per thread, per dtype); CUDA tensors use torch's caching allocator instead. The slots hold up to ten
times the largest activation seen; `release()` frees them.

Tensors saved for backward cannot live in the scratch slots (every layer keeps its own until its
backward), so they are borrowed from a pool instead: `borrow()` hands out a recycled buffer, and
backward gives the buffers back with `give_back()` once it has used them. The pool then holds about
one training step's saved tensors between steps (as torch's CUDA caching allocator would); on CPU
that saves about 1 ms of page faults per saved 6 MB tensor. `release()` empties it too.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor

_local = threading.local()
_pool: dict[tuple[torch.dtype, int], list[Tensor]] = {}
_pool_lock = threading.Lock()
EXACT_SIZES = 8  # sizes kept per slot by scratch_exact


def scratch(slot: int, like: Tensor) -> Tensor:
    """An uninitialized tensor with `like`'s shape and dense strides; its memory is reused on CPU."""
    return scratch_stack(slot, like, 1)[0]


def scratch_stack(slot: int, like: Tensor, count: int) -> Tensor:
    """`count` scratch tensors like `like`, stacked along a new first dim (one reduction sums them all)."""
    if like.device.type != "cpu":
        return torch.empty((count, *like.shape), dtype=like.dtype, device=like.device)
    strides = torch.empty_like(like, device="meta").stride()
    numel = like.numel()
    return _flat(slot, like.dtype, count * numel).as_strided((count, *like.shape), (numel, *strides))


def scratch_contiguous(slot: int, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """A contiguous uninitialized scratch tensor of `shape` with `like`'s dtype and device."""
    if like.device.type != "cpu":
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return _flat(slot, like.dtype, math.prod(shape))[:math.prod(shape)].view(shape)


def scratch_flat(slot: int, numel: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """A contiguous CPU scratch vector of at least `numel` values (this thread's; no torch op when it is big
    enough): for callers that pass its address to C, or slice it once."""
    return _flat(slot, dtype, numel)


def scratch_exact(slot: int, numel: int) -> Tensor:
    """A float32 CPU scratch vector of exactly `numel` values (this thread's), for a caller that fills all of it
    with one torch op: a slice of a larger buffer would be one more op, which at the small steps that use this
    costs more than the fill. Keeps the last EXACT_SIZES sizes per slot (a layer sees a few shapes)."""
    sizes = _local.__dict__.setdefault("exact", {}).setdefault(slot, {})
    flat = sizes.get(numel)
    if flat is None:
        if len(sizes) >= EXACT_SIZES:
            sizes.clear()
        flat = sizes[numel] = torch.empty(numel)
    return flat


def _flat(slot: int, dtype: torch.dtype, numel: int) -> Tensor:
    slots: dict[tuple[int, torch.dtype], Tensor] = _local.__dict__.setdefault("slots", {})
    flat = slots.get((slot, dtype))
    if flat is None or flat.numel() < numel:
        flat = slots[(slot, dtype)] = torch.empty(numel, dtype=dtype)
    return flat


def borrow(like: Tensor) -> Tensor:
    """An uninitialized tensor with `like`'s shape and dense strides, recycled on CPU (see `give_back`)."""
    if like.device.type != "cpu":
        return torch.empty_like(like)
    key = (like.dtype, like.numel())
    with _pool_lock:
        free = _pool.get(key)
        flat = free.pop() if free else None
    if flat is None:
        flat = torch.empty(like.numel(), dtype=like.dtype)
    if like.is_contiguous():  # the common case, without computing dense strides on a meta tensor
        return flat.view(like.shape)
    return flat.as_strided(like.shape, torch.empty_like(like, device="meta").stride())


def give_back(*tensors: Tensor | None) -> None:
    """Return borrowed tensors to the pool; the caller must not use them (or views of them) again."""
    for tensor in tensors:
        if tensor is not None and tensor.device.type == "cpu":
            flat = tensor.as_strided((tensor.numel(),), (1,))
            with _pool_lock:
                _pool.setdefault((tensor.dtype, tensor.numel()), []).append(flat)


def graph_freed_after_this_backward() -> bool:
    """Whether a backward may give its borrowed saved tensors back: False under retain_graph or
    create_graph (a second backward reads them again), or if this torch cannot tell."""
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return keep_graph is not None and not keep_graph()


def release() -> None:
    """Free this thread's scratch buffers and the pool of borrowed buffers (both refill on demand)."""
    _local.__dict__.pop("slots", None)
    _local.__dict__.pop("exact", None)
    with _pool_lock:
        _pool.clear()
