"""Ahead-of-time compile check: every kernel the launcher can launch, compiled for real GPU targets.

The interpreter checks the kernels' logic but not that they compile for a GPU, how many registers
they take or whether they spill. Each configuration here is a launch the launcher (`launch.py`)
really makes, recorded at a representative call (`compile_cost.record_launches`) and compiled with
the specialization Triton's JIT applies to those arguments (ints equal to 1 as constants, 16-divisible
ints and pointers with divisibility hints) for a named target without a device; the bundled `ptxas -v`
then reports registers, spill bytes and shared memory, so the figures are those of the code that runs.
Run it with `python -m normkit_normalnorm.triton_kernels.aot --arch sm_80,sm_90` (exit 1 on a failure
or spill).
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

from normkit_normalnorm.triton_kernels.compile_cost import Launch

DTYPES = ("fp32", "bf16", "fp16")
# Label of a launch: the constexprs that select its code (the rest are the same in every launch).
_LABEL_KEYS = ("PART", "T", "M", "BLOCK", "BR", "BT", "HAS_W", "HAS_B", "NOISE", "CLAMP_MIN", "CLAMP_MAX", "DETACH",
               "UPDATE", "USE_RUNNING", "LAMBDA_GRAD", "CHANNELS_LAST")


@dataclass(frozen=True)
class Case:
    """One compile: a launch the launcher made, its kernel, input dtype and warps."""

    kernel: str
    dtype: str
    label: str
    num_warps: int
    launch: Launch = field(compare=False, repr=False)


@dataclass(frozen=True)
class Result:
    case: Case
    arch: str
    registers: int
    spill_store: int
    spill_load: int
    shared: int
    ptx_lines: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.spill_store == 0 and self.spill_load == 0


def _kernels() -> dict:
    from normkit_normalnorm.triton_kernels import pointwise_kernels, row_kernels, split_kernels

    return {name: getattr(mod, name) for mod, names in (
        (row_kernels, ("row_forward", "row_backward")),
        (split_kernels, ("split_moments", "split_newton", "split_transform", "split_spread", "split_output",
                         "split_backward_reduce", "split_backward_input")),
        (pointwise_kernels, ("eval_pointwise",))) for name in names}


def _label(item: Launch) -> str:
    return " ".join(f"{k}={int(item.kwargs[k])}" for k in _LABEL_KEYS if k in item.kwargs)


# Representative calls: (partition, tokens, (N, C, S)). The largest row group each row kernel takes
# (4096 values: the most warps, the fewest registers per thread), a small strided one, and split groups
# with tiles of whole short rows, of one long row, and of a one-column (token) layout.
_SHAPES = (("layer", True, (2, 4096, 3)), ("batch", False, (8, 3, 5)), ("batch", False, (4, 2, 1024)),
           ("layer", False, (2, 3, 5000)), ("layer", True, (2, 8192, 2)))
_FLAGS = ("affine", "noise", "clamp", "detach", "running")


def _calls(full: bool) -> Iterator[tuple[str, bool, tuple[int, int, int], dict[str, bool]]]:
    settings = (itertools.product((False, True), repeat=len(_FLAGS)) if full
                else ((True,) * len(_FLAGS), (False,) * len(_FLAGS)))
    for values in settings:
        flags = dict(zip(_FLAGS, values, strict=True))
        for partition, tokens, shape in _SHAPES:
            yield partition, tokens, shape, flags
    yield "batch", False, (8, 3, 5), {"eval": True, "affine": True, "clamp": True, "running": True}
    yield "batch", False, (8, 3, 5), {"eval": True}


def _record(partition: str, tokens: bool, shape: tuple[int, int, int], flags: dict[str, bool], dtype: str
            ) -> list[Launch]:
    """The launches of one training (or eval) forward and its backward, recorded, not run."""
    import torch

    from normkit_normalnorm.triton_kernels import compile_cost, launch
    from normkit_normalnorm.triton_kernels.geometry import Options, geometry

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    n, c, s = shape
    x3 = torch.empty(n, s, c, dtype=torch_dtype).transpose(1, 2) if tokens else torch.empty(shape, dtype=torch_dtype)
    geo = geometry(x3.shape, partition, 1, tokens)
    clamp = (0.5, 1.5) if flags.get("clamp") else (None, None)
    training = not flags.get("eval")
    opts = Options(training, 1e-5, 1.0, 0.5 if flags.get("noise") else 0.0, *clamp, bool(flags.get("detach")))
    affine = torch.empty(c) if flags.get("affine") else None
    tracked = flags.get("running") and partition == "batch"
    running = (torch.empty(c), torch.empty(c), torch.empty(c))
    seed = torch.zeros(1, dtype=torch.int64) if opts.noise > 0 else None  # as normality_triton passes it
    with compile_cost.record_launches() as launches:
        if tracked and not training:
            launch.eval_forward(x3, affine, affine, running, geo, opts, torch_dtype)
            stats = torch.empty(geo.n_groups, 9)
        else:
            _, stats = launch.forward(x3, affine, affine, geo, opts, seed, torch_dtype,
                                      (*running, 0.1) if tracked else None)
        launch.backward(torch.empty_like(x3), x3, affine, stats, geo, opts, bool(tracked and not training), seed,
                        affine is not None)
    return launches


def launch_cases(full: bool, dtypes: tuple[str, ...] = DTYPES) -> Iterator[Case]:
    """The launches the launcher makes at the representative calls, once per distinct compile.

    `full`: every combination of the feature flags (affine, noise, clamp, detach, running buffers) at
    every representative shape; otherwise all on and all off.
    """
    seen = set()
    for dtype in dtypes:
        for partition, tokens, shape, flags in _calls(full):
            for item in _record(partition, tokens, shape, flags, dtype):
                case = Case(item.name, dtype, _label(item), item.num_warps, item)
                if case not in seen:
                    seen.add(case)
                    yield case


def compile_case(case: Case, arch: str) -> Result:
    """Compile one launch for `arch` ("sm_80", "sm_90", ...) as the JIT would and read its resource use."""
    from normkit_normalnorm.triton_kernels.compile_cost import compile_launch, ptxas_report

    try:
        compiled = compile_launch(case.launch, arch)
        ptx = compiled.asm["ptx"]
        regs, st, ld, _ = ptxas_report(ptx)
        return Result(case, arch, regs, st, ld, int(compiled.metadata.shared), _instructions(ptx))
    except Exception as exc:  # noqa: BLE001 - any compiler failure is a row of the table and exit 1
        return Result(case, arch, 0, 0, 0, 0, 0, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")


def _instructions(ptx: str) -> int:
    """PTX instruction lines (tab-indented, ending in ';')."""
    return sum(1 for line in ptx.splitlines() if line.startswith("\t") and line.rstrip().endswith(";"))


def _compile(job: tuple[Case, str]) -> Result:
    return compile_case(*job)


def run(archs: list[str], full: bool, out=sys.stdout, jobs: int = 1, dtypes: tuple[str, ...] = DTYPES
        ) -> list[Result]:
    """Compile the matrix for every arch (`jobs` processes), print one markdown row per compile."""
    out.write("| kernel | dtype | warps | constexprs | arch | regs | spill st/ld B | smem B | PTX instr |\n")
    out.write("|---|---|---|---|---|---|---|---|---|\n")
    work = [(case, arch) for case in launch_cases(full, dtypes) for arch in archs]
    results = []
    with ProcessPoolExecutor(jobs) if jobs > 1 else nullcontext() as pool:
        for r in (pool.map(_compile, work) if pool else map(_compile, work)):
            case, arch = r.case, r.arch
            results.append(r)
            status = r.error or f"{r.registers} | {r.spill_store}/{r.spill_load} | {r.shared} | {r.ptx_lines}"
            out.write(f"| {case.kernel} | {case.dtype} | {case.num_warps} | {case.label} | {arch} | {status} |\n")
            out.flush()
    bad = [r for r in results if not r.ok]
    out.write(f"\n{len(results)} compiles, {len(bad)} failed or spilled\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_80,sm_90", help="comma-separated targets, e.g. sm_80,sm_90")
    parser.add_argument("--full", action="store_true", help="every flag combination (hours)")
    parser.add_argument("--jobs", type=int, default=1, help="compile processes")
    parser.add_argument("--dtype", default=",".join(DTYPES), help="comma-separated input dtypes: fp32,bf16,fp16")
    args = parser.parse_args(argv)
    dtypes = tuple(d.strip() for d in args.dtype.split(",") if d.strip())
    if not dtypes or any(d not in DTYPES for d in dtypes):
        print(f"error: unknown dtype in {args.dtype!r}; give some of fp32,bf16,fp16", file=sys.stderr)
        return 2
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    bad_arch = [a for a in archs if not re.fullmatch(r"sm_\d+a?", a)]
    if bad_arch:
        print(f"error: unknown arch {bad_arch[0]!r}; give targets like sm_80,sm_90", file=sys.stderr)
        return 2
    results = run(archs, args.full, jobs=max(1, args.jobs), dtypes=dtypes)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
