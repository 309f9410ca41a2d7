"""Time rows.c's row functions alone (ctypes calls, no autograd or Python layer) against torch's layer_norm.

    .venv/bin/python benchmarks/bench_rows_kernel.py                 # 32x65x768 tokens, 5 rounds of 9 calls
    .venv/bin/python benchmarks/bench_rows_kernel.py --rounds 9

Why: at lnn's benchmark shape nearly all of a training step's CPU time is inside the two calls into rows.c
(torch.profiler: the autograd Function's forward and backward, aten ops about 1 %), so the kernel's own cost,
timed without the layer around it, is what a change to rows.c moves. Also bnn's eval kernel
(`nn_channels_eval`, running statistics) against torch's batch_norm in eval at 128x256x8x8: both the bound on
the inference targets (nothing around the kernel can make the layer cheaper than it). One thread, thread CPU
time (a loaded machine's waits left out); each round times every function in turn (interleaved), median of the
rounds; outputs are preallocated (no page faults in the kernels' times; torch's functions allocate theirs).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from normkit_normalnorm import rows


def timed(call: Callable[[], object], calls: int) -> float:
    """Median thread CPU time of `calls` calls, in ms."""
    times = []
    for _ in range(calls):
        start = time.thread_time()
        call()
        times.append(time.thread_time() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lib = rows.library()
    if lib is None:
        raise SystemExit("rows.c could not be built on this machine (no C compiler?): nothing to time")
    n, count = 768, 32 * 65
    numel = n * count
    gen = torch.Generator().manual_seed(0)
    x, dy = torch.randn(count, n, generator=gen), torch.randn(count, n, generator=gen)
    weight, bias = torch.rand(n, generator=gen) + 0.5, torch.randn(n, generator=gen)
    out, y, log1p_a, power, dx = (torch.empty_like(x) for _ in range(5))
    stats = torch.empty(count, rows.NSTATS)
    scratch = torch.empty(8, n)  # enough for every function's scratch at one thread
    dweight, dbias = torch.zeros(rows.CHUNKS, n), torch.zeros(rows.CHUNKS, n)
    inf = math.inf

    def forward(noise: float) -> None:
        lib.nn_rows_forward(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), out.data_ptr(), y.data_ptr(),
                            log1p_a.data_ptr(), power.data_ptr(), stats.data_ptr(), scratch.data_ptr(), numel, n,
                            1e-5, 1.0, noise, -inf, inf, 7, 1, rows.CHUNKS)

    calls: dict[str, Callable[[], object]] = {
        "torch layer_norm forward": lambda: torch.nn.functional.layer_norm(x, (n,), weight, bias),
        "nn_rows_infer": lambda: lib.nn_rows_infer(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), out.data_ptr(),
                                                   scratch.data_ptr(), numel, n, 1e-5, 1.0, -inf, inf, 1,
                                                   rows.CHUNKS),
        "nn_rows_forward, noise 0": lambda: forward(0.0),
        "nn_rows_forward, noise 1": lambda: forward(1.0),
        "nn_rows_backward": lambda: lib.nn_rows_backward(
            dy.data_ptr(), x.data_ptr(), weight.data_ptr(), y.data_ptr(), log1p_a.data_ptr(), power.data_ptr(),
            stats.data_ptr(), dx.data_ptr(), dweight.data_ptr(), dbias.data_ptr(), scratch.data_ptr(), numel, n,
            1.0, 1, 1, rows.CHUNKS),
    }
    images = torch.randn(128, 256, 64, generator=gen)  # bnn's eval benchmark shape, (N, C, S)
    images_out = torch.empty_like(images)
    mean, var = torch.randn(256, generator=gen) * 0.1, torch.rand(256, generator=gen) + 0.5
    scale, lam = torch.rsqrt(var + 1e-5), torch.rand(256, generator=gen) * 0.6 + 0.7
    channel_weight, channel_bias = torch.rand(256, generator=gen) + 0.5, torch.randn(256, generator=gen)
    calls["torch batch_norm eval, 128x256x8x8"] = lambda: torch.nn.functional.batch_norm(
        images, mean, var, channel_weight, channel_bias, training=False)
    calls["nn_channels_eval, 128x256x8x8"] = lambda: lib.nn_channels_eval(
        images.data_ptr(), channel_weight.data_ptr(), channel_bias.data_ptr(), mean.data_ptr(), scale.data_ptr(),
        lam.data_ptr(), images_out.data_ptr(), 128, 256, 64, 1)
    forward(1.0)  # backward reads what a forward wrote
    results: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            results[name].append(timed(call, args.calls))
    print(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} cores, {count}x{n} values (rows), load average "
          f"{os.getloadavg()[0]:.1f}, {args.rounds} rounds of {args.calls} calls, thread CPU time")
    print("| function | ms |")
    print("|---|---|")
    for name, times in results.items():
        print(f"| {name} | {statistics.median(times):.2f} |")


if __name__ == "__main__":
    main()
