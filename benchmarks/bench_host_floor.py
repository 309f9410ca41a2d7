"""How far the host work of the composed norms could fall without changing a value (tiny shapes, one thread).

    .venv/bin/python benchmarks/bench_host_floor.py                  # bnn, lnn, gn+pn; 15 rounds of 200 calls
    .venv/bin/python benchmarks/bench_host_floor.py --case lnn --rounds 31

bench_host.py times one training call of a normkit layer against torch's module. This times, beside both, the
cheapest call that computes the same values with the same kernels:
- bnn, lnn: `rows.GroupsFunction.apply` called directly with the arguments the layer passes it (captured once),
  so the layer's own dispatch (module call, checks, choosing the path) is left out; the autograd Function, its
  torch ops and rows.c remain (the running-statistics counter is not bumped: one op fewer for bnn).
- gn+pn: `pn_same_ops.cpp`, proxynorm's ReluProxyNorm written as a C++ autograd Function running the same ATen
  ops in the same order, built with torch.utils.cpp_extension (needs a C++ compiler and ninja; about 40 s the
  first time, cached after); its output and gradients are checked bit for bit against the layer's first.
What is left above torch's module in these columns is the cost of the ops and of autograd, which only fusing the
arithmetic into fewer kernels (other roundings) would remove. Same timing as bench_host.py: `sum(y * g)`
backward with the input requiring grad, every callable timed in turn per round, median per call: bench_host.py's
cases, training call and timer.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import bench_host  # this folder's: the cases, the training call and its timing
import torch
from torch import nn

import normkit
from normkit_normalnorm import rows
from normkit_proxynorm.proxy import proxy_quantiles

NAMES = ["bnn", "lnn", "gn+pn"]  # bench_host.py's cases timed here


def function_alone(layer: nn.Module, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """rows.GroupsFunction.apply with the arguments the layer gives it for `x` (captured from one call)."""
    captured: list[tuple] = []
    original = rows.normality_groups

    def capture(*args: object) -> torch.Tensor:
        captured.append(args)
        return original(*args)

    rows.normality_groups = capture
    try:
        layer(x)
    finally:
        rows.normality_groups = original
    if not captured:
        raise SystemExit("the layer did not take rows.c's grouped step (NORMKIT_NN_ROWS/NORMKIT_NN_COMPILE off?)")
    rest = captured[0][1:]
    return lambda inp: rows.GroupsFunction.apply(inp, *rest)


def same_ops_cpp(layer: nn.Module, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """pn_same_ops.cpp's function on the layer's parameters, after checking it against the layer bit for bit."""
    from torch.utils.cpp_extension import load

    source = Path(__file__).with_name("pn_same_ops.cpp")
    extension = load("normkit_pn_same_ops", [str(source)], extra_cflags=["-O2"], verbose=False)
    pn = layer.post
    u = proxy_quantiles(pn.samples)
    row, basis = u.view(1, 1, -1), torch.stack([torch.ones_like(u), u], 1)
    groups, standardize_eps = layer.partition.groups_per_sample(layer.num_channels), layer.steps[0].eps
    params = (layer.weight, layer.bias, layer.proxy_beta, layer.proxy_gamma)

    def forward(inp: torch.Tensor) -> torch.Tensor:
        n, c = inp.shape[:2]
        return extension.relu_proxy(inp.reshape(n, c, -1), *params, row, basis, pn.eps, groups,
                                    standardize_eps).reshape(inp.shape)

    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for f in (layer, forward):
        for p in (x, *params):
            p.grad = None
        out = f(x)
        out.backward(g)
        results.append([out.detach().clone(), *(p.grad.clone() for p in (x, *params))])
    if not all(torch.equal(a, b) for a, b in zip(*results, strict=True)):
        raise SystemExit("pn_same_ops.cpp does not reproduce the layer bit for bit: it no longer mirrors "
                         "normkit_proxynorm.proxy.ReluProxyNorm")
    return forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--case", action="append", choices=NAMES)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, load average {os.getloadavg()[0]:.1f} at the start, "
          f"{args.rounds} rounds of {args.calls} calls, wall clock")
    print("| layer | input | torch module us | normkit layer us (ratio) | same values, least host work us (ratio) |")
    print("|---|---|---|---|---|")
    for name, spec, shape, channel_dim, native, _ in bench_host.CASES:
        if name not in (args.case or NAMES):
            continue
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
        layer = normkit.build(spec, shape[channel_dim], channel_dim=channel_dim)
        floor = same_ops_cpp(layer, x) if name == "gn+pn" else function_alone(layer, x)
        calls = {kind: bench_host.training_call(f, shape)
                 for kind, f in (("torch", native(shape[channel_dim])), ("layer", layer), ("floor", floor))}
        for call in calls.values():  # warm-up
            bench_host.per_call_seconds(call, max(args.calls // 5, 3))
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.rounds):
            for kind, call in calls.items():
                times[kind].append(1e6 * bench_host.per_call_seconds(call, args.calls))
        us = {k: statistics.median(v) for k, v in times.items()}
        what = "C++, same ops" if name == "gn+pn" else "Function alone"
        print(f"| {name} | {'x'.join(map(str, shape))} | {us['torch']:.0f} | {us['layer']:.0f} "
              f"({us['layer'] / us['torch']:.2f}x) | {what}: {us['floor']:.0f} ({us['floor'] / us['torch']:.2f}x) |",
              flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
