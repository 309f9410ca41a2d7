"""What each launch of the normality norm's Triton kernels costs a GPU, measured without one.

For every launch the launcher makes at the GPU benchmark's shapes (bnn 128x64x32x32 and 128x512x4x4,
lnn 32x65x768 and 8x1024x4096; fp32 and bf16; noise on and off), this compiles the kernel with the
specialization Triton's JIT applies at that launch (ints equal to 1 become constants, ints and
pointers divisible by 16 get divisibility hints) for each target, disassembles it with the
cuobjdump Triton bundles, and prints the hot-path SASS instructions per element (one thread's
longest common path, each loop body once, times the threads of a program, over the elements it
handles), registers and spill bytes. Beside them: a plain register-resident LayerNorm in Triton
compiled the same way, and the HBM issue budget, the instructions per element an H100 can issue in
the time its HBM moves the launch's activation bytes (132 SMs x 4 schedulers x 1.755 GHz over
3.35 TB/s = 8.85 instructions per byte). A launch above its budget is issue-bound whatever its
memory traffic. Runs on a CPU (no device, no driver):

    python benchmarks/kernel_cost.py [--arch sm_80,sm_90] [--dtype fp32,bf16] [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from normkit_normalnorm.triton_kernels import compile_cost
from normkit_normalnorm.triton_kernels.geometry import Options, geometry

ISSUE_PER_BYTE = 132 * 4 * 32 * 1.755e9 / 3.35e12  # H100 SXM: thread-instructions issued per HBM byte
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# (name, layer, input shape): the bench_normalnorm_gpu.py shapes.
SHAPES = [("bnn 128x64x32x32", "bnn", (128, 64, 32, 32)), ("bnn 128x512x4x4", "bnn", (128, 512, 4, 4)),
          ("lnn 32x65x768", "lnn", (32, 65, 768)), ("lnn 8x1024x4096", "lnn", (8, 1024, 4096))]
# Targets of issue 40 (fp32, noise on, sm_90), instructions per element: per pass on the row path,
# all passes of one direction together on the split path.
TARGETS = {("row", "fwd"): 120, ("row", "bwd"): 150, ("split", "fwd"): 400, ("split", "bwd"): 300}


@triton.jit
def layer_norm_forward(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, stride, N, eps, BLOCK: tl.constexpr):
    """The reference: a register-resident LayerNorm forward (Triton tutorial / Liger style)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=1.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride + cols, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layer_norm_backward(x_ptr, dy_ptr, dx_ptr, w_ptr, mean_ptr, rstd_ptr, dw_ptr, db_ptr, stride, N, rows,
                        rows_per_program, BLOCK: tl.constexpr):
    """The reference backward: programs loop over rows, dw/db partials accumulated in registers."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    dw = tl.zeros([BLOCK], tl.float32)
    db = tl.zeros([BLOCK], tl.float32)
    for row in range(pid * rows_per_program, tl.minimum(pid * rows_per_program + rows_per_program, rows)):
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - tl.load(mean_ptr + row)) * tl.load(rstd_ptr + row)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * tl.load(rstd_ptr + row)
        tl.store(dx_ptr + row * stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(dw_ptr + pid * N + cols, dw, mask=mask)
    tl.store(db_ptr + pid * N + cols, db, mask=mask)


@dataclass
class Row:
    case: str
    dtype: str
    noise: bool
    direction: str  # fwd / bwd
    path: str  # row / split / reference
    kernel: str
    arch: str
    warps: int
    registers: int
    spill_bytes: int
    per_element: float
    budget: float


def _ncs(layer: str, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, str, bool]:
    """The (N, C, S) view the layer hands the kernel (uninitialised: nothing runs)."""
    x = torch.empty(shape, dtype=dtype)
    if layer == "lnn":  # channels last: (N, T, C) -> (N, C, T) without a copy
        return x.reshape(shape[0], -1, shape[-1]).transpose(1, 2), "layer", True
    return x.reshape(shape[0], shape[1], -1), "batch", False


def launcher_launches(layer: str, shape: tuple[int, ...], dtype: torch.dtype, noise: bool, sms: int
                      ) -> list[tuple[str, compile_cost.Launch, int]]:
    """(direction, launch, elements per hot-path pass) of one training step, as the launcher makes them."""
    from normkit_normalnorm.triton_kernels import launch
    from normkit_normalnorm.triton_kernels.config import config

    x3, partition, tokens = _ncs(layer, shape, dtype)
    geo = geometry(x3.shape, partition, 1, tokens)
    opts = Options(True, 1e-5, 1.0, 1.0 if noise else 0.0, None, None, False)
    c = geo.c
    weight, bias = torch.empty(c), torch.empty(c)
    seed = torch.zeros(1, dtype=torch.int64) if noise else None  # as normality_triton passes it
    running = (torch.empty(c), torch.empty(c), torch.empty(c), 0.1) if partition == "batch" else None
    real = config.backward_programs
    config.backward_programs = lambda device: 4 * sms  # what a GPU with `sms` SMs gets
    try:
        with compile_cost.record_launches() as fwd:
            _, stats = launch.forward(x3, weight, bias, geo, opts, seed, dtype, running)
        with compile_cost.record_launches() as bwd:
            launch.backward(torch.empty_like(x3), x3, weight, stats, geo, opts, False, seed, True)
    finally:
        config.backward_programs = real
    out = []
    for direction, launches in (("fwd", fwd), ("bwd", bwd)):
        for item in launches:
            passes = geo.n_groups if item.name == "row_backward" else math.prod(item.grid)
            out.append((direction, item, x3.numel() // passes))
    return out


def reference_launches(dtype: torch.dtype, rows: int, n: int, sms: int) -> list[tuple[str, compile_cost.Launch, int]]:
    """The plain LayerNorm at the same rows, launched as the tutorial does."""
    x = torch.empty(rows, n, dtype=dtype)
    w, b = torch.empty(n), torch.empty(n)
    mean, rstd = torch.empty(rows), torch.empty(rows)
    block = triton.next_power_of_2(n)
    warps = min(max(block // 256, 1), 8)
    programs = min(rows, 4 * sms)
    per = math.ceil(rows / programs)
    p = compile_cost._pointer
    fwd = compile_cost.Launch(layer_norm_forward, (rows,), tuple(map(p, (x, x, w, b, mean, rstd, n, n, 1e-5))),
                              {"BLOCK": block, "num_warps": warps})
    parts = torch.empty(programs, n)
    bwd = compile_cost.Launch(layer_norm_backward, (programs,),
                              tuple(map(p, (x, x, x, w, mean, rstd, parts, parts, n, n, rows, per))),
                              {"BLOCK": block, "num_warps": warps})
    return [("fwd", fwd, n), ("bwd", bwd, n)]


def _path(name: str) -> str:
    if name.startswith("layer_norm"):
        return "reference"
    return "row" if name.startswith("row") else "split"


def measure(job: tuple) -> Row:
    case, dtype, noise, direction, item, elements, arch = job
    cost = compile_cost.sass_cost(compile_cost.compile_launch(item, arch))
    read, write = item.activation_bytes()
    per_element = cost.hot_path * 32 * item.num_warps / elements
    return Row(case, dtype, noise, direction, _path(item.name), item.name, arch, item.num_warps, cost.registers,
               cost.spill_bytes, round(per_element, 1), round(ISSUE_PER_BYTE * (read + write), 1))


def jobs(archs: list[str], dtypes: list[str], sms: int) -> list[tuple]:
    work = []
    for (case, layer, shape), dtype in ((s, d) for s in SHAPES for d in dtypes):
        for noise in (True, False):
            for direction, item, elements in launcher_launches(layer, shape, DTYPES[dtype], noise, sms):
                work += [(case, dtype, noise, direction, item, elements, arch) for arch in archs]
    for n in (768, 4096):
        for dtype in dtypes:
            for direction, item, elements in reference_launches(DTYPES[dtype], 2080 if n == 768 else 8192, n, sms):
                work += [(f"LayerNorm N={n}", dtype, False, direction, item, elements, arch) for arch in archs]
    return work


def _unique(work: list[tuple]) -> list[tuple]:
    """Launches with equal kernel, specialization and options compile to the same code: keep one."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    seen: dict = {}
    for job in work:
        item, arch = job[4], job[6]
        fn = item.kernel
        binder = create_function_from_signature(fn.signature, fn.params, make_backend(compile_cost._target(arch)))
        _, spec, options = binder(*item.args, **item.kwargs)
        key = (fn.fn.__name__, arch, repr(spec), repr(sorted(options.items())), job[5])
        seen.setdefault(key, []).append(job)
    return list(seen.values())


def run(archs: list[str], dtypes: list[str], sms: int, jobs_n: int, only: str = "", out=sys.stdout) -> list[Row]:
    groups = _unique([j for j in jobs(archs, dtypes, sms) if only in j[0]])
    with ProcessPoolExecutor(jobs_n) if jobs_n > 1 else nullcontext() as pool:
        firsts = list(pool.map(measure, [g[0] for g in groups]) if pool else map(measure, [g[0] for g in groups]))
    rows = []
    for group, first in zip(groups, firsts, strict=True):
        for case, dtype, noise, direction, _item, _elements, arch in group:
            rows.append(Row(**{**asdict(first), "case": case, "dtype": dtype, "noise": noise,
                               "direction": direction, "arch": arch}))
    report(rows, out)
    return rows


def report(rows: list[Row], out=sys.stdout) -> int:
    """Print one line per launch, then one per direction with its target; return the targets missed."""
    rows = sorted(rows, key=lambda r: (r.case.startswith("LayerNorm"), r.case, r.dtype, not r.noise, r.arch,
                                       r.direction == "bwd"))
    out.write("| case | dtype | noise | arch | dir | kernel | warps | regs | spill B | instr/elem | HBM budget |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        out.write(f"| {r.case} | {r.dtype} | {'on' if r.noise else 'off'} | {r.arch} | {r.direction} | {r.kernel} | "
                  f"{r.warps} | {r.registers} | {r.spill_bytes} | {r.per_element:g} | {r.budget:g} |\n")
    out.write("\nPer direction (row path: the worst pass; split path: all passes together). Predicted µs: the "
              "model's H100 time, each pass max(activation bytes / 3.35 TB/s, instructions / 2.97e13 per s), "
              "summed; a prediction, not a measurement (launch overhead and L2 not modelled):\n\n"
              "| case | dtype | noise | arch | dir | path | passes | instr/elem | max regs | spill B | "
              "predicted µs | target |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.case, r.dtype, r.noise, r.arch, r.direction), []).append(r)
    missed = 0
    for (case, dtype, noise, arch, direction), members in groups.items():
        path = "split" if any(m.path == "split" for m in members) else members[0].path
        value = sum(m.per_element for m in members) if path == "split" else max(m.per_element for m in members)
        target = TARGETS.get((path, direction)) if dtype == "fp32" and noise and arch == "sm_90" else None
        met = target is None or value <= target
        missed += not met
        verdict = "" if target is None else f"{target} ({'met' if met else 'MISSED'})"
        out.write(f"| {case} | {dtype} | {'on' if noise else 'off'} | {arch} | {direction} | {path} | {len(members)} | "
                  f"{value:.1f} | {max(m.registers for m in members)} | {sum(m.spill_bytes for m in members)} | "
                  f"{predicted_us(case, members)} | {verdict} |\n")
    return missed


def predicted_us(case: str, members: list[Row]) -> str:
    """The roofline-and-issue model's H100 time of one direction at the case's shape (µs), as text."""
    shape = next((shape for name, _, shape in SHAPES if name == case), None)
    if shape is None:
        return "-"
    numel = math.prod(shape)
    issue_rate = ISSUE_PER_BYTE * 3.35e12  # thread-instructions per second
    seconds = sum(max(numel * m.budget / ISSUE_PER_BYTE / 3.35e12, numel * m.per_element / issue_rate)
                  for m in members)
    return f"{seconds * 1e6:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_80,sm_90")
    parser.add_argument("--dtype", default="fp32,bf16")
    parser.add_argument("--sms", type=int, default=132, help="SMs of the GPU the row backward is sized for")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--case", default="", help="only cases whose name contains this (e.g. lnn)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--load", help="print the tables of rows a previous --json wrote (no compiling)")
    args = parser.parse_args(argv)
    if args.load:
        with open(args.load) as fh:
            report([Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__}) for r in json.load(fh)])
        return 0
    archs = [a for a in args.arch.split(",") if a]
    dtypes = [d for d in args.dtype.split(",") if d]
    if any(d not in DTYPES for d in dtypes) or any(not a.startswith("sm_") for a in archs):
        print("error: --dtype takes fp32,bf16 and --arch targets like sm_80,sm_90", file=sys.stderr)
        return 2
    rows = run(archs, dtypes, args.sms, max(1, args.jobs), args.case)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(r) for r in rows], fh, indent=1)
    spilled = [r for r in rows if r.spill_bytes]
    print(f"\n{len(rows)} launches compiled, {len(spilled)} with spills")
    return 0


if __name__ == "__main__":
    sys.exit(main())
