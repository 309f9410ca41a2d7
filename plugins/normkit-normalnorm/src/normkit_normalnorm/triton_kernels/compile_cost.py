"""What a launch really costs on a GPU, found without one: compile with the JIT's specialization, read the SASS.

Triton's JIT does not compile a kernel from its signature alone: at launch it turns ints equal to 1
into constants and gives ints and pointers divisible by 16 a `tt.divisibility=16` hint (128-bit
loads, cheaper index arithmetic). A cost figure is only the cost of what runs if it is compiled the
same way. `record_launches` runs the launcher (`launch.py`) with every kernel replaced by a recorder,
so the arguments are the launcher's own; `compile_launch` feeds them through the JIT's own binder for
a named target (no driver needed) and compiles; `sass_cost` disassembles the cubin with the
`cuobjdump` Triton bundles and counts the instructions one thread issues on its hot path.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Activation pointers: the per-element HBM traffic a launch must move (reads, writes).
_READ_PTRS = ("x_ptr", "dy_ptr")
_WRITE_PTRS = ("y_ptr", "dx_ptr")


@dataclass(frozen=True)
class PointerArg:
    """A tensor argument as the JIT sees it (dtype and address), small enough to send to a worker.

    The address is the tensor's byte offset in its storage: a GPU allocation starts 256-byte aligned,
    so this is what the JIT's divisibility test sees on a device."""

    dtype: Any
    offset: int
    itemsize: int

    def data_ptr(self) -> int:
        return self.offset

    def element_size(self) -> int:
        return self.itemsize


def _pointer(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return PointerArg(value.dtype, value.storage_offset() * value.element_size(), value.element_size())
    return value


@dataclass
class Launch:
    """One kernel launch as the launcher made it."""

    kernel: Any  # the JITFunction
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def __getstate__(self) -> dict:
        """Sent to a worker process by the kernel's module and name (a JITFunction does not pickle)."""
        return {**self.__dict__, "kernel": (self.kernel.fn.__module__, self.kernel.fn.__name__)}

    def __setstate__(self, state: dict) -> None:
        import importlib

        module, name = state["kernel"]
        self.__dict__.update(state, kernel=getattr(importlib.import_module(module), name))

    def argument(self, name: str) -> Any:
        names = self.kernel.arg_names
        if name in self.kwargs:
            return self.kwargs[name]
        index = names.index(name)
        return self.args[index] if index < len(self.args) else None

    @property
    def num_warps(self) -> int:
        return int(self.kwargs.get("num_warps", 4))

    def activation_bytes(self) -> tuple[int, int]:
        """(bytes read, bytes written) of activations per element; the split forward's float32
        workspace `xt_ptr` (noise only) is written by split_transform and read by the passes after it."""
        def size(names: tuple[str, ...]) -> int:
            return sum(self.argument(n).element_size() for n in names if n in self.kernel.arg_names)
        name = self.kernel.fn.__name__
        if name == "split_transform":
            return size(_READ_PTRS), size(_WRITE_PTRS + ("xt_ptr",))
        if name == "split_output" and not self.kwargs.get("NOISE"):  # the workspace is not read
            return size(_READ_PTRS), size(_WRITE_PTRS)
        return size(_READ_PTRS + ("xt_ptr",)), size(_WRITE_PTRS)


@contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Within the block, the launcher records its launches instead of running them."""
    from normkit_normalnorm.triton_kernels import launch

    recorded: list[Launch] = []

    class _Recorder:
        def __init__(self, kernel: Any) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: tuple[int, ...]):
            return lambda *args, **kwargs: recorded.append(
                Launch(self.kernel, tuple(grid), tuple(map(_pointer, args)),
                       {k: _pointer(v) for k, v in kwargs.items()}))

    real = launch._k
    launch._k = lambda kernel, traced=False: _Recorder(kernel)
    try:
        yield recorded
    finally:
        launch._k = real


def _target(arch: str):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", int(arch.removeprefix("sm_").rstrip("a")), 32)


def specialization(item: Launch, arch: str) -> tuple[Any, dict, dict, dict]:
    """(options, signature, constexprs, attrs) as the JIT's own binder derives them from the arguments."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = item.kernel
    backend = make_backend(_target(arch))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, options = binder(*item.args, **item.kwargs)
    return fn._pack_args(backend, item.kwargs, bound, spec, options)


def compile_launch(item: Launch, arch: str):
    """The CompiledKernel the JIT would build for this launch on `arch` ("sm_80", "sm_90")."""
    import triton
    from triton.compiler import ASTSource

    options, signature, constexprs, attrs = specialization(item, arch)
    return triton.compile(ASTSource(item.kernel, signature, constexprs, attrs), target=_target(arch),
                          options=options.__dict__)


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def ptxas_report(ptx: str) -> tuple[int, int, int, int]:
    """(registers, spill stores, spill loads, shared bytes) from the bundled `ptxas -v` run the way
    Triton runs it, for the PTX's own `.target` (Triton emits sm_90a for capability 90)."""
    target = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE).group(1)
    name = "ptxas-blackwell" if int(re.sub(r"\D", "", target)) >= 100 else "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run([str(_tool(name)), "-lineinfo", "--regAllocOptLevel=2", "-v", f"-arch={target}",
                               str(src), "-o", str(Path(tmp) / "k.cubin")], check=False, capture_output=True,
                              text=True)
    if proc.returncode:
        raise RuntimeError(f"ptxas: {proc.stderr.strip()[-200:]}")

    def number(pattern: str) -> int:
        found = re.search(pattern, proc.stderr)
        return int(found.group(1)) if found else 0

    return (number(r"Used (\d+) registers"), number(r"(\d+) bytes spill stores"),
            number(r"(\d+) bytes spill loads"), number(r"(\d+) bytes smem"))


@dataclass(frozen=True)
class Cost:
    """Resource use and hot-path length of one compiled kernel."""

    registers: int
    spill_bytes: int  # spill stores + loads per thread (ptxas -v)
    hot_path: int  # SASS instructions one thread issues on its longest common path
    total: int  # every SASS instruction in the kernel


def _parse(sass: str) -> list[tuple[int, str]]:
    out = []
    for line in sass.splitlines():
        found = _INSTR.search(line)
        if found:
            text = found.group(2).strip()
            if text.split()[0] not in ("NOP",):
                out.append((int(found.group(1), 16), text))
    return out


def hot_path_length(instructions: list[tuple[int, str]]) -> int:
    """Instructions on the longest path from entry to EXIT, where every loop body counts once (back
    edges cut), subroutine calls are not followed (division and sqrt slow paths), and blocks that
    touch local memory (cosf's Payne-Hanek reduction of huge arguments) are left out as cold."""
    if not instructions:
        return 0
    index = {addr: i for i, (addr, _) in enumerate(instructions)}
    leaders = {0}
    targets: dict[int, int] = {}
    for i, (_, text) in enumerate(instructions):
        branch = re.match(r"(@!?U?P\w+\s+)?(BRA|BRX|JMP)\b\s*(0x[0-9a-f]+)?", text)
        if branch or text.split()[-1] == "EXIT" or " EXIT" in text or text.startswith("EXIT"):
            leaders.add(i + 1)
        if branch and branch.group(3):
            t = index.get(int(branch.group(3), 16))
            if t is not None:
                targets[i] = t
                leaders.add(t)
    starts = sorted(s for s in leaders if s < len(instructions))
    block_of = {}
    blocks = []
    for b, s in enumerate(starts):
        end = starts[b + 1] if b + 1 < len(starts) else len(instructions)
        blocks.append((s, end))
        for i in range(s, end):
            block_of[i] = b
    cold = [any(re.match(r"(@!?P\w+\s+)?(STL|LDL)\b", instructions[i][1]) for i in range(s, e)) for s, e in blocks]
    succ: list[list[int]] = []
    for b, (s, e) in enumerate(blocks):
        last = instructions[e - 1][1]
        nxt = []
        predicated = last.startswith("@")
        ends = re.search(r"\b(EXIT|RET)\b", last) and not predicated
        jump = targets.get(e - 1)
        if jump is not None and block_of[jump] > b:
            nxt.append(block_of[jump])
        unconditional_jump = re.match(r"(BRA|JMP)\b", last) is not None
        if not ends and not unconditional_jump and b + 1 < len(blocks):
            nxt.append(b + 1)
        succ.append(nxt)
    best = [0] * len(blocks)
    for b in reversed(range(len(blocks))):
        if cold[b]:
            best[b] = -10**9
            continue
        size = blocks[b][1] - blocks[b][0]
        follow = [best[n] for n in succ[b] if best[n] >= 0]
        best[b] = size + (max(follow) if follow else 0)
    return max(best[0], 0)


def sass_cost(compiled) -> Cost:
    """Registers, spills and hot-path length of a CompiledKernel (bundled cuobjdump, no GPU)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(_tool("cuobjdump")), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout

    registers, spill_st, spill_ld, _ = ptxas_report(compiled.asm["ptx"])
    instructions = _parse(sass)
    return Cost(registers, spill_st + spill_ld, hot_path_length(instructions), len(instructions))
