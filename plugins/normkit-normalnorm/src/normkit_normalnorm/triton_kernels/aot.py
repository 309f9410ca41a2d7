"""Ahead-of-time compile check: every kernel the launcher can launch, compiled for real GPU targets.

The interpreter checks the kernels' logic but not that they compile for a GPU, how many registers
they take or whether they spill. Triton compiles for a named target without a device
(`triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`); the bundled `ptxas -v`
then reports registers, spill bytes and shared memory per configuration. Run it with
`python -m normkit_normalnorm.triton_kernels.aot --arch sm_80,sm_90` (exit 1 on a failure or spill).
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
# Pointers holding the activation (input, output, gradients) take the input dtype; all else is fp32.
_ACTIVATION_PTRS = {"x_ptr", "y_ptr", "dy_ptr", "dx_ptr", "w_ptr", "b_ptr"}
_FLOAT_SCALARS = {"eps", "sqrt_eps", "alpha", "noise", "lmin", "lmax", "momentum", "unbias"}


@dataclass(frozen=True)
class Case:
    """One compile: a kernel, the input dtype, its constexpr values and its launch warps."""

    kernel: str
    dtype: str
    constexprs: tuple[tuple[str, int], ...]
    num_warps: int

    @property
    def label(self) -> str:
        return " ".join(f"{k}={int(v)}" for k, v in self.constexprs if k != "NSTAT")


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
        (split_kernels, ("split_moments", "split_newton", "split_spread", "split_output",
                         "split_backward_reduce", "split_backward_input")),
        (pointwise_kernels, ("eval_pointwise",))) for name in names}


def _signature(fn, dtype: str, constexprs: dict[str, int]) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "seed_ptr":  # the noise seed: one int64 read in the kernel (traceable, graph-safe)
            sig[name] = "*i64"
        elif name.endswith("_ptr"):
            sig[name] = "*" + (DTYPES[dtype] if name in _ACTIVATION_PTRS else "fp32")
        elif name in _FLOAT_SCALARS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def launch_cases(full: bool) -> Iterator[Case]:
    """The configurations the launcher (launch.py) can choose, with its warp counts.

    `full`: every row block size up to its threshold, every split tile shape, every partition, fp32/
    bf16/fp16 and every combination of feature flags (tens of thousands of compiles: hours).
    Otherwise the representative matrix: the two largest row blocks of each row kernel (the
    launcher gives every block from 256 up the same 8 elements per thread, so register pressure
    is highest where the warps are most and registers per thread fewest), the smallest and
    largest tile shapes, the batch and layer partitions, all three dtypes, and the heaviest (all
    on) and lightest (all off) flag settings.
    """
    from normkit_normalnorm.triton_kernels.config import config
    from normkit_normalnorm.triton_kernels.geometry import NSTAT
    from normkit_normalnorm.triton_kernels.launch import _num_warps, _spread_warps

    def flag_sets(names: tuple[str, ...]) -> list[dict[str, bool]]:
        if full:
            return [dict(zip(names, values)) for values in itertools.product((False, True), repeat=len(names))]
        return [dict.fromkeys(names, True), dict.fromkeys(names, False)] if names else [{}]

    def blocks(limit: int) -> list[int]:
        every = [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]
        return every if full else every[-2:]

    tiles = [(max(1, config.chunk // bt), bt) for bt in (1 << i for i in range(config.chunk.bit_length()))
             if bt <= config.chunk]
    if not full:
        tiles = [tiles[0], tiles[-1]]
    row_fwd = ("HAS_W", "HAS_B", "NOISE", "CLAMP_MIN", "CLAMP_MAX", "DETACH", "UPDATE")
    row_bwd = ("HAS_W", "HAS_B", "USE_RUNNING", "NOISE", "LAMBDA_GRAD")
    row_kernels = (("row_forward", row_fwd, config.row_max),
                   ("row_backward", row_bwd, min(config.row_max, config.backward_row_max)))
    split_flags = {
        "split_moments": (), "split_newton": (),
        "split_spread": ("CLAMP_MIN", "CLAMP_MAX", "FIRST"),
        "split_output": row_fwd,
        "split_backward_reduce": ("HAS_W", "HAS_B", "NOISE", "LAMBDA_GRAD"),
        "split_backward_input": ("HAS_W", "USE_RUNNING", "LAMBDA_GRAD"),
    }
    uses_block_ch = {"split_newton", "split_spread", "split_output", "split_backward_input"}
    uses_nstat = {"split_output", "split_backward_reduce", "split_backward_input"}
    for dtype, part in itertools.product(DTYPES, range(4) if full else (0, 1)):
        for kernel, names, limit in row_kernels:
            for block in blocks(limit):
                for flags in flag_sets(names):
                    yield Case(kernel, dtype, (("PART", part), ("BLOCK", block), ("NSTAT", NSTAT),
                                               *flags.items()), _num_warps(block))
        for (br, bt), (kernel, names) in itertools.product(tiles, split_flags.items()):
            base = [("PART", part), ("BR", br), ("BT", bt)]
            if kernel in uses_block_ch:
                base.append(("BLOCK_CH", 1024))
            if kernel in uses_nstat:
                base.append(("NSTAT", NSTAT))
            for flags in flag_sets(names):
                warps = (_spread_warps if kernel == "split_spread" else _num_warps)(br * bt)
                yield Case(kernel, dtype, (*base, *flags.items()), warps)
    for dtype in DTYPES:
        for flags in flag_sets(("HAS_W", "HAS_B", "CHANNELS_LAST", "CLAMP_MIN", "CLAMP_MAX")):
            yield Case("eval_pointwise", dtype, (("BLOCK", config.pointwise_block), *flags.items()), 4)


def _ptxas(target: str) -> Path:
    """The ptxas Triton bundles for `target` (a separate one for sm_100 and later)."""
    import triton

    name = "ptxas-blackwell" if int(re.sub(r"\D", "", target)) >= 100 else "ptxas"
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _ptxas_report(ptx: str) -> tuple[int, int, int, int]:
    """(registers, spill stores, spill loads, shared bytes) from the bundled `ptxas -v`, for the
    PTX's own `.target` (Triton emits sm_90a for capability 90)."""
    target = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run([str(_ptxas(target.group(1))), "-lineinfo", "--regAllocOptLevel=2", "-v",  # as Triton runs it
                               f"-arch={target.group(1)}", str(src), "-o",
                               str(Path(tmp) / "k.cubin")], check=False, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"ptxas: {proc.stderr.strip()[-200:]}")
        out = proc.stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, out)
        return int(found.group(1)) if found else 0

    return (number(r"Used (\d+) registers"), number(r"(\d+) bytes spill stores"),
            number(r"(\d+) bytes spill loads"), number(r"(\d+) bytes smem"))


def compile_case(case: Case, arch: str) -> Result:
    """Compile one configuration for `arch` ("sm_80", "sm_90", ...) and read its resource use."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _kernels()[case.kernel]
    constexprs = dict(case.constexprs)
    capability = int(arch.removeprefix("sm_").rstrip("a"))
    try:
        src = ASTSource(fn, _signature(fn, case.dtype, constexprs), {(fn.arg_names.index(k),): v
                                                                      for k, v in constexprs.items()})
        compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                                  options={"num_warps": case.num_warps})
        ptx = compiled.asm["ptx"]
        regs, st, ld, _ = _ptxas_report(ptx)
        return Result(case, arch, regs, st, ld, int(compiled.metadata.shared), _instructions(ptx))
    except Exception as exc:  # noqa: BLE001 - any compiler failure is a row of the table and exit 1
        return Result(case, arch, 0, 0, 0, 0, 0, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")


def _instructions(ptx: str) -> int:
    """PTX instruction lines (tab-indented, ending in ';')."""
    return sum(1 for line in ptx.splitlines() if line.startswith("\t") and line.rstrip().endswith(";"))


def _compile(job: tuple[Case, str]) -> Result:
    return compile_case(*job)


def run(archs: list[str], full: bool, out=sys.stdout, jobs: int = 1) -> list[Result]:
    """Compile the matrix for every arch (`jobs` processes), print one markdown row per compile."""
    out.write("| kernel | dtype | warps | constexprs | arch | regs | spill st/ld B | smem B | PTX instr |\n")
    out.write("|---|---|---|---|---|---|---|---|---|\n")
    work = [(case, arch) for case in launch_cases(full) for arch in archs]
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
    args = parser.parse_args(argv)
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    bad_arch = [a for a in archs if not re.fullmatch(r"sm_\d+a?", a)]
    if bad_arch:
        print(f"error: unknown arch {bad_arch[0]!r}; give targets like sm_80,sm_90", file=sys.stderr)
        return 2
    results = run(archs, args.full, jobs=max(1, args.jobs))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
