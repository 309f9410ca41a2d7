"""`normkit bench`: forward+backward time of normkit-built layers vs torch's native layers."""

from __future__ import annotations

import statistics
import time
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.table import Table
from torch import nn

import normkit
from normkit_cli.errors import one_line_errors

# (spec, native factory, shape, channel_dim)
CASES: list[tuple[str, object, tuple[int, ...], int]] = [
    ("bn", lambda c: nn.BatchNorm2d(c), (32, 64, 32, 32), 1),
    ("bn", lambda c: nn.BatchNorm2d(c), (128, 256, 8, 8), 1),
    ("gn(groups=32)", lambda c: nn.GroupNorm(32, c), (32, 64, 32, 32), 1),
    ("gn(groups=32)", lambda c: nn.GroupNorm(32, c), (128, 256, 8, 8), 1),
    ("ln", lambda c: nn.LayerNorm(c), (32, 65, 768), -1),
    ("ln", lambda c: nn.LayerNorm(c), (8, 1024, 1024), -1),
]


def fwd_bwd_seconds(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> float:
    x.grad = None
    start = time.perf_counter()
    module(x).backward(grad)
    return time.perf_counter() - start


def compare_pair(ours: nn.Module, native: nn.Module, shape: tuple[int, ...], repeats: int,
                 warmup: int = 3) -> tuple[float, float]:
    """Median fwd+bwd seconds of (ours, native), timed interleaved so load affects both alike."""
    x = torch.randn(shape, requires_grad=True)
    grad = torch.randn(shape)
    for _ in range(warmup):
        fwd_bwd_seconds(ours, x, grad)
        fwd_bwd_seconds(native, x, grad)
    a, b = [], []
    for _ in range(repeats):
        a.append(fwd_bwd_seconds(ours, x, grad))
        b.append(fwd_bwd_seconds(native, x, grad))
    return statistics.median(a), statistics.median(b)


@one_line_errors
def bench_cmd(
    repeats: Annotated[int, typer.Option(min=1, help="Timed repetitions per layer (median reported).")] = 20,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads.")] = 2,
) -> None:
    """Time normkit's bn/gn/ln against torch's native layers (CPU, forward+backward, medians)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    table = Table(title=f"forward+backward, CPU, {threads} threads, median of {repeats}")
    for col in ("spec", "shape", "normkit ms", "torch ms", "ratio"):
        table.add_column(col, justify="right")
    for spec, native_factory, shape, channel_dim in CASES:
        channels = shape[1] if channel_dim == 1 else shape[-1]
        ours = normkit.build(spec, channels, channel_dim=channel_dim)
        native = native_factory(channels)
        t_ours, t_native = compare_pair(ours, native, shape, repeats)
        table.add_row(spec, "x".join(map(str, shape)), f"{t_ours * 1e3:.2f}", f"{t_native * 1e3:.2f}",
                      f"{t_ours / t_native:.2f}x")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)
