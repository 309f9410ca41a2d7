"""Host-work benchmark: one training call of a normkit layer at tiny shapes, against torch's own module.

    .venv/bin/python benchmarks/bench_host.py                    # default: 15 rounds of 50 calls
    .venv/bin/python benchmarks/bench_host.py --rounds 31 --calls 100
    .venv/bin/python benchmarks/bench_host.py --case lnn --case bnn
    .venv/bin/python benchmarks/bench_host.py --cpu-time          # the thread's CPU time (a loaded machine)
    .venv/bin/python benchmarks/bench_host.py --ops               # also the torch ops per call (exact)
    .venv/bin/python benchmarks/bench_host.py --instructions      # x86 instructions per call (valgrind), no timing

At these shapes (a few thousand values) the arithmetic costs a few microseconds, so what is timed
is the host work per call: Python, argument checks, the number of aten operations and autograd
nodes. One call is forward + backward of `sum(y * g)` with the input requiring grad, on one thread
(`torch.set_num_threads(1)`). Each round times a block of `--calls` calls of every layer in turn
(normkit and its torch module interleaved, so load drifts affect both alike); the table gives the
median over rounds of the time per call, and the ratio to torch's module. Targets (issue 40): the
plain norms at most 1.3x their torch module, the composed ones (gn+pn, bnn, lnn) at most 2x.
`--cpu-time` times with the thread's CPU time instead of the wall clock: on a machine shared with other
jobs it leaves out the time slices spent waiting for a core (it still includes cache and memory
contention), so it is the closer estimate of the idle figures there. `--ops` adds the aten operations one
training call dispatches (counted with a `TorchDispatchMode`, after the warm-up): a figure no load changes.
`--instructions` counts instead of timing: the machine instructions one training call executes (Python,
torch, rows.c, libc: everything in the process), under valgrind's callgrind with counting switched on
(`callgrind_control`) only around `--calls` calls after the warm-up, averaged. Exact up to a few hundred
instructions and independent of load, so it shows what a change saved on a noisy machine; it is not
time (instructions differ in cost: rows.c's vector arithmetic runs fewer of them per cycle than Python's
interpreter). Needs valgrind; a few minutes (the start-up runs under valgrind too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# name, normkit spec, input shape, channel_dim, torch module factory (channels -> module), target ratio
CASES: list[tuple[str, str, tuple[int, ...], int, Callable[[int], nn.Module], float]] = [
    ("bn", "bn", (8, 16, 4, 4), 1, nn.BatchNorm2d, 1.3),
    ("gn", "gn(groups=4)", (8, 16, 4, 4), 1, lambda c: nn.GroupNorm(4, c), 1.3),
    ("ln", "ln", (4, 8, 32), -1, nn.LayerNorm, 1.3),
    ("rms", "rms", (4, 8, 32), -1, nn.RMSNorm, 1.3),
    ("gn+pn", "gn+pn", (8, 16, 4, 4), 1, lambda c: nn.GroupNorm(8, c), 2.0),
    ("bnn", "bnn", (8, 16, 4, 4), 1, nn.BatchNorm2d, 2.0),
    ("lnn", "lnn", (4, 8, 32), -1, nn.LayerNorm, 2.0),
]
NAMES = [case[0] for case in CASES]


def training_call(layer: nn.Module, shape: tuple[int, ...]) -> Callable[[], None]:
    """One forward + backward of `sum(y * g)`, the input requiring grad (as inside a network)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).requires_grad_(True)
    g = torch.randn(shape, generator=gen)

    def call() -> None:
        x.grad = None
        layer(x).backward(g)

    return call


class _CountOps(TorchDispatchMode):
    """Counts the aten operations dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.count += 1
        return func(*args, **(kwargs or {}))


def ops_per_call(call: Callable[[], None]) -> int:
    """The aten operations of one call (forward, backward and gradient accumulation)."""
    with _CountOps() as counter:
        call()
    return counter.count


def per_call_seconds(call: Callable[[], None], calls: int, clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    for _ in range(calls):
        call()
    return (clock() - start) / calls


def time_case(spec: str, shape: tuple[int, ...], channel_dim: int, native: Callable[[int], nn.Module],
              rounds: int, calls: int, clock: Callable[[], float] = time.perf_counter
              ) -> tuple[float, float, int, int]:
    """Median microseconds per call of (normkit layer, torch module), blocks interleaved per round, and the
    aten operations per call of each."""
    import normkit

    channels = shape[channel_dim]
    pair = {"normkit": training_call(normkit.build(spec, channels, channel_dim=channel_dim), shape),
            "torch": training_call(native(channels), shape)}
    for call in pair.values():  # warm-up: first-call allocations, lazy imports, caches
        per_call_seconds(call, max(calls // 5, 3))
    times: dict[str, list[float]] = {k: [] for k in pair}
    for _ in range(rounds):
        for kind, call in pair.items():
            times[kind].append(per_call_seconds(call, calls, clock))
    return (1e6 * statistics.median(times["normkit"]), 1e6 * statistics.median(times["torch"]),
            ops_per_call(pair["normkit"]), ops_per_call(pair["torch"]))


def count_child(names: list[str], calls: int, folder: str) -> None:
    """Runs under callgrind (counting off): per case, warm both layers up, then count `calls` calls of each,
    dumping the counts to `folder` as `<case>-<kind>` (callgrind_control switches counting on this process)."""
    import normkit

    pid = str(os.getpid())
    for name, spec, shape, channel_dim, native, _ in CASES:
        if name not in names:
            continue
        channels = shape[channel_dim]
        pair = {"normkit": training_call(normkit.build(spec, channels, channel_dim=channel_dim), shape),
                "torch": training_call(native(channels), shape)}
        for kind, call in pair.items():
            for _ in range(20):
                call()
            subprocess.run(["callgrind_control", "--zero", pid], capture_output=True, check=True)
            subprocess.run(["callgrind_control", "--instr=on", pid], capture_output=True, check=True)
            for _ in range(calls):
                call()
            subprocess.run(["callgrind_control", "--instr=off", pid], capture_output=True, check=True)
            subprocess.run(["callgrind_control", f"--dump={name}-{kind}", pid], capture_output=True, check=True)


def instructions(names: list[str], calls: int) -> dict[str, dict[str, float]]:
    """Instructions per training call of each case's normkit layer and torch module (see the docstring)."""
    with tempfile.TemporaryDirectory(prefix="normkit-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                   sys.executable, __file__, "--count-child", folder, "--calls", str(calls),
                   *(arg for name in names for arg in ("--case", name))]
        subprocess.run(command, capture_output=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        counts: dict[str, dict[str, float]] = {}
        for dump in Path(folder).glob("callgrind.out.*"):
            text = dump.read_text(errors="replace")
            label = next(line.split()[-1] for line in text.splitlines() if line.startswith("desc: Trigger"))
            total = next(int(line.split()[1]) for line in text.splitlines() if line.startswith("totals:"))
            name, kind = label.rsplit("-", 1)
            counts.setdefault(name, {})[kind] = total / calls
    return counts


def print_instructions(names: list[str], calls: int) -> None:
    counts = instructions(names, calls)
    print("| layer | input | torch module | torch instructions | normkit instructions | ratio |")
    print("|---|---|---|---|---|---|")
    for name, _, shape, channel_dim, native, _ in CASES:
        if name in counts:
            theirs, ours = counts[name]["torch"], counts[name]["normkit"]
            module = type(native(shape[channel_dim])).__name__
            print(f"| {name} | {'x'.join(map(str, shape))} | {module} | {theirs / 1e3:.0f}k | {ours / 1e3:.0f}k | "
                  f"{ours / theirs:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median reported)")
    parser.add_argument("--calls", type=int, default=50, help="training calls per layer per round")
    parser.add_argument("--case", action="append", choices=NAMES, help="time only this layer (repeatable)")
    parser.add_argument("--cpu-time", action="store_true", help="the thread's CPU time instead of the wall clock")
    parser.add_argument("--ops", action="store_true", help="also print the aten operations per training call")
    parser.add_argument("--instructions", action="store_true",
                        help="count machine instructions per call under valgrind instead of timing")
    parser.add_argument("--count-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.count_child:
        count_child(args.case or NAMES, args.calls, args.count_child)
        return
    if args.instructions:
        print(f"torch {torch.__version__}, 1 thread, instructions per training call (callgrind, mean of "
              f"{args.calls} calls after 20 warm-up calls)")
        print_instructions(args.case or NAMES, args.calls)
        return
    print(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f} at the start, {args.rounds} rounds of {args.calls} calls, "
          f"{'thread CPU time' if args.cpu_time else 'wall clock'}")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    ops_head, ops_rule = (" torch ops | normkit ops |", "---|---|") if args.ops else ("", "")
    print(f"| layer | input | torch module | torch us | normkit us | ratio | target |{ops_head}")
    print(f"|---|---|---|---|---|---|---|{ops_rule}")
    for name, spec, shape, channel_dim, native, target in CASES:
        if args.case and name not in args.case:
            continue
        ours, theirs, our_ops, their_ops = time_case(spec, shape, channel_dim, native, args.rounds, args.calls, clock)
        ratio = ours / theirs
        module = type(native(shape[channel_dim])).__name__
        ops = f" {their_ops} | {our_ops} |" if args.ops else ""
        print(f"| {name} | {'x'.join(map(str, shape))} | {module} | {theirs:.0f} | {ours:.0f} | {ratio:.2f}x | "
              f"<= {target:.1f}x {'(met)' if ratio <= target else '(missed)'} |{ops}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
