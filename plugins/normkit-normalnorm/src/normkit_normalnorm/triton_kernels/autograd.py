"""Eager entry: a torch.autograd.Function that launches the kernels with the least host work.

Compared with the `triton_op`s (used under torch.compile and torch.export, see `op.py`) it skips the
dispatcher and lets the kernel move float32 running buffers in place.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from normkit_normalnorm.functional import update_running
from normkit_normalnorm.triton_kernels.geometry import BATCH, LAM, MEAN, VAR, Geometry, Options

Running = tuple[Tensor | None, Tensor | None, Tensor | None]


@functools.cache
def _launch() -> ModuleType:
    """The launcher module, imported at the first kernel call (it decorates the kernels, which must
    see TRITON_INTERPRET as it is then) and not again: no import runs on later calls."""
    from normkit_normalnorm.triton_kernels import launch

    return launch


def kernel_forward(x3: Tensor, weight: Tensor | None, bias: Tensor | None, running: Running, geo: Geometry,
                   opts: Options, seed: Tensor | None, out_dtype: torch.dtype, factor: float | None,
                   need_stats: bool = True, traced: bool = False) -> tuple[Tensor, Tensor | None, bool]:
    """(output, statistics, eval-with-running-statistics?). With `factor`, the running buffers of a
    training batch partition are updated (in the kernel when they are float32 and contiguous).
    In eval with running statistics the table for backward is built only when `need_stats`.
    `seed`: a one-element int64 tensor on x3's device (the kernels read it; never a host int, so
    a traced graph draws a fresh seed per call), None without noise. `traced`: launch through `wrap_triton` (op.py)."""
    launch = _launch()
    tracked = geo.part == BATCH and running[0] is not None
    if tracked and not opts.training:
        y = launch.eval_forward(x3, weight, bias, running, geo, opts, out_dtype, traced)
        return y, launch.running_stats(running, opts) if need_stats else None, True
    update = tracked and opts.training and factor is not None
    in_kernel = update and all(t.dtype == torch.float32 and t.is_contiguous() and t.device == x3.device
                               for t in running)
    y, stats = launch.forward(x3, weight, bias, geo, opts, seed, out_dtype,
                              (*running, factor) if in_kernel else None, traced)
    if update and not in_kernel:
        update_running_from(stats, geo.size, factor, *running)
    return y, stats, False


def update_running_from(stats: Tensor, count: int, factor: float, running_mean: Tensor, running_var: Tensor,
                        running_lambda: Tensor) -> None:
    """EMA of the batch statistics a training forward returned into the running buffers."""
    update_running(stats[:, MEAN], stats[:, VAR], stats[:, LAM], count, factor, running_mean, running_var,
                   running_lambda)


def kernel_backward(dy: Tensor, x3: Tensor, weight: Tensor | None, bias: Tensor | None, stats: Tensor,
                    geo: Geometry, opts: Options, use_running: bool, seed: Tensor | None,
                    traced: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias), parameter gradients in the parameters' dtypes."""
    launch = _launch()
    dx, dw, db = launch.backward(dy, x3, weight, stats, geo, opts, use_running, seed, bias is not None,
                                 traced)
    return (dx, dw.to(weight.dtype) if dw is not None else None,
            db.to(bias.dtype) if db is not None else None)


class NormalityFunction(torch.autograd.Function):
    """Forward saves the input and the per-group statistics; backward regenerates the noise."""

    @staticmethod
    def forward(ctx: Any, x3: Tensor, weight: Tensor | None, bias: Tensor | None, running: Running,
                seed: Tensor | None, geo: Geometry, opts: Options, factor: float | None, out_dtype: torch.dtype,
                need_stats: bool) -> Tensor:
        y, stats, use_running = kernel_forward(x3, weight, bias, running, geo, opts, seed, out_dtype, factor,
                                               need_stats)
        ctx.save_for_backward(x3, weight, bias, stats, seed)
        ctx.call = (geo, opts, use_running)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x3, weight, bias, stats, seed = ctx.saved_tensors
        dx, dw, db = kernel_backward(dy, x3, weight, bias, stats, *ctx.call, seed)
        return dx, dw, db, None, None, None, None, None, None, None
