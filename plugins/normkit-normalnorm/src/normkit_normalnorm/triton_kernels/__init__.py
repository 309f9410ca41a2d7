"""Fused Triton kernels for normality normalization (forward and backward), CUDA or interpreter.

Design (details in docs/performance.md, "Normality normalization, fused Triton kernel (GPU)"):

- Row path (a group of at most `config.row_max` elements: layer/token rows, instance and group
  blocks, small BatchNorm channels): one program per group holds it in registers; forward reads
  and writes each element once; backward is one launch reading x and dy once and writing dx once,
  with weight/bias gradients accumulated per program and finished in the same launch by a ticket
  tree that sums the partials in a fixed order (deterministic, no float atomics).
- Split path (larger groups, typically BatchNorm channels over N*H*W): tiles of `config.chunk`
  elements, one program per (group, tile); forward passes moments -> Newton sums -> [sum x ->
  sum |x - mean x| with noise] -> output, each pass combining the previous partials itself;
  backward two passes, because dx's mean terms are linear in the lambda gradient; the second also
  finishes the weight/bias gradients from the first's partials.
- Eval of a batch partition with running statistics: one elementwise pass.
- Saved for backward: the input and a (groups, 9) float32 table (mean, rstd, lambda, noise scale,
  mean of d, three lambda-gradient coefficients, var). The noise is never stored: it is
  Philox-4x32-7 at a counter per four neighbouring values of a group (one call feeds four values,
  Box-Muller on the special-function unit), and the backward regenerates it for the weight gradient;
  the seed is drawn on the input's device from torch's default generator, so `torch.manual_seed`
  reproduces it.

Import-safe without Triton: nothing here imports triton until a kernel runs.
"""

from __future__ import annotations

import functools
import math

import torch
from normkit import NormkitError, NormShapeError, SpecError
from normkit.stages import Partition
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from normkit_normalnorm.functional import ema_factor, normality_norm
from normkit_normalnorm.triton_kernels.autograd import NormalityFunction, update_running_from
from normkit_normalnorm.triton_kernels.geometry import Geometry, Options, cached, geometry
from normkit_normalnorm.triton_kernels.op import interpreting, normality_forward

__all__ = ["available", "normality_triton"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # float64 goes to the reference


def available(x: Tensor | None = None) -> bool:
    """True when Triton is installed and a CUDA device exists (or TRITON_INTERPRET=1 is set).

    With `x`, also when `x` is a fake CUDA tensor: tracing (torch.export under a FakeTensorMode)
    records the kernels' op for a GPU without one.
    """
    if not _triton_installed():
        return False
    return torch.cuda.is_available() or interpreting() or (x is not None and x.is_cuda and _fake(x))


def normality_triton(
    x3: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    *,
    partition: str,
    groups: int = 1,
    tokens: bool = False,
    training: bool,
    eps: float = 1e-5,
    alpha: float = 1.0,
    noise: float = 0.0,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    running_lambda: Tensor | None = None,
    momentum: float | None = 0.1,
    lambda_min: float | None = None,
    lambda_max: float | None = None,
    detach_lambda: bool = False,
    num_batches_tracked: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """`normality_norm` computed by the fused kernels; same arguments, same result and gradients.

    x3 may be float32, float16 or bfloat16 (statistics in float32); `out_dtype` (default x3's)
    lets a caller write a low-precision output directly. float64 (gradcheck, reference runs) goes
    to the reference `normality_norm`, because the kernels compute in float32. Layouts other than
    contiguous `(N, C, S)` and channels-last `(N, S, C)` memory are copied to contiguous first.
    """
    _check_device(x3)
    if x3.dtype == torch.float64:
        y = normality_norm(x3, weight, bias, partition=partition, groups=groups, tokens=tokens, training=training,
                           eps=eps, alpha=alpha, noise=noise, running_mean=running_mean, running_var=running_var,
                           running_lambda=running_lambda, momentum=momentum, lambda_min=lambda_min,
                           lambda_max=lambda_max, detach_lambda=detach_lambda,
                           num_batches_tracked=num_batches_tracked)
        return y.to(out_dtype) if out_dtype is not None else y
    given = (running_mean is not None, running_var is not None, running_lambda is not None)
    geo, dense = cached(_call_plan, x3.shape, x3.stride(), x3.dtype, partition, groups, tokens, training, given)
    if not dense:
        x3 = x3.contiguous()
    tracked = partition == "batch" and running_mean is not None
    factor = ema_factor(momentum, num_batches_tracked) if tracked and training else None
    with_noise = training and noise > 0
    # The seed is drawn on x3's device by that device's default generator (torch.manual_seed seeds them
    # all): no host draw, no host-to-device copy, and a CUDA-graph replay draws it anew from the graph-safe
    # generator. It reaches the kernels as a one-element tensor they read, so a traced graph redraws it too.
    # Without noise there is no seed (no draw, no allocation): the kernels never read it then.
    device = x3.device if x3.device.type != "meta" else None
    seed = torch.randint(0, 2**31 - 1, (1,), device=device) if with_noise else None
    if not (torch.compiler.is_compiling() or _fake(x3)):
        opts = Options(training, eps, alpha, noise, lambda_min, lambda_max, detach_lambda)
        need_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x3, weight, bias))
        return NormalityFunction.apply(x3, weight, bias, (running_mean, running_var, running_lambda),
                                       seed, geo, opts, factor, out_dtype or x3.dtype, need_grad)
    y, stats = normality_forward(x3, weight, bias, running_mean, running_var, running_lambda, seed,
                                 partition, groups, tokens, training, eps, alpha, noise, lambda_min, lambda_max,
                                 detach_lambda, out_dtype)
    if factor is not None:
        update_running_from(stats, x3.shape[0] * x3.shape[2], factor, running_mean, running_var, running_lambda)
    return y


def _fake(x3: Tensor) -> bool:
    """A fake (or meta) tensor: torch.export or a FakeTensorMode traces the op, nothing runs. While
    Dynamo traces (torch.compile, strict export) every tensor is fake, and asking `is_fake` would break
    its graph."""
    return x3.device.type == "meta" or torch.compiler.is_compiling() or is_fake(x3)


# Answers that cannot change within a process, found at the first call (a plain memo, not functools.cache,
# so Dynamo traces through it without a warning): no import statement runs on later calls.
_MEMO: dict[str, bool] = {}


def _triton_installed() -> bool:
    if "triton" not in _MEMO:
        try:
            import triton  # noqa: F401
        except ImportError:
            _MEMO["triton"] = False
        else:
            _MEMO["triton"] = True
    return _MEMO["triton"]


def _interpreter_active() -> bool:
    """Triton picks the interpreter when its modules are decorated, i.e. at `import triton`."""
    if "interpreter" not in _MEMO:
        import triton.language as tl

        _MEMO["interpreter"] = type(tl.sum).__name__ == "InterpretedFunction"
    return _MEMO["interpreter"]


def _check_device(x3: Tensor) -> None:
    if not _triton_installed():
        raise NormkitError("the Triton kernel needs the triton package; install it or use kernel=torch")
    if x3.device.type == "cpu" and not interpreting():
        raise NormkitError("set TRITON_INTERPRET=1 before importing normkit_normalnorm to run the Triton "
                           "kernel on CPU, or use kernel=torch")
    if x3.device.type == "cpu" and not _interpreter_active():
        raise NormkitError("TRITON_INTERPRET=1 was set after triton was imported in this process; set it "
                           "before Python starts (e.g. TRITON_INTERPRET=1 pytest ...), or use kernel=torch")
    if x3.device.type not in ("cpu", "cuda"):
        raise NormkitError(f"the Triton kernel runs on CUDA (or CPU under TRITON_INTERPRET=1), "
                           f"not on {x3.device.type}; use kernel=torch")


@functools.lru_cache(maxsize=256)
def _call_plan(shape: torch.Size, strides: tuple[int, ...], dtype: torch.dtype, partition: str, groups: int,
               tokens: bool, training: bool, given: tuple[bool, bool, bool]) -> tuple[Geometry, bool]:
    """The argument checks and the group geometry of one kind of call, done once per shape, layout,
    dtype and settings (a bad call raises every time: errors are not cached); and whether the layout is
    one the kernels index (else the caller copies to contiguous)."""
    if len(shape) != 3:
        raise NormShapeError(f"normality_triton expects an (N, C, S) tensor, got shape {tuple(shape)}")
    if dtype not in _DTYPES:
        raise NormkitError(f"normality_triton takes float16, bfloat16, float32 or float64 input, got {dtype}; "
                           "use kernel=torch")
    if math.prod(shape) >= 2**31:
        raise NormkitError(f"normality_triton addresses with 32-bit offsets; {math.prod(shape)} elements is too "
                           "many (split the batch or use kernel=torch)")
    if partition not in ("batch", "layer", "instance", "group"):
        raise SpecError(f"normality_triton: partition must be batch, layer, instance or group, got {partition!r}")
    Partition(partition, groups).check(shape[1], "normality_triton")
    if partition == "batch" and any(given) and not all(given):
        raise SpecError("normality_triton: pass running_mean, running_var and running_lambda together (or none)")
    if partition == "batch" and training and shape[0] * shape[2] < 2:
        raise NormShapeError("normality_triton: needs more than 1 value per channel when training")
    return geometry(shape, partition, groups, tokens), _dense(shape, strides)


def _dense(shape: torch.Size, strides: tuple[int, ...]) -> bool:
    """Contiguous (N, C, S) or channels-last (N, S, C) memory: the layouts the kernels index."""
    n, c, s = shape
    contiguous = all(size == 1 or stride == want for size, stride, want in zip(shape, strides, (c * s, s, 1)))
    return n * c * s == 0 or contiguous or (strides[1] == 1 and strides[2] == c and (n == 1 or strides[0] == c * s))
