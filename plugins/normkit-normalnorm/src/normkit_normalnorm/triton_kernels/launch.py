"""Host side of the kernels: group geometry, path choice (row / split / eval), launches.

Imported only when a kernel is about to run, so `@triton.jit` sees `TRITON_INTERPRET` as it is
at that moment (the interpreter is chosen at decoration time).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch import Tensor

from normkit_normalnorm.triton_kernels.config import config
from normkit_normalnorm.triton_kernels.geometry import (
    BATCH,
    LAM,
    MEAN,
    NSTAT,
    RSTD,
    VAR,
    Geometry,
    Options,
    cached,
)
from normkit_normalnorm.triton_kernels.pointwise_kernels import eval_pointwise
from normkit_normalnorm.triton_kernels.row_kernels import row_backward, row_forward
from normkit_normalnorm.triton_kernels.split_kernels import (
    split_backward_input,
    split_backward_reduce,
    split_moments,
    split_newton,
    split_output,
    split_spread,
    split_transform,
)


def _k(kernel, traced: bool):
    """The kernel as launched: through `wrap_triton` inside the `triton_op`s (op.py), so torch.compile
    and torch.export record each launch as a kernel call they can see; directly otherwise (eager, where
    the wrapper would add about a millisecond of dispatch per launch)."""
    if not traced:
        return kernel
    return torch.library.wrap_triton(kernel)


def _num_warps(block: int) -> int:
    """block/512 warps, at most 8: 16 values per thread, so each of a kernel's many reductions (and a
    split pass's combining of the tiles' partials) costs its shuffles and barriers once per 16 values
    (the kernel-cost benchmark counts them); at 16 warps ptxas has 128 registers per thread and the
    row kernels spilled at block 4096 (aot.py check)."""
    return min(max(block // 512, 1), 8)


def _reduce_warps(block: int) -> int:
    """Warps of split_backward_reduce: block/256 (8 values per thread); at 16 it spilled 8 bytes on
    sm_90 (aot.py check, bf16, a one-row tile). split_output spilled at 8 values per thread on sm_80,
    and split_spread at 32 on sm_90, so the other split kernels keep _num_warps."""
    return min(max(block // 256, 1), 8)


def _seed_pointer(seed: Tensor | None, x3: Tensor, noise: bool) -> Tensor:
    """The seed tensor the kernels read; without noise they never read it and x3 stands in."""
    if seed is not None:
        return seed
    if noise:
        raise ValueError("a noisy training call needs the seed tensor its noise is drawn from")
    return x3


def _tiles(geo: Geometry) -> tuple[int, int, int, int]:
    """(BR, BT, column tiles, tiles per group) for the split path."""
    bt = min(triton.next_power_of_2(geo.cols), config.chunk)
    br = max(1, min(config.chunk // bt, triton.next_power_of_2(geo.rows)))
    n_tb = math.ceil(geo.cols / bt)
    return br, bt, n_tb, n_tb * math.ceil(geo.rows / br)


def eval_forward(x3: Tensor, weight: Tensor | None, bias: Tensor | None, running: tuple[Tensor, Tensor, Tensor],
                 geo: Geometry, opts: Options, out_dtype: torch.dtype, traced: bool = False) -> Tensor:
    """Eval of a batch partition with running statistics: one elementwise pass."""
    y = torch.empty_like(x3, dtype=out_dtype)
    block = config.pointwise_block
    sn, sc, ss = x3.stride()
    _k(eval_pointwise, traced)[(triton.cdiv(x3.numel(), block),)](
        x3, y, weight if weight is not None else x3, bias if bias is not None else x3,
        *(t.contiguous() for t in running), x3.numel(),
        geo.c, geo.s, sn, sc, ss, opts.eps, **opts.clamp_args, BLOCK=block, HAS_W=weight is not None,
        HAS_B=bias is not None, CHANNELS_LAST=sc == 1 and geo.c > 1, num_warps=4, **opts.clamp_flags)
    return y


def running_stats(running: tuple[Tensor, Tensor, Tensor], opts: Options) -> Tensor:
    """The statistics table the backward reads, built from running buffers (eval of a batch partition)."""
    mean, var, lam = (t.detach().float() for t in running)
    stats = torch.zeros(mean.numel(), NSTAT, dtype=torch.float32, device=mean.device)
    stats[:, MEAN] = mean
    stats[:, VAR] = var
    stats[:, RSTD] = torch.rsqrt(var + opts.eps)
    clamped = opts.lambda_min is not None or opts.lambda_max is not None
    stats[:, LAM] = lam.clamp(min=opts.lambda_min, max=opts.lambda_max) if clamped else lam
    return stats


@dataclass
class Plan:
    """Everything about a call's launches that depends only on its shape, layout, flags and options,
    built once per such key (`forward_plan`, `backward_plan`): which path, grids, buffer sizes, and
    each kernel's non-tensor arguments. A call then only allocates, binds tensors and launches."""

    row: bool
    grid: tuple[int, ...]
    noise: bool
    kwargs: dict[str, dict[str, Any]]
    n_ch: int = 0  # split path: tiles per group
    n_tb: int = 0  # split path: column tiles
    direct: bool = True  # row backward: sums stored directly, no partial rows or tickets
    part_rows: int = 0  # row backward: partial rows (splits, then one per set)
    tickets: int = 0  # row backward: int32 ticket counters


@functools.lru_cache(maxsize=256)
def forward_plan(geo: Geometry, opts: Options, strides: tuple[int, ...], has_w: bool, has_b: bool, update: bool,
                 config_version: int) -> Plan:
    """The training forward's launches for one key (`config_version`: settings changed since, rebuild)."""
    noise = opts.training and opts.noise > 0
    flags = {"HAS_W": has_w, "HAS_B": has_b, "NSTAT": NSTAT, "UPDATE": update,
             "unbias": geo.size / max(geo.size - 1, 1)}
    common = {"C": geo.c, "S": geo.s, "G": geo.groups, "CG": geo.group_channels, "sn": strides[0],
              "sc": strides[1], "ss": strides[2], "PART": geo.part}
    scalars = dict(eps=opts.eps, sqrt_eps=math.sqrt(opts.eps), alpha=opts.alpha, **opts.clamp_args,
                   **opts.clamp_flags)
    if geo.size <= config.row_max:
        block = triton.next_power_of_2(geo.size)
        return Plan(True, (geo.n_groups,), noise, {"row_forward": dict(
            T=geo.cols, M=geo.size, noise=opts.noise, BLOCK=block, NOISE=noise, DETACH=opts.detach_lambda,
            num_warps=_num_warps(block), **common, **scalars, **flags)})
    br, bt, _, n_ch = _tiles(geo)
    tiles = dict(R=geo.rows, T=geo.cols, BR=br, BT=bt, num_warps=_num_warps(br * bt), **common)
    block_ch = min(triton.next_power_of_2(n_ch), 1024)
    return Plan(False, (geo.n_groups, n_ch), noise, {
        "split_moments": tiles,
        "split_newton": dict(M=geo.size, eps=opts.eps, BLOCK_CH=block_ch, **tiles),
        "split_transform": dict(M=geo.size, BLOCK_CH=block_ch, **tiles, **scalars),
        "split_spread": dict(M=geo.size, BLOCK_CH=block_ch, **tiles),
        "split_output": dict(M=geo.size, noise=opts.noise, BLOCK_CH=block_ch, NOISE=noise,
                             DETACH=opts.detach_lambda, **tiles, **scalars, **flags)}, n_ch=n_ch)


def forward(x3: Tensor, weight: Tensor | None, bias: Tensor | None, geo: Geometry, opts: Options,
            seed: Tensor | None, out_dtype: torch.dtype, update: tuple[Tensor, Tensor, Tensor, float] | None = None,
            traced: bool = False) -> tuple[Tensor, Tensor]:
    """Training (or batch-statistics) forward: output and per-group statistics `(groups, NSTAT)`.

    `update` = (running_mean, running_var, running_lambda, factor): float32 contiguous buffers of a
    training batch partition that the kernel moves in place (saves the host-side EMA launches).
    `seed`: None without noise (the kernels do not read it; x3 stands in for the pointer).
    """
    plan = cached(forward_plan, geo, opts, x3.stride(), weight is not None, bias is not None, update is not None,
                  config.version)
    seed = _seed_pointer(seed, x3, plan.noise)
    y = torch.empty_like(x3, dtype=out_dtype)
    w = weight if weight is not None else x3
    b = bias if bias is not None else x3
    stats = torch.empty(geo.n_groups, NSTAT, dtype=torch.float32, device=x3.device)
    run_mean, run_var, run_lam, factor = update if update is not None else (stats, stats, stats, 0.0)
    kw, grid = plan.kwargs, plan.grid
    if plan.row:
        _k(row_forward, traced)[grid](x3, y, w, b, stats, run_mean, run_var, run_lam, momentum=factor,
                                      seed_ptr=seed, **kw["row_forward"])
        return y, stats
    moments = torch.empty(geo.n_groups, plan.n_ch, 3, dtype=torch.float32, device=x3.device)
    newton = torch.empty(geo.n_groups, plan.n_ch, 5, dtype=torch.float32, device=x3.device)
    _k(split_moments, traced)[grid](x3, moments, **kw["split_moments"])
    _k(split_newton, traced)[grid](x3, moments, newton, **kw["split_newton"])
    spread = xt = moments  # unused unless noise
    if plan.noise:
        xt = torch.empty(geo.n_groups * geo.size, dtype=torch.float32, device=x3.device)
        sum_x = torch.empty(geo.n_groups, plan.n_ch, dtype=torch.float32, device=x3.device)
        spread = torch.empty_like(sum_x)
        _k(split_transform, traced)[grid](x3, moments, newton, xt, sum_x, **kw["split_transform"])
        _k(split_spread, traced)[grid](xt, sum_x, spread, **kw["split_spread"])
    _k(split_output, traced)[grid](x3, y, w, b, stats, moments, newton, spread, xt, run_mean, run_var, run_lam,
                                   momentum=factor, seed_ptr=seed, **kw["split_output"])
    return y, stats


@functools.lru_cache(maxsize=256)
def backward_plan(geo: Geometry, opts: Options, strides: tuple[int, ...], has_w: bool, has_b: bool,
                  use_running: bool, device: torch.device, config_version: int) -> Plan:
    """The backward's launches for one key; the row backward's program count is the device's (its SMs)."""
    noise = opts.training and opts.noise > 0 and has_w
    lambda_grad = not (use_running or opts.detach_lambda)
    flags = {"HAS_W": has_w, "HAS_B": has_b, "NOISE": noise, "NSTAT": NSTAT, "LAMBDA_GRAD": lambda_grad}
    common = {"C": geo.c, "S": geo.s, "G": geo.groups, "CG": geo.group_channels, "sn": strides[0],
              "sc": strides[1], "ss": strides[2], "PART": geo.part}
    if geo.size <= min(config.row_max, config.backward_row_max):
        per_class = geo.n_groups // geo.classes
        splits = max(1, min(per_class, config.backward_programs(device) // geo.classes))
        per_split = math.ceil(per_class / splits)
        splits = math.ceil(per_class / per_split)
        block = triton.next_power_of_2(geo.size)
        # (classes, size) is (C, values per channel) in memory order for every partition.
        per_channel = geo.classes * geo.size // geo.c
        # Direct: one program holds all of its class's single channel (batch partitions), or nothing to sum.
        direct = (splits == 1 and per_channel == geo.size) or not (has_w or has_b)
        set_size = math.isqrt(splits - 1) + 1  # sqrt(splits) rounded up: both tree levels about as short
        n_sets = math.ceil(splits / set_size)
        pb = triton.next_power_of_2(per_channel)
        return Plan(True, (geo.classes, splits), noise, {"row_backward": dict(
            T=geo.cols, M=geo.size, K=geo.classes, per_split=per_split, n_per_class=per_class, set_size=set_size,
            n_sets=n_sets, noise=opts.noise, BLOCK=block, USE_RUNNING=use_running, DIRECT=direct,
            CPK=geo.size // per_channel, PV=per_channel, CB=block // pb, PB=pb, num_warps=_num_warps(block),
            **common, **flags)}, direct=direct, part_rows=0 if direct else splits + n_sets,
            tickets=0 if direct else geo.classes * (n_sets + 1))
    br, bt, n_tb, n_ch = _tiles(geo)
    tiles = dict(R=geo.rows, T=geo.cols, BR=br, BT=bt, M=geo.size, **common)
    # The partials as (slots, C, values): batch groups are channels; otherwise (groups, rows) is
    # (outer index, C) in memory order.
    slots, per_channel = (1, geo.rows * n_tb) if geo.part == BATCH else (geo.n_groups * geo.rows // geo.c, n_tb)
    pb = min(triton.next_power_of_2(per_channel), br * bt)
    return Plan(False, (geo.n_groups, n_ch), noise, {
        "split_backward_reduce": dict(noise=opts.noise, num_warps=_reduce_warps(br * bt), **tiles, **flags),
        "split_backward_input": dict(
            n_slots=slots, PV=per_channel, BLOCK_CH=min(triton.next_power_of_2(n_ch), 1024),
            num_warps=_num_warps(br * bt), USE_RUNNING=use_running, HAS_W=has_w, HAS_B=has_b,
            LAMBDA_GRAD=lambda_grad, NSTAT=NSTAT, SB=br * bt // pb, PB=pb, **tiles)}, n_ch=n_ch, n_tb=n_tb)


def backward(dy: Tensor, x3: Tensor, weight: Tensor | None, stats: Tensor, geo: Geometry, opts: Options,
             use_running: bool, seed: Tensor | None, has_bias: bool,
             traced: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias) for the forward that produced `stats`; noise regenerated from `seed`.

    The weight and bias gradients come back in float32, finished by the kernels themselves in a fixed
    order (deterministic): the row backward by a ticket tree inside its launch, the split backward in
    its second pass.
    """
    has_w = weight is not None
    dev = x3.device
    plan = cached(backward_plan, geo, opts, x3.stride(), has_w, has_bias, use_running, dev, config.version)
    if dy.stride() != x3.stride():
        dy = torch.empty_like(x3, dtype=dy.dtype).copy_(dy)
    dx = torch.empty_like(x3)
    w = weight if has_w else x3
    seed = _seed_pointer(seed, x3, plan.noise)
    grads = torch.empty(2, geo.c, dtype=torch.float32, device=dev)  # dweight, dbias: written by the kernels
    kw, grid = plan.kwargs, plan.grid
    if plan.row:
        if plan.direct:  # no partials, no tickets: x3 stands in for the pointers
            parts, tickets = (x3, x3), x3
        else:
            parts = torch.empty(2, plan.part_rows, geo.classes * geo.size, dtype=torch.float32, device=dev)
            tickets = torch.zeros(plan.tickets, dtype=torch.int32, device=dev)
        _k(row_backward, traced)[grid](x3, dy, dx, w, stats, parts[0], parts[1], grads[0], grads[1], tickets,
                                       seed_ptr=seed, **kw["row_backward"])
    else:
        sums = torch.empty(geo.n_groups, plan.n_ch, 5, dtype=torch.float32, device=dev)
        parts = torch.empty(2, geo.n_groups, geo.rows, plan.n_tb, dtype=torch.float32, device=dev)
        _k(split_backward_reduce, traced)[grid](x3, dy, w, stats, sums, parts[0], parts[1], seed_ptr=seed,
                                                **kw["split_backward_reduce"])
        _k(split_backward_input, traced)[grid](x3, dy, dx, w, stats, sums, parts[0], parts[1], grads[0], grads[1],
                                               **kw["split_backward_input"])
    return dx, grads[0] if has_w else None, grads[1] if has_bias else None
