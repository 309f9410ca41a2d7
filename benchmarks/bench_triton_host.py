"""Host work of the Triton path per training call, measured without a GPU: kernel launches stubbed.

Runs `normality_triton` forward + backward on tiny CPU tensors under TRITON_INTERPRET=1 with every
kernel launch replaced by a no-op, so what is timed is the host path the launcher adds around the
kernels (checks, launch plans, buffer allocations, the seed, autograd), not Triton's own argument
binding and not the kernels. Interleaved rounds, medians, one thread.

    TRITON_INTERPRET=1 .venv/bin/python benchmarks/bench_triton_host.py [--rounds 15 --calls 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

CASES = {"lnn 4x8x32 (layer, tokens)": ((4, 32, 8), "layer", True),
         "bnn 8x16x16 (batch)": ((8, 16, 16), "batch", False)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("error: run with TRITON_INTERPRET=1 (the launcher checks for it on CPU tensors)", file=sys.stderr)
        return 2
    import torch

    from normkit_normalnorm.triton_kernels import launch, normality_triton

    class _NoLaunch:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    launch._k = lambda kernel, traced=False: _NoLaunch()
    torch.set_num_threads(1)
    calls = {}
    for name, (shape, partition, tokens) in CASES.items():
        x = torch.randn(shape, requires_grad=True)
        w, b = torch.ones(shape[1], requires_grad=True), torch.zeros(shape[1], requires_grad=True)
        dy = torch.ones(shape)

        def call(x=x, w=w, b=b, dy=dy, partition=partition, tokens=tokens):
            normality_triton(x, w, b, partition=partition, tokens=tokens, training=True, noise=0.5).backward(dy)

        call()
        calls[name] = call
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    for name, values in times.items():
        print(f"{name}: {statistics.median(values):.1f} us per training call (median of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
