"""CPU benchmark of normality normalization against torch's own norms and the step-by-step reference.

    .venv/bin/python benchmarks/bench_normalnorm_cpu.py              # default: 11 repeats
    .venv/bin/python benchmarks/bench_normalnorm_cpu.py --repeats 21 --reference
    .venv/bin/python benchmarks/bench_normalnorm_cpu.py --case 2 --repeats 5 --no-peak   # one case, quick
    .venv/bin/python benchmarks/bench_normalnorm_cpu.py --inference --threads 1   # eval forwards under no_grad

Two intra-op threads (`torch.set_num_threads(2)`; `--threads` to change). For each case it times one training step,
forward + backward of `sum(y * g)`, for the baseline torch layer and the normkit layer (default
`kernel=auto`: on CPU the compiled path, `normkit_normalnorm.compiled`, which runs these float32 cases in
rows.c); the layers take turns within every repeat (interleaved) and the table shows the median.
`--reference` adds the step-by-step autograd path (the layer's reference, forced with a no-op probe; the
stand-in for the authors' layers, which are written the same way) and how many times faster normkit is
than it. The first step of each normkit layer includes building rows.c (once per process) or compiling
where Inductor's code runs (once per configuration, cached on disk by Inductor): it is printed below the
table, not timed.

Peak memory: each (layer, case) runs again in a fresh process that builds the layer and input,
runs one warm-up step (which compiles, or loads the compiled code; compiling takes hundreds of MB
that are not the layer's), resets the kernel's peak-RSS counter (`echo 5 > /proc/self/clear_refs`),
runs two training steps and reports the peak resident set size (VmHWM) minus the RSS before them:
the extra memory a step needs at its peak (buffers kept between steps are in the RSS before).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

CASES = [  # name, spec, input shape, channel_dim, target ratio vs torch (issue 40's; gnn: bnn's applied to it)
    ("bnn vs BatchNorm2d", "bnn", (128, 64, 32, 32), 1, 2.0),
    ("bnn vs BatchNorm2d", "bnn", (128, 256, 8, 8), 1, 2.0),
    ("lnn vs LayerNorm", "lnn", (32, 65, 768), -1, 1.5),
    ("gnn vs GroupNorm", "gnn", (128, 64, 32, 32), 1, 2.0),
]
TORCH_MODULES: dict[str, Callable[[int], torch.nn.Module]] = {
    "bnn": torch.nn.BatchNorm2d, "lnn": torch.nn.LayerNorm, "gnn": lambda channels: torch.nn.GroupNorm(32, channels)}


def build(kind: str, spec: str, shape: tuple[int, ...], channel_dim: int) -> torch.nn.Module:
    channels = shape[channel_dim]
    if kind == "torch":
        return TORCH_MODULES[spec](channels)
    import normkit

    layer = normkit.build(spec, channels, channel_dim=channel_dim)
    if kind == "reference":
        layer.add_probe(lambda _layer, _values: None)  # any probe makes the layer take its reference path
    return layer


def step_fn(layer: torch.nn.Module, shape: tuple[int, ...], inference: bool = False) -> Callable[[], None]:
    """One training step (forward + backward), or with `inference` one forward of the eval layer under no_grad."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).requires_grad_(not inference)
    g = torch.randn(shape, generator=gen)
    if inference:
        layer.eval()

        def forward() -> None:
            with torch.no_grad():
                layer(x)

        return forward

    def step() -> None:
        x.grad = None
        layer(x).backward(g)

    return step


def time_case(spec: str, shape: tuple[int, ...], channel_dim: int, kinds: list[str],
              repeats: int, inference: bool = False,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    steps = {k: step_fn(build(k, spec, shape, channel_dim), shape, inference) for k in kinds}
    first = {}
    for kind, step in steps.items():  # warm-up: compiling, first-call allocations, workspace, lazy init
        start = time.perf_counter()
        step()
        first[kind] = time.perf_counter() - start
        step()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for kind, step in steps.items():
            start = clock()
            step()
            times[kind].append(clock() - start)
    return {**{k: 1000 * statistics.median(v) for k, v in times.items()},
            **{f"first {k}": 1000 * v for k, v in first.items()}}


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_child(kind: str, spec: str, shape: tuple[int, ...], channel_dim: int) -> None:
    """Runs in a fresh process: print the peak RSS increase (MB) of two training steps."""
    torch.set_num_threads(2)
    step = step_fn(build(kind, spec, shape, channel_dim), shape)
    step()  # warm-up: compiling is not the layer's memory
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    before = status_kb("VmRSS")
    step()
    step()
    print(json.dumps({"peak_mb": (status_kb("VmHWM") - before) / 1024}))


def peak_mb(kind: str, spec: str, shape: tuple[int, ...], channel_dim: int) -> float:
    args = [sys.executable, __file__, "--peak-child", json.dumps([kind, spec, list(shape), channel_dim])]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--reference", action="store_true", help="also time the step-by-step reference path")
    parser.add_argument("--case", type=int, action="append", choices=range(1, len(CASES) + 1),
                        help="time only this case (1-based row of the table; repeatable)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory columns (fresh processes)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with this thread's CPU time (with --threads 1 on a loaded machine: leaves out "
                             "waiting for a core)")
    parser.add_argument("--inference", action="store_true",
                        help="time one forward of the eval layers under torch.no_grad() instead (target <= 2x; "
                             "implies --no-peak; bnn's running statistics are the initial ones)")
    parser.add_argument("--peak-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_child:
        kind, spec, shape, channel_dim = json.loads(args.peak_child)
        peak_child(kind, spec, tuple(shape), channel_dim)
        return
    torch.set_num_threads(args.threads)
    args.no_peak = args.no_peak or args.inference
    kinds = ["torch", "normkit"] + (["reference"] if args.reference else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}, {args.repeats} interleaved repeats"
          + (", inference: eval forward under no_grad" if args.inference else ", training steps")
          + (", thread CPU time" if args.cpu_time else ", wall clock"))
    header = "| case | input | torch ms | normkit ms | ratio | target |"
    header += " reference ms | reference / normkit |" if args.reference else ""
    header += "" if args.no_peak else " torch peak MB | normkit peak MB |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    firsts = []
    for number, (name, spec, shape, channel_dim, target) in enumerate(CASES, 1):
        if args.case and number not in args.case:
            continue
        ms = time_case(spec, shape, channel_dim, kinds, args.repeats, args.inference,
                       time.thread_time if args.cpu_time else time.perf_counter)
        ratio = ms["normkit"] / ms["torch"]
        target = 2.0 if args.inference else target
        row = (f"| {name} | {tuple(shape)} | {ms['torch']:.1f} | {ms['normkit']:.1f} | {ratio:.1f}x | "
               f"<= {target:g}x {'(met)' if ratio <= target else '(missed)'} |")
        if args.reference:
            speedup = ms["reference"] / ms["normkit"]
            row += f" {ms['reference']:.1f} | {speedup:.1f}x {'(met)' if speedup >= 2 else '(missed)'} |"
        if not args.no_peak:
            peaks = [peak_mb(k, spec, shape, channel_dim) for k in ("torch", "normkit")]
            row += f" {peaks[0]:.0f} | {peaks[1]:.0f} |"
        print(row, flush=True)
        firsts.append(f"{spec} {tuple(shape)}: first normkit step {ms['first normkit'] / 1000:.1f} s")
    from normkit_normalnorm import compiled

    print(f"load average {os.getloadavg()[0]:.1f} at the end; " + "; ".join(firsts))
    print("compiled on first use (s): " + (", ".join(f"{k} {v:.1f}" for k, v in compiled.report.items())
                                            or "nothing (compiled path off, cached or not taken)"))


if __name__ == "__main__":
    main()
