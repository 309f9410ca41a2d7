"""Where a comparison ran: saved as environment.json and as columns of every runs.jsonl row.

Results only repeat on the same hardware and library versions, so both travel with the numbers.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from normkit import plugins
from normkit_lab.runs.device import resolve_device

_DISTRIBUTIONS = ("torch", "torchvision", "numpy", "scipy", "scikit-learn", "normkit", "normkit-lab",
                  "normkit-cli", "matplotlib")


def device_name(device: str) -> str:
    """A readable device, e.g. "cuda (NVIDIA H100 80GB HBM3)" or "cpu"."""
    resolved = resolve_device(device)
    if resolved.type == "cuda":
        return f"{resolved} ({torch.cuda.get_device_name(resolved)})"
    return str(resolved)


def run_columns(device: str) -> dict[str, Any]:
    """The environment columns of each runs.jsonl row."""
    return {"host": platform.node(), "torch_version": torch.__version__, "device": device_name(device)}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else the platform's answer)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# /proc/cpuinfo flags naming the widest vector instructions, widest first (x86, then Arm)
_ISA_FLAGS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"), ("sve", "SVE"),
              ("asimd", "NEON"))


def vector_isa() -> dict[str, str | None]:
    """The CPU's widest vector instruction set (from /proc/cpuinfo's flags) and the one torch's kernels
    dispatch to (`torch.backends.cpu.get_cpu_capability()`): floating-point results differ between them."""
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("flags", "features")):
                flags = set(line.split(":", 1)[1].split())
                break
    cpu = next((name for flag, name in _ISA_FLAGS if flag in flags), None)
    try:
        used = str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        used = None
    return {"cpu": cpu, "torch": used}


def load_average() -> tuple[float, float, float] | tuple[None, None, None]:
    """The machine's 1-, 5- and 15-minute load averages (None where the platform has none)."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None, None, None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def git_commit(path: Path) -> str | None:
    """The commit of the git checkout holding `path` (None outside a checkout or without git)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(device: str, threads: int | None = None) -> dict[str, Any]:
    """Versions, plugins, device, CPU (model, vector instruction sets, cores), threads, the load at the
    start and git commits (of the working directory, where the experiment's own code usually lives,
    and of normkit-lab's source when it is a checkout). `threads`: the torch threads each run uses
    (`torch_threads` is this process's own default, which runs do not use when they set theirs)."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": platform.node(),
        "versions": {dist: _version(dist) for dist in _DISTRIBUTIONS},
        "plugins": [{"name": p.name, "distribution": p.distribution, "version": p.version,
                     "error": p.error} for p in plugins.plugins()],
        "device": device_name(device),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "cpu": cpu_model(),
        "vector_isa": vector_isa(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "threads_per_run": threads,
        "load_average_start": list(load_average()),
        "git_commit": {"cwd": git_commit(Path.cwd()),
                       "normkit_lab_source": git_commit(Path(__file__).resolve().parent)},
        "c_compiler": c_compiler(),
    }


# -- the C compiler kernels are built with (own-training engineer's section) ---------------------------


def c_compiler() -> str | None:
    """The first line of `--version` of the C compiler plugins build their CPU kernels with (`CC`, else
    the first of cc, gcc, clang; normalnorm's lnn row kernel), None when there is none or it does not run.
    Without one, that kernel's math runs on torch ops: the same noise, values equal to float32 rounding
    only, so a resume compares this (`normkit_lab.study.versions`)."""
    import shlex
    import shutil

    try:
        command = shlex.split(os.environ.get("CC", "")) or next(([c] for c in ("cc", "gcc", "clang")
                                                                  if shutil.which(c)), [])
    except ValueError:  # a CC with an unbalanced quote: no compiler
        return None
    if not command or shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip().splitlines() or [None])[0] if done.returncode == 0 else None
