"""The compiled CPU path for per-token layer statistics (lnn): `rows.c`, built with the system C compiler.

Why: `lnn` on transformer tokens normalizes short contiguous rows (768 values of a (32, 65, 768)
step). Inductor compiles `compiled.forward_math` for them into about ten loops over all rows, each a
pass over memory; it kept lnn at 4.7x LayerNorm. `rows.c` does one row at a time while it sits in
L1, so x is read from memory once and only what backward needs is written (out, y, log1p|h| and
the power term). Same formulas, constants and noise (the hash normal of `compiled.standard_normal`)
as the Inductor path: results agree to float32 rounding (`tests/test_rows.py`).

When: `compiled.normality_compiled` takes this path for a float32 training step with gradients,
`partition="layer"` and channels-last tokens, of at least `MIN_ELEMENTS` values: Inductor's
2^20 does not apply (nothing is compiled per shape), so language-model-sized steps (gpt-tiny's
16x32x64) take it too, at a quarter of the eager path's time (0.45 against 1.96 ms for forward
and backward on one thread). The library is
built once per process on first use (about half a second: plain C, no torch headers) into a
temporary directory, for this machine's CPU (`-march=native`), with OpenMP: it links libgomp by
its soname, so in a pip-installed torch it shares torch's own thread pool, and it runs on
`torch.get_num_threads()` threads, which take chunks of rows dynamically (results do not depend
on the thread count). If there is no C compiler (`CC`, else `cc`, `gcc`, `clang`) or the build or
load fails in any way, the failure is logged once and `compiled` runs the same math with the same hash
noise on torch ops (`compiled.forward_math` eagerly): the noise never depends on whether a compiler
was there, and `describe()` says which path a machine takes (environment.json records it); nothing is
built at install time. `NORMKIT_NN_ROWS=0` turns this path off.

Two more uses of the same row arithmetic (issue 40): `normality_groups`, float32 steps of any partition (each
normalization group gathered into a per-thread buffer, so a batch channel's N runs of S values become one row):
under the compiled path's 2^20 values with the eager path's `torch.randn` noise, where the eager path ran ~180
torch ops per training step, and from there, with gradients, with the compiled path's hash noise drawn in C,
where Inductor's code ran (twice as slow at bnn's 128x64x32x32, after a minute of compiling); and `inference`,
one forward call without noise or saved tensors. Built with `-fno-trapping-math`: without it GCC keeps the
loops that select (`?:`) scalar on AVX2, which has no masked instructions (the AVX-512 build vectorized them
anyway).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import shlex
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

import torch
from normkit.autograd import once_differentiable
from torch import Tensor

from normkit_normalnorm import switches
from normkit_normalnorm.fused import FusedConfig
from normkit_normalnorm.workspace import (
    borrow,
    give_back,
    graph_freed_after_this_backward,
    scratch_exact,
    scratch_flat,
)

SOURCE = Path(__file__).with_name("rows.c")
MIN_ELEMENTS = 1 << 14  # per-token training steps from here take the row kernel (hash noise); below, normality_groups
# values: grouped steps from here draw compiled.standard_normal's hash noise (the compiled path's, whose threshold
# this is), below it torch.randn's (the eager path's), so every size keeps the noise it had before rows.c took it
HASH_NOISE_FROM = 1 << 20
SCRATCH_SLOT = 7  # workspace.py's slot of the grouped functions' temporaries (fused.py uses 0 to 6)
SMALL_SAVED = 1 << 15  # values: grouped steps under this save heap buffers (no page faults) instead of the pool's
CHUNKS = 64  # pieces of work per call, handed to the threads dynamically (also dweight's partial sums)
NSTATS = 9  # per-row statistics (rows.c's NSTATS): mean, var, rstd, lam, in_range, g1, den, dvar, mean_d
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC")
PARALLEL_FLAGS = (("-fopenmp",), ("-fopenmp-simd",), ())  # tried in order: threads, then one thread
_log = logging.getLogger("normkit.normalnorm")
_lock = threading.Lock()
_library: list[Any] = []  # [CDLL or None] once built (or failed) in this process
_P, _I64, _F, _I32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int32, ctypes.c_int


def enabled() -> bool:
    return switches.setting("NORMKIT_NN_ROWS", "1") not in ("0", "false", "no", "off")


def eligible(x3: Tensor, weight: Tensor | None, bias: Tensor | None, cfg: FusedConfig) -> bool:
    """A float32 training step of per-token layer statistics over rows that are contiguous in memory:
    this path's step, whether or not the library could be built (without it, `compiled` runs the same
    math eagerly, with the same hash noise)."""
    return (enabled() and cfg.partition == "layer" and cfg.tokens and cfg.training
            and x3.dtype == torch.float32 and x3.shape[1] > 0 and x3.transpose(1, 2).is_contiguous()
            and all(t is None or (t.dtype == torch.float32 and t.is_contiguous()) for t in (weight, bias)))


def applies(x3: Tensor, weight: Tensor | None, bias: Tensor | None, cfg: FusedConfig) -> bool:
    """`eligible`, and the library is built."""
    return eligible(x3, weight, bias, cfg) and library() is not None


def library() -> ctypes.CDLL | None:
    """rows.c built and loaded once per process; None (logged once) when it cannot be built, whatever
    the reason: no compiler, a `CC` that does not split (an unbalanced quote), a C++ compiler whose
    library lacks the C names, a failed build or load."""
    if _library:  # built (or failed) already: no lock on every call
        return _library[0]
    with _lock:
        if not _library:
            try:
                _library.append(_build())
            except Exception as err:  # noqa: BLE001 - any failure: one warning, then the fallback
                _log.warning("normkit: lnn's CPU row kernel cannot be used (%s: %s); lnn runs the same math "
                             "on torch ops instead", type(err).__name__, str(err).splitlines()[0] if str(err) else "")
                _library.append(None)
        return _library[0]


def describe() -> dict[str, Any]:
    """What environment.json records of this path, without building it: `path` ("rows.c" when a C compiler
    is found, else "torch ops") and `compiler` (the first line of its `--version`, or None). Both paths
    draw the same noise; their values agree to float32 rounding, not bit for bit, so a resume compares this."""
    try:
        compiler = _compiler()
    except ValueError:
        compiler = None
    version = None
    if compiler is not None:
        try:
            done = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
            version = (done.stdout.strip().splitlines() or [None])[0] if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            version = None
    return {"path": "rows.c" if version else "torch ops", "compiler": version, "enabled": enabled()}


def _compiler() -> list[str] | None:
    """The C compiler's command: `CC` split as a shell would ("ccache gcc" works), else the first found."""
    if os.environ.get("CC", "").strip():
        return shlex.split(os.environ["CC"])
    found = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    return [found] if found else None


def _build() -> ctypes.CDLL | None:
    compiler = _compiler()
    if compiler is None:
        _log.warning("normkit: no C compiler (set CC) for lnn's CPU row kernel; lnn runs the same math on torch "
                     "ops instead")
        return None
    error = ""
    if shutil.which(compiler[0]) is None:
        _log.warning("normkit: C compiler %r (CC) not found for lnn's CPU row kernel; lnn runs the same math on "
                     "torch ops instead", compiler[0])
        return None
    with tempfile.TemporaryDirectory(prefix="normkit-rows-") as folder:
        for extra in PARALLEL_FLAGS:
            target = Path(folder) / f"rows{len(extra)}{extra[0][2:] if extra else ''}.so"
            command = [*compiler, *FLAGS, *extra, str(SOURCE), "-o", str(target)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
            except (OSError, subprocess.SubprocessError) as err:
                error = str(err)
                continue
            if done.returncode == 0:
                try:
                    lib = ctypes.CDLL(str(target))  # stays mapped after the folder is removed
                except OSError as err:  # a temporary directory mounted noexec, say
                    error = str(err)
                    break
                _declare(lib)
                if not extra or extra[0] != "-fopenmp":
                    _log.info("normkit: lnn's CPU row kernel built without OpenMP: one thread")
                return lib
            error = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    _log.warning("normkit: building lnn's CPU row kernel with %s failed (%s); lnn runs the same math on torch ops "
                 "instead",
                 " ".join(compiler), error)
    return None


def _declare(lib: ctypes.CDLL) -> None:
    lib.nn_rows_forward.argtypes = [_P] * 9 + [_I64, _I64, _F, _F, _F, _F, _F, _I32, _INT, _I64]
    lib.nn_rows_forward.restype = None
    lib.nn_rows_backward.argtypes = [_P] * 11 + [_I64, _I64, _F, _INT, _INT, _I64]
    lib.nn_rows_backward.restype = None
    for packed in (lib.nn_groups_forward_packed, lib.nn_groups_backward_packed):
        packed.argtypes, packed.restype = [ctypes.c_char_p, ctypes.c_char_p], None
    lib.nn_rows_infer.argtypes = [_P] * 5 + [_I64, _I64, _F, _F, _F, _F, _INT, _I64]
    lib.nn_rows_infer.restype = None
    lib.nn_channels_eval.argtypes = [_P] * 7 + [_I64, _I64, _I64, _INT]
    lib.nn_channels_eval.restype = None


def _ptr(t: Tensor | None) -> int:
    """The tensor's address, 0 (NULL) for None: for ctypes' c_void_p arguments and the packed ones alike."""
    return 0 if t is None else t.data_ptr()


def inference(x3: Tensor, weight: Tensor | None, bias: Tensor | None, *, partition: str, tokens: bool,
              training: bool, eps: float, alpha: float, noise: float, lambda_min: float | None,
              lambda_max: float | None, running_mean: Tensor | None, running_var: Tensor | None,
              running_lambda: Tensor | None) -> Tensor | None:
    """A forward that draws no noise and saves nothing (the caller checked that no gradient is wanted), in one
    call into rows.c: per-token layer statistics (lnn under no_grad or in eval) or a batch partition's running
    statistics in eval (bnn.eval()). None where it does not apply (other partitions, float64, small inputs,
    noise drawn in training, no library): the caller takes the eager path. Why: the eager path runs about 15
    activation-sized ops for these (75 ms against LayerNorm's 3 ms at 32x65x768 on one AVX2 thread)."""
    if not (enabled() and x3.dtype == torch.float32 and x3.device.type == "cpu" and x3.numel() >= MIN_ELEMENTS
            and x3.numel() < 2**31 and x3.shape[1] > 0
            and all(t is None or (t.dtype == torch.float32 and t.is_contiguous()) for t in (weight, bias))):
        return None
    lo = -math.inf if lambda_min is None else lambda_min
    hi = math.inf if lambda_max is None else lambda_max
    threads = torch.get_num_threads()
    if partition == "layer" and tokens and not (training and noise) and x3.transpose(1, 2).is_contiguous():
        if library() is None:
            return None
        rows_x = x3.transpose(1, 2)
        n = rows_x.shape[-1]
        out = torch.empty_like(rows_x)
        scratch = torch.empty(2 + 4 * threads, n)  # bound to a name: it must outlive the call
        library().nn_rows_infer(rows_x.data_ptr(), _ptr(weight), _ptr(bias), out.data_ptr(), scratch.data_ptr(),
                                rows_x.numel(), n, eps, alpha, lo, hi, threads, CHUNKS)
        return out.transpose(1, 2)
    if (partition == "batch" and not training and running_mean is not None and x3.is_contiguous()
            and all(t is not None and t.dtype == torch.float32 for t in (running_mean, running_var, running_lambda))):
        if library() is None:
            return None
        mean = running_mean.contiguous()  # each bound to a name: it must outlive the call
        scale = torch.rsqrt(running_var + eps)
        lam = running_lambda.clamp(lo, hi).contiguous()
        out = torch.empty_like(x3)
        batch, channels, s = x3.shape
        library().nn_channels_eval(x3.data_ptr(), _ptr(weight), _ptr(bias), mean.data_ptr(), scale.data_ptr(),
                                   lam.data_ptr(), out.data_ptr(), batch, channels, s, threads)
        return out
    return None


def normality_rows(x3: Tensor, weight: Tensor | None, bias: Tensor | None, seed: Tensor, cfg: FusedConfig) -> Tensor:
    """The layer's output as an `(N, C, S)` view of channels-last tokens (as the other paths return)."""
    return RowsFunction.apply(x3, weight, bias, seed, cfg)


class RowsFunction(torch.autograd.Function):
    """Forward and backward each one call into rows.c; saves x, the noisy values y, log1p|h|, the
    power term (these three borrowed from workspace.py's pool and given back by backward, as the
    fused path does: fresh 6 MB buffers cost about 1 ms of page faults each) and the per-row
    statistics."""

    @staticmethod
    def forward(ctx: Any, x3: Tensor, weight: Tensor | None, bias: Tensor | None, seed: Tensor,
                cfg: FusedConfig) -> Tensor:
        rows_x = x3.transpose(1, 2)  # (N, S, C), contiguous: one row per token
        n = rows_x.shape[-1]
        threads = torch.get_num_threads()
        out = torch.empty_like(rows_x)
        y, log1p_a, power = (borrow(rows_x) for _ in range(3))  # saved only: recycled (workspace.py)
        stats = torch.empty(rows_x.numel() // n, NSTATS)
        scratch = torch.empty(2 + threads, n)  # affine defaults (2 n), then n per thread
        lo = -math.inf if cfg.lambda_min is None else cfg.lambda_min
        hi = math.inf if cfg.lambda_max is None else cfg.lambda_max
        library().nn_rows_forward(rows_x.data_ptr(), _ptr(weight), _ptr(bias), out.data_ptr(), y.data_ptr(),
                                  log1p_a.data_ptr(), power.data_ptr(), stats.data_ptr(), scratch.data_ptr(),
                                  rows_x.numel(), n, cfg.eps, cfg.alpha, cfg.noise, lo, hi, int(seed), threads, CHUNKS)
        ctx.cfg = cfg
        ctx.has_bias = bias is not None
        ctx.save_for_backward(rows_x, weight, y, log1p_a, power, stats)
        return out.transpose(1, 2)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        rows_x, weight, y, log1p_a, power, stats = ctx.saved_tensors
        n = rows_x.shape[-1]
        threads = torch.get_num_threads()
        dy = grad_out.transpose(1, 2).contiguous()
        dx = torch.empty_like(rows_x)
        want_w = weight is not None and ctx.needs_input_grad[1]
        want_b = ctx.has_bias and ctx.needs_input_grad[2]
        chunks = min(CHUNKS, rows_x.numel() // n)
        dweight = torch.zeros(chunks, n) if want_w else None  # per-chunk partial sums, added in chunk order
        dbias = torch.zeros(chunks, n) if want_b else None
        scratch = torch.empty(threads, 3 * n)  # h, grad_a, jac (rows.c's backward_row)
        library().nn_rows_backward(dy.data_ptr(), rows_x.data_ptr(), _ptr(weight), y.data_ptr(), log1p_a.data_ptr(),
                                   power.data_ptr(), stats.data_ptr(), dx.data_ptr(), _ptr(dweight), _ptr(dbias),
                                   scratch.data_ptr(), rows_x.numel(), n, ctx.cfg.alpha,
                                   int(not ctx.cfg.detach_lambda), threads, chunks)
        if graph_freed_after_this_backward():
            give_back(y, log1p_a, power)
        return (dx.transpose(1, 2) if ctx.needs_input_grad[0] else None,
                dweight.sum(0) if want_w else None, dbias.sum(0) if want_b else None, None, None)


class GroupLayout(NamedTuple):
    """rows.c's description of the normalization groups of a dense tensor in memory order: `count` groups, each
    `runs` runs of `length` values, `step` apart between groups and `stride` apart between runs; `s_inner` values
    per channel run (0: channels last, the channel is the index modulo `channels`); `dims`: the tensor's dims the
    weight and bias gradients sum over."""

    count: int
    runs: int
    length: int
    step: int
    stride: int
    s_inner: int
    channels: int
    dims: tuple[int, ...]


@functools.lru_cache(maxsize=1024)
def grouped_layout(shape: tuple[int, ...] | torch.Size, partition: str, groups: int, tokens: bool
                   ) -> GroupLayout | None:
    """The groups of a contiguous tensor of `shape` in memory order: `(N, ..., C)` for channels-last tokens (then
    only per-token layer statistics are runs of it; None for other partitions), else `(N, C, ...)`. Cached: a
    layer sees a few shapes, and this runs on every small step."""
    n, rank = shape[0], len(shape)
    if tokens:
        c = shape[-1]
        return GroupLayout(math.prod(shape[:-1]), 1, c, c, 0, 0, c, tuple(range(rank - 1))) \
            if partition == "layer" else None
    c, s = shape[1], math.prod(shape[2:])
    dims = (0, *range(2, rank))
    if partition == "batch":
        return GroupLayout(c, n, s, s, c * s, s, c, dims)
    size = {"layer": c * s, "group": c // groups * s, "instance": s}[partition]
    return GroupLayout(n * c * s // size, 1, size, size, 0, s, c, dims)


def noise_seed() -> Tensor:
    """The hash noise's seed: one int32 from torch's default generator (torch.manual_seed repeats it). The one
    draw of every path with that noise (compiled.py's too), so a step keeps its noise whichever path takes it."""
    return torch.randint(0, 2**31 - 1, (1,), dtype=torch.int32)


def normality_groups(mem: Tensor, weight: Tensor | None, bias: Tensor | None, cfg: FusedConfig, layout: GroupLayout,
                     running: tuple[Tensor, Tensor, Tensor] | None) -> Tensor:
    """`normality_norm`'s training step for any partition in two calls into rows.c (forward, backward), on a
    contiguous tensor in memory order (`grouped_layout`), returned in its shape, with the noise each size had on
    the path this replaces (under one torch.manual_seed, the same draw): under HASH_NOISE_FROM values the eager
    path's (`standard_normal_like`: torch.randn's values), from there the compiled path's hash normal, drawn in C.
    For the steps where the eager path costs ~180 torch ops and for those Inductor's code ran; the layer calls it on
    its input as it is (no view, so no view's autograd node either). `running`: a batch partition's
    (running_mean, running_var, running_lambda), updated in place."""
    return GroupsFunction.apply(mem, weight, bias, cfg, layout, running)


# rows.c's `nn_groups_*_packed` arguments (see there): per call the addresses and the thread count, per
# configuration and layout the integers and floats (`packed_configs`), as the C structs lay them out
_GROUPS_FORWARD = struct.Struct("15q")
_GROUPS_BACKWARD = struct.Struct("13q")
_GROUPS_CONFIG = struct.Struct("8q7d")


@functools.lru_cache(maxsize=256)
def packed_configs(cfg: FusedConfig, layout: GroupLayout) -> bytes:
    """The integer and float arguments of rows.c's grouped functions for this configuration and layout, packed
    once (a layer's steps repeat a few of them)."""
    values = layout.runs * layout.length
    return _GROUPS_CONFIG.pack(*layout[:7], int(not cfg.detach_lambda), values / max(values - 1, 1), cfg.momentum,
                               cfg.eps, cfg.alpha, cfg.noise, -math.inf if cfg.lambda_min is None else cfg.lambda_min,
                               math.inf if cfg.lambda_max is None else cfg.lambda_max)


class GroupsFunction(torch.autograd.Function):
    """Forward and backward each one call into rows.c's grouped functions; saves x, the noisy values y, and
    log1p|h|, the power term (group-major) and the per-group statistics. rows.c also writes the affine output,
    multiplies the incoming gradient by the weight and updates the running buffers, and the temporaries live in
    per-thread scratch (workspace.py): these small steps cost their torch ops' host work, not arithmetic. The
    weight/bias gradient sums stay torch's (their summation order) except a batch partition's from HASH_NOISE_FROM
    values (made in C, per channel); rows.c makes the weight's product dy * y in place of y when the graph is
    freed after this backward (the same products, one torch op fewer). A call that wants no gradient and draws no
    noise (inference) has rows.c write the output alone: L stays in its scratch, P and y are not made."""

    @staticmethod
    def forward(ctx: Any, mem: Tensor, weight: Tensor | None, bias: Tensor | None, cfg: FusedConfig,
                layout: GroupLayout, running: tuple[Tensor, Tensor, Tensor] | None) -> Tensor:
        count, values = layout.count, layout.runs * layout.length
        numel, threads = mem.numel(), torch.get_num_threads()
        work = scratch_flat(SCRATCH_SLOT, threads * 5 * values)  # rows.c's scratch
        z, seed = 0, -1
        if cfg.training and cfg.noise:
            if numel >= HASH_NOISE_FROM:  # the compiled path's draw, so the same noise as that path's
                seed = int(noise_seed())
            else:  # standard_normal_like's draw in memory order (tokens: N, S, C)
                z = scratch_exact(SCRATCH_SLOT, numel).normal_().data_ptr()
        if not cfg.grad_enabled and z == 0 and seed < 0:  # inference: rows.c keeps L per group in its scratch
            saved = (torch.empty(count * NSTATS),)
            pointers = (0, 0, 0, saved[0].data_ptr())
        elif numel < SMALL_SAVED or not cfg.grad_enabled:  # one allocation from the heap: no page faults
            saved = (torch.empty(3 * numel + count * NSTATS),)
            base = saved[0].data_ptr()
            pointers = (base, base + 4 * numel, base + 8 * numel, base + 12 * numel)
        else:  # saved for backward: recycled (workspace.py)
            saved = (borrow(mem), borrow(mem), borrow(mem), torch.empty(count * NSTATS))
            pointers = tuple(t.data_ptr() for t in saved)
        out = torch.empty_like(mem)
        rm, rv, rl = (0, 0, 0) if running is None else (t.data_ptr() for t in running)
        configs = packed_configs(cfg, layout)
        library().nn_groups_forward_packed(
            _GROUPS_FORWARD.pack(mem.data_ptr(), z, _ptr(weight), _ptr(bias), pointers[0], out.data_ptr(),
                                 pointers[1], pointers[2], pointers[3], rm, rv, rl, work.data_ptr(), seed,
                                 threads), configs)
        # x and the weight through save_for_backward (autograd's check that nothing changed them in place); the
        # buffers rows.c wrote are this Function's own, kept on ctx (cheaper at these sizes)
        ctx.configs, ctx.layout, ctx.pointers, ctx.saved = configs, layout, pointers, saved
        ctx.has_bias = bias is not None
        # from HASH_NOISE_FROM values a batch partition's weight/bias sums are made in C, one channel per group
        # (torch's two sums over (N, S) took a fifth of bnn's step at 128x256x8x8); under it torch's, whose summation
        # order the small steps keep
        ctx.sums_in_c = cfg.partition == "batch" and numel >= HASH_NOISE_FROM
        ctx.save_for_backward(mem, weight)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        mem, weight = ctx.saved_tensors
        runs, length, dims = ctx.layout.runs, ctx.layout.length, ctx.layout.dims
        pointers, saved, needs = ctx.pointers, ctx.saved, ctx.needs_input_grad
        dy = grad.contiguous()
        dx = dweight = dbias = None
        wants_weight, freed = weight is not None and needs[1], graph_freed_after_this_backward()
        wants_bias = ctx.has_bias and needs[2]
        sums_in_c = ctx.sums_in_c and needs[0]
        in_place = wants_weight and freed and needs[0] and not sums_in_c  # rows.c turns y into dy * y
        if sums_in_c:
            dweight = torch.empty_like(weight) if wants_weight else None
            dbias = torch.empty(mem.shape[1]) if wants_bias else None
        if needs[0]:
            threads = torch.get_num_threads()
            dx = torch.empty_like(mem)
            scratch = scratch_flat(SCRATCH_SLOT, threads * 6 * runs * length)
            library().nn_groups_backward_packed(
                _GROUPS_BACKWARD.pack(dy.data_ptr(), _ptr(weight), mem.data_ptr(), pointers[1], pointers[2],
                                      pointers[3], dx.data_ptr(), scratch.data_ptr(), pointers[0] if in_place else 0,
                                      pointers[0] if sums_in_c else 0, _ptr(dweight), _ptr(dbias), threads),
                ctx.configs)
        if wants_weight and not sums_in_c:
            y = saved[0] if len(saved) > 1 else saved[0].as_strided(mem.shape, mem.stride())
            dweight = (y if in_place else dy * y).sum(dims)
        if wants_bias and not sums_in_c:
            dbias = dy.sum(dims)
        if len(saved) > 1 and freed:
            give_back(*saved[:3])
        return dx, dweight, dbias, None, None, None
