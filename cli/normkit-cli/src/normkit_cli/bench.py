"""`normkit bench`: forward+backward time of normkit-built layers vs torch's native layers."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from normkit_cli.errors import one_line_errors
from normkit_lab.limits import MAX_CPU_THREADS, MAX_REPEATS

if TYPE_CHECKING:  # torch is imported when the command runs, not for --help
    import torch
    from torch import nn

# (spec, shape, channel_dim)
CASES: list[tuple[str, tuple[int, ...], int]] = [
    ("bn", (32, 64, 32, 32), 1),
    ("bn", (128, 256, 8, 8), 1),
    ("gn(groups=32)", (32, 64, 32, 32), 1),
    ("gn(groups=32)", (128, 256, 8, 8), 1),
    ("ln", (32, 65, 768), -1),
    ("ln", (8, 1024, 1024), -1),
]


def native_layer(spec: str, channels: int) -> Any:
    """torch's own layer for a CASES spec."""
    from torch import nn

    if spec == "bn":
        return nn.BatchNorm2d(channels)
    if spec == "gn(groups=32)":
        return nn.GroupNorm(32, channels)
    return nn.LayerNorm(channels)


def fwd_bwd_seconds(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> float:
    x.grad = None
    start = time.perf_counter()
    module(x).backward(grad)
    return time.perf_counter() - start


def compare_pair(ours: nn.Module, native: nn.Module, shape: tuple[int, ...], repeats: int,
                 warmup: int = 3) -> tuple[float, float]:
    """Median fwd+bwd seconds of (ours, native), timed interleaved so load affects both alike."""
    import torch

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
    repeats: Annotated[int, typer.Option(min=1, max=MAX_REPEATS,
                                                        help="Timed repetitions per layer (median reported).")] = 20,
    threads: Annotated[int, typer.Option(min=1, max=MAX_CPU_THREADS, help="torch CPU threads.")] = 2,
) -> None:
    """Time normkit's bn/gn/ln against torch's native layers (CPU, forward+backward, medians)."""
    import torch

    import normkit

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    table = Table(title=f"forward+backward, CPU, {threads} threads, median of {repeats}")
    for col in ("spec", "shape", "normkit ms", "torch ms", "ratio"):
        table.add_column(col, justify="right")
    for spec, shape, channel_dim in CASES:
        channels = shape[1] if channel_dim == 1 else shape[-1]
        ours = normkit.build(spec, channels, channel_dim=channel_dim)
        native = native_layer(spec, channels)
        t_ours, t_native = compare_pair(ours, native, shape, repeats)
        table.add_row(spec, "x".join(map(str, shape)), f"{t_ours * 1e3:.2f}", f"{t_native * 1e3:.2f}",
                      f"{t_ours / t_native:.2f}x")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)
