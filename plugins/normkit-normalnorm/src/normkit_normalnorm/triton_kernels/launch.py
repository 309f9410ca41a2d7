"""Host side of the kernels: group geometry, path choice (row / split / eval), launches.

Imported only when a kernel is about to run, so `@triton.jit` sees `TRITON_INTERPRET` as it is
at that moment (the interpreter is chosen at decoration time).
"""

from __future__ import annotations

import math

import torch
import triton
from torch import Tensor

from normkit_normalnorm.triton_kernels.config import config
from normkit_normalnorm.triton_kernels.geometry import BATCH, LAM, MEAN, NSTAT, RSTD, VAR, Geometry, Options
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


def _strides(x3: Tensor) -> dict[str, int]:
    sn, sc, ss = x3.stride()
    return {"sn": sn, "sc": sc, "ss": ss}


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


def forward(x3: Tensor, weight: Tensor | None, bias: Tensor | None, geo: Geometry, opts: Options,
            seed: Tensor | None, out_dtype: torch.dtype, update: tuple[Tensor, Tensor, Tensor, float] | None = None,
            traced: bool = False) -> tuple[Tensor, Tensor]:
    """Training (or batch-statistics) forward: output and per-group statistics `(groups, NSTAT)`.

    `update` = (running_mean, running_var, running_lambda, factor): float32 contiguous buffers of a
    training batch partition that the kernel moves in place (saves the host-side EMA launches).
    `seed`: None without noise (the kernels do not read it; x3 stands in for the pointer).
    """
    y = torch.empty_like(x3, dtype=out_dtype)
    noise = opts.training and opts.noise > 0
    seed = _seed_pointer(seed, x3, noise)
    w = weight if weight is not None else x3
    b = bias if bias is not None else x3
    flags = {"HAS_W": weight is not None, "HAS_B": bias is not None, "NSTAT": NSTAT}
    stats = torch.empty(geo.n_groups, NSTAT, dtype=torch.float32, device=x3.device)
    run_mean, run_var, run_lam, factor = update if update is not None else (stats, stats, stats, 0.0)
    running = {"run_mean_ptr": run_mean, "run_var_ptr": run_var, "run_lam_ptr": run_lam, "momentum": factor,
               "unbias": geo.size / max(geo.size - 1, 1), "UPDATE": update is not None}
    common = dict(C=geo.c, S=geo.s, G=geo.groups, CG=geo.group_channels, **_strides(x3), PART=geo.part)
    scalars = dict(eps=opts.eps, sqrt_eps=math.sqrt(opts.eps), alpha=opts.alpha, **opts.clamp_args)
    if geo.size <= config.row_max:
        block = triton.next_power_of_2(geo.size)
        _k(row_forward, traced)[(geo.n_groups,)](
            x3, y, w, b, stats, **running, T=geo.cols, M=geo.size, noise=opts.noise, seed_ptr=seed, BLOCK=block,
            NOISE=noise, DETACH=opts.detach_lambda, num_warps=_num_warps(block),
            **common, **scalars, **opts.clamp_flags, **flags)
        return y, stats
    br, bt, _, n_ch = _tiles(geo)
    grid = (geo.n_groups, n_ch)
    tiles = dict(R=geo.rows, T=geo.cols, BR=br, BT=bt, **common)
    warps = _num_warps(br * bt)
    block_ch = min(triton.next_power_of_2(n_ch), 1024)
    moments = torch.empty(geo.n_groups, n_ch, 3, dtype=torch.float32, device=x3.device)
    newton = torch.empty(geo.n_groups, n_ch, 5, dtype=torch.float32, device=x3.device)
    _k(split_moments, traced)[grid](x3, moments, num_warps=warps, **tiles)
    _k(split_newton, traced)[grid](x3, moments, newton, M=geo.size, eps=opts.eps, BLOCK_CH=block_ch,
                       num_warps=warps, **tiles)
    spread = xt = moments  # unused unless noise
    if noise:
        xt = torch.empty(geo.n_groups * geo.size, dtype=torch.float32, device=x3.device)
        sum_x = torch.empty(geo.n_groups, n_ch, dtype=torch.float32, device=x3.device)
        spread = torch.empty_like(sum_x)
        _k(split_transform, traced)[grid](x3, moments, newton, xt, sum_x, M=geo.size, BLOCK_CH=block_ch,
                                          num_warps=warps, **tiles, **scalars, **opts.clamp_flags)
        _k(split_spread, traced)[grid](xt, sum_x, spread, M=geo.size, BLOCK_CH=block_ch, num_warps=warps, **tiles)
    _k(split_output, traced)[grid](x3, y, w, b, stats, moments, newton, spread, xt, **running, M=geo.size,
                                   noise=opts.noise, seed_ptr=seed, BLOCK_CH=block_ch, NOISE=noise,
                                   DETACH=opts.detach_lambda, num_warps=warps, **tiles, **scalars,
                                   **opts.clamp_flags, **flags)
    return y, stats


def backward(dy: Tensor, x3: Tensor, weight: Tensor | None, stats: Tensor, geo: Geometry, opts: Options,
             use_running: bool, seed: Tensor | None, has_bias: bool,
             traced: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias) for the forward that produced `stats`; noise regenerated from `seed`.

    The weight and bias gradients come back in float32, finished by the kernels themselves in a fixed
    order (deterministic): the row backward by a ticket tree inside its launch, the split backward in
    its second pass.
    """
    if dy.stride() != x3.stride():
        dy = torch.empty_like(x3, dtype=dy.dtype).copy_(dy)
    dx = torch.empty_like(x3)
    has_w = weight is not None
    w = weight if has_w else x3
    noise = opts.training and opts.noise > 0 and has_w
    seed = _seed_pointer(seed, x3, noise)
    lambda_grad = not (use_running or opts.detach_lambda)
    flags = {"HAS_W": has_w, "HAS_B": has_bias, "NOISE": noise, "NSTAT": NSTAT, "LAMBDA_GRAD": lambda_grad}
    common = dict(C=geo.c, S=geo.s, G=geo.groups, CG=geo.group_channels, **_strides(x3), PART=geo.part)
    dev = x3.device
    grads = torch.empty(2, geo.c, dtype=torch.float32, device=dev)  # dweight, dbias: written by the kernels
    if geo.size <= min(config.row_max, config.backward_row_max):
        per_class = geo.n_groups // geo.classes
        splits = max(1, min(per_class, config.backward_programs(dev) // geo.classes))
        per_split = math.ceil(per_class / splits)
        splits = math.ceil(per_class / per_split)
        block = triton.next_power_of_2(geo.size)
        # (classes, size) is (C, values per channel) in memory order for every partition.
        per_channel = geo.classes * geo.size // geo.c
        # Direct: one program holds all of its class's single channel (batch partitions), or nothing to sum.
        direct = (splits == 1 and per_channel == geo.size) or not (has_w or has_bias)
        set_size = math.isqrt(splits - 1) + 1  # sqrt(splits) rounded up: both tree levels about as short
        n_sets = math.ceil(splits / set_size)
        if direct:  # no partials, no tickets: x3 stands in for the pointers
            parts, tickets = (x3, x3), x3
        else:  # the splits' partial rows, then one per set
            parts = torch.empty(2, splits + n_sets, geo.classes * geo.size, dtype=torch.float32, device=dev)
            tickets = torch.zeros(geo.classes * (n_sets + 1), dtype=torch.int32, device=dev)
        pb = triton.next_power_of_2(per_channel)
        _k(row_backward, traced)[(geo.classes, splits)](
            x3, dy, dx, w, stats, parts[0], parts[1], grads[0], grads[1], tickets, T=geo.cols, M=geo.size,
            K=geo.classes, per_split=per_split, n_per_class=per_class, set_size=set_size, n_sets=n_sets,
            noise=opts.noise, seed_ptr=seed, BLOCK=block, USE_RUNNING=use_running, DIRECT=direct,
            CPK=geo.size // per_channel, PV=per_channel, CB=block // pb, PB=pb, num_warps=_num_warps(block),
            **common, **flags)
    else:
        br, bt, n_tb, n_ch = _tiles(geo)
        grid = (geo.n_groups, n_ch)
        tiles = dict(R=geo.rows, T=geo.cols, BR=br, BT=bt, **common)
        warps = _num_warps(br * bt)
        sums = torch.empty(geo.n_groups, n_ch, 5, dtype=torch.float32, device=dev)
        parts = torch.empty(2, geo.n_groups, geo.rows, n_tb, dtype=torch.float32, device=dev)
        _k(split_backward_reduce, traced)[grid](x3, dy, w, stats, sums, parts[0], parts[1], M=geo.size,
                                                noise=opts.noise, seed_ptr=seed, num_warps=_reduce_warps(br * bt),
                                                **tiles, **flags)
        # The partials as (slots, C, values): batch groups are channels; otherwise (groups, rows) is
        # (outer index, C) in memory order.
        slots, per_channel = (1, geo.rows * n_tb) if geo.part == BATCH else (geo.n_groups * geo.rows // geo.c, n_tb)
        pb = min(triton.next_power_of_2(per_channel), br * bt)
        _k(split_backward_input, traced)[grid](x3, dy, dx, w, stats, sums, parts[0], parts[1], grads[0], grads[1],
                                   M=geo.size, n_slots=slots, PV=per_channel,
                                   BLOCK_CH=min(triton.next_power_of_2(n_ch), 1024), num_warps=warps,
                                   USE_RUNNING=use_running, HAS_W=has_w, HAS_B=has_bias, LAMBDA_GRAD=lambda_grad,
                                   NSTAT=NSTAT, SB=br * bt // pb, PB=pb, **tiles)
    return dx, grads[0] if has_w else None, grads[1] if has_bias else None
