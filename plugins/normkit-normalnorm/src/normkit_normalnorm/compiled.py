"""The compiled CPU path: the fused math as two functions that torch.compile (Inductor) turns into C++.

Why: on CPU the eager fused path (`fused.py`) still runs about 48 activation-sized torch ops per
training step, each a pass over memory; BatchNorm runs about 4. Inductor fuses each function here
into a few vectorized loops: the forward reads x for the moments, the Newton sums, mean(x),
mean|x - mean x| and the output, computing log1p|h| and expm1(mu log1p|h|) once each; the
backward reuses both (saved), and takes every per-group sum in one loop (all are linear in the
lambda gradient) and dx in a second. What made it cheaper (issue 24, docs/performance.md):
float32 log1p/expm1/log/cos as straight-line polynomial code (`fastmath.py`) with multiply-adds
contracted to FMAs, instead of SLEEF calls; sums over the contiguous S first (`_sum`, `_moments`),
which spares Inductor's cascade-sum and Welford helpers; one reciprocal of mu per group instead of
a division per value; Box-Muller noise using both of its outputs.

When: `normality_compiled` (the layer's `kernel=auto` on CPU, or `kernel=compiled`) takes this path
for a training step with gradients of at least `MIN_ELEMENTS` values that `rows.py` does not take: since
normkit-normalnorm 0.1.9 float32 steps of a dense layout run rows.c's grouped functions at every size (the
same math and, from MIN_ELEMENTS values, the same hash noise drawn in C; 1.4x BatchNorm's step at
128x64x32x32 on one AVX2 thread, where this path's code was 2.9x), so this is float64, a batch partition on
channels-last tokens, or an input that is not contiguous (and where rows.c cannot be built, these functions run
eagerly, with the same hash noise); everything else goes to rows.c's paths or `normality_norm`. The first
call per configuration compiles (tens of seconds on 2 cores; logged once, with its time, and
cached on disk by Inductor for later processes); a second input shape compiles once more, then
shape-generic code serves every later shape (torch.compile's automatic dynamic shapes). If compiling fails (no C++ compiler, an
unsupported torch), the failure is logged once and the same functions run eagerly, so nothing
depends on a compiler at install or run time. `NORMKIT_NN_COMPILE=0` turns the path off.

Noise: a counter-based generator (a 32-bit integer hash of the seed and a pair of logical
indices, then Box-Muller) that Inductor vectorizes; the seed comes from torch's default generator,
so `torch.manual_seed` reproduces it, but the values differ from `torch.randn`'s (which is serial
on CPU and cost more than BatchNorm's whole step at 128x64x32x32).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from normkit.autograd import once_differentiable
from normkit.stages import Partition
from torch import Tensor

from normkit_normalnorm import fastmath, rows, switches
from normkit_normalnorm.functional import ema_factor, normality_norm, update_running
from normkit_normalnorm.fused import FusedConfig

MIN_ELEMENTS = rows.HASH_NOISE_FROM  # 2^20 values: from here the hash noise, and Inductor's code for float64
_TINY_MU = 1e-20  # as fused.py: stands in for mu == 0
_log = logging.getLogger("normkit.normalnorm")
_lock = threading.Lock()
_compiled: dict[tuple, Callable[..., Any] | None] = {}  # None: compiling failed, run eagerly
report: dict[str, float] = {}  # configuration -> seconds its first compiled call took
# Inductor options for every function: -ffp-contract=fast lets the C++ compiler fuse a * b + c into
# one FMA (fastmath's polynomials ran 1.3-1.9x faster; an FMA rounds once, so no less accurate).
OPTIONS: dict[str, Any] = {"cpp.enable_floating_point_contract_flag": "fast"}
LARGE_ELEMENTS = 1 << 23  # 32 MiB of float32: glibc then maps (and the kernel zeroes) every new buffer afresh
_RECOMPUTE = {"realize_opcount_threshold": 1000, "realize_reads_threshold": 100, "realize_acc_reads_threshold": 100}
# Inductor options per function. "backward large" (inputs of LARGE_ELEMENTS or more): recompute
# dx/dh and dlam/dh in the dx loop instead of storing them for it (two fewer activation-sized
# buffers, each about 8k page faults at this size; 76 -> 55 ms at 128x64x32x32 on one thread,
# while at 128x256x8x8, whose buffers glibc reuses, storing them is faster: 6.9 against 8.3 ms).
KIND_OPTIONS: dict[str, dict[str, Any]] = {"forward": {}, "backward": {}, "backward large": _RECOMPUTE}


def _setting() -> str:
    return switches.setting("NORMKIT_NN_COMPILE", "1")


def enabled() -> bool:
    """False when NORMKIT_NN_COMPILE=0 or this torch has no torch.compile. NORMKIT_NN_COMPILE=eager
    runs this path's functions without compiling them (for tests and debugging)."""
    return _on(_setting())


def _on(setting: str) -> bool:
    return setting not in ("0", "false", "no", "off") and hasattr(torch, "compile")


def normality_compiled(x3: Tensor, weight: Tensor | None, bias: Tensor | None, *, partition: str, groups: int = 1,
                       tokens: bool = False, training: bool, eps: float = 1e-5, alpha: float = 1.0,
                       noise: float = 0.0, running_mean: Tensor | None = None,
                       running_var: Tensor | None = None, running_lambda: Tensor | None = None,
                       momentum: float | None = 0.1, lambda_min: float | None = None,
                       lambda_max: float | None = None, detach_lambda: bool = False,
                       num_batches_tracked: Tensor | None = None) -> Tensor:
    """`normality_norm`'s contract; compiled where it pays (see the module docstring), else the eager path.

    One eligibility check per call (a real float CPU tensor, the path on), then by size. Under MIN_ELEMENTS
    values, with or without gradients: rows.c's grouped functions in float32 (the eager path's function and
    torch.randn noise, to float32 rounding), except per-token layer statistics in a training step with
    gradients from rows.MIN_ELEMENTS (rows.c's row kernel, hash noise). From MIN_ELEMENTS, with gradients:
    rows.c's grouped functions in float32 (drawing the hash noise in C), else Inductor's code; without: rows.c's
    inference functions for per-token rows, the grouped functions (output only) for other eval forwards,
    the eager path in training (torch.randn's noise). A batch partition's eval with running statistics:
    rows.c's inference function from rows.MIN_ELEMENTS without gradients. Everything
    else (float64 under MIN_ELEMENTS, other devices, this path off): the eager path."""
    tracked = partition == "batch" and running_mean is not None
    wants_grad = needs_grad(x3, weight, bias)
    numel = x3.numel()
    setting = _setting()  # read once per call
    on = numel >= 1 and _real_cpu(x3, setting)
    in_c = on and setting != "eager"  # rows.c's paths (NORMKIT_NN_COMPILE=eager runs only this file's math)
    running_eval = tracked and not training
    if in_c and not wants_grad and numel >= rows.MIN_ELEMENTS and (numel >= MIN_ELEMENTS or running_eval):
        out = rows.inference(x3, weight, bias, partition=partition, tokens=tokens, training=training, eps=eps,
                             alpha=alpha, noise=noise, lambda_min=lambda_min, lambda_max=lambda_max,
                             running_mean=running_mean if tracked else None, running_var=running_var,
                             running_lambda=running_lambda)
        if out is not None:
            return out
    if not on or running_eval:
        return _eager(x3, weight, bias, partition, groups, tokens, training, eps, alpha, noise, running_mean,
                      running_var, running_lambda, momentum, lambda_min, lambda_max, detach_lambda,
                      num_batches_tracked)
    if partition != "batch":  # a batch partition has nothing to check here (no groups; ghost batches are split before)
        Partition(partition, groups).check(x3.shape[1], "normality_norm")
    if partition == "batch" and training and x3.shape[0] * x3.shape[2] < 2:  # its one-line error
        return _eager(x3, weight, bias, partition, groups, tokens, training, eps, alpha, noise, running_mean,
                      running_var, running_lambda, momentum, lambda_min, lambda_max, detach_lambda,
                      num_batches_tracked)
    factor = ema_factor(momentum, num_batches_tracked) if tracked and training else 0.0
    cfg = fused_config(partition, groups, tokens, training, eps, alpha, noise, factor, lambda_min, lambda_max,
                       detach_lambda, wants_grad)
    if in_c and wants_grad and numel >= rows.MIN_ELEMENTS and rows.eligible(x3, weight, bias, cfg):  # token rows
        if rows.library() is not None:
            return rows.normality_rows(x3, weight, bias, _seed(training, noise), cfg)
        # no row kernel here: the same math and hash noise on torch ops, so noise never depends on a compiler
        return CompiledFunction.apply(x3, weight, bias, _seed(training, noise), cfg, True)[0]
    if in_c and x3.dtype == torch.float32:  # a small step: rows.c's grouped functions
        mem = x3.transpose(1, 2) if tokens else x3  # in memory order
        running = (running_mean, running_var, running_lambda) if tracked and training else None
        layout = takes_grouped_step(mem, weight, bias, running, partition, groups, tokens, training, wants_grad)
        if layout is not None:
            out = rows.normality_groups(mem, weight, bias, cfg, layout, running)
            return out.transpose(1, 2) if tokens else out
    if not wants_grad or numel < MIN_ELEMENTS:
        return _eager(x3, weight, bias, partition, groups, tokens, training, eps, alpha, noise, running_mean,
                      running_var, running_lambda, momentum, lambda_min, lambda_max, detach_lambda,
                      num_batches_tracked)
    out, *stats = CompiledFunction.apply(x3, weight, bias, _seed(training, noise), cfg)
    if tracked and training:
        mean, var, lam = (stats[STATS.index(k)].reshape(-1) for k in ("mean", "var", "lam"))
        update_running(mean, var, lam, x3.shape[0] * x3.shape[2], factor, running_mean, running_var, running_lambda)
    return out


def needs_grad(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> bool:
    """Whether this call records a gradient: grad mode on and an input that requires one."""
    return torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad))


def takes_grouped_step(mem: Tensor, weight: Tensor | None, bias: Tensor | None,
                       running: tuple[Tensor, Tensor, Tensor] | None, partition: str, groups: int, tokens: bool,
                       training: bool, wants_grad: bool) -> rows.GroupLayout | None:
    """The grouped layout when a float32 step on `mem` (the input in memory order, its C paths on) runs rows.c's
    grouped functions, else None: from 1 value and under 2^31 (rows.c's 32-bit noise index), except without
    gradients in training or on tokens, under MIN_ELEMENTS (there the eager path keeps torch.randn's noise and
    per-token rows take `rows.inference`); dense, weight, bias and the running buffers (`running`, those the step
    updates, or None) dense float32; not a per-token training step with gradients from rows.MIN_ELEMENTS (the row
    kernel's). The caller has ruled out eval with running statistics. Shared by `normality_compiled` and the
    layer's direct call (stage.py)."""
    numel, setting = mem.numel(), _setting()
    most = 2**31 if wants_grad or not (training or tokens) else MIN_ELEMENTS
    if not (0 < numel < most and _on(setting) and setting != "eager" and mem.is_contiguous() and rows.enabled()
            and _dense_float32(weight) and _dense_float32(bias) and (running is None or all(map(_dense_float32, running)))):
        return None
    if wants_grad and training and tokens and partition == "layer" and numel >= rows.MIN_ELEMENTS:
        return None
    if rows.library() is None:
        return None
    return rows.grouped_layout(mem.shape, partition, groups, tokens)


def _dense_float32(t: Tensor | None) -> bool:
    """None, or a contiguous float32 tensor (what rows.c reads by address)."""
    return t is None or (t.dtype == torch.float32 and t.is_contiguous())


@functools.lru_cache(maxsize=256)
def fused_config(*fields: Any) -> FusedConfig:
    """FusedConfig built once per distinct call (hashing its fields is cheaper than building it)."""
    return FusedConfig(*fields)


def _eager(x3: Tensor, weight: Tensor | None, bias: Tensor | None, partition: str, groups: int, tokens: bool,
           training: bool, eps: float, alpha: float, noise: float, running_mean: Tensor | None,
           running_var: Tensor | None, running_lambda: Tensor | None, momentum: float | None,
           lambda_min: float | None, lambda_max: float | None, detach_lambda: bool,
           num_batches_tracked: Tensor | None) -> Tensor:
    return normality_norm(x3, weight, bias, partition=partition, groups=groups, tokens=tokens, training=training,
                          eps=eps, alpha=alpha, noise=noise, running_mean=running_mean, running_var=running_var,
                          running_lambda=running_lambda, momentum=momentum, lambda_min=lambda_min,
                          lambda_max=lambda_max, detach_lambda=detach_lambda, num_batches_tracked=num_batches_tracked)


def _seed(training: bool, noise: float) -> Tensor:
    """The noise's seed (`rows.noise_seed`), or 0 where no noise is drawn."""
    if training and noise:
        return rows.noise_seed()
    return torch.zeros(1, dtype=torch.int32)


def pays(x3: Tensor, minimum: int | None = None) -> bool:
    """A real float32/float64 CPU tensor large enough (`minimum` values, default MIN_ELEMENTS) that
    the compiled code beats the eager ops."""
    return (MIN_ELEMENTS if minimum is None else minimum) <= x3.numel() and _real_cpu(x3, _setting())


_fake_check: list[Callable[[Tensor], bool]] = []  # torch's is_fake, imported on the first call (not per call)


def _real_cpu(x3: Tensor, setting: str) -> bool:
    """This path on (`setting`: NORMKIT_NN_COMPILE), and x3 a real float32/float64 CPU tensor under 2^31 values,
    outside torch.compile's and torch.jit's tracing (they trace the reference path)."""
    if not (x3.device.type == "cpu" and x3.dtype in (torch.float32, torch.float64) and x3.numel() < 2**31
            and _on(setting)):
        return False
    if not _fake_check:
        from torch._subclasses.fake_tensor import is_fake

        _fake_check.append(is_fake)
    fake = type(x3) is not torch.Tensor and _fake_check[0](x3)  # a fake tensor is a Tensor subclass
    return not fake and not torch.compiler.is_compiling() and not torch.jit.is_tracing()


class CompiledFunction(torch.autograd.Function):
    """Forward and backward each one compiled function; saves x3, the noisy values, log1p|h|, the
    power term and the per-group statistics."""

    @staticmethod
    def forward(ctx: Any, x3: Tensor, weight: Tensor | None, bias: Tensor | None, seed: Tensor,
                cfg: FusedConfig, eager: bool = False) -> tuple[Tensor, ...]:
        runner = _eagerly if eager else run
        out, y, log1p_a, power, *stats = runner("forward", cfg, forward_math, x3, weight, bias, seed)
        ctx.cfg = cfg
        ctx.runner = runner
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x3, weight, y, log1p_a, power, *stats)
        ctx.mark_non_differentiable(*stats)
        return (out, *stats)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor, *_grad_stats: Any) -> tuple[Tensor | None, ...]:
        x3, weight, y, log1p_a, power, *stats = ctx.saved_tensors
        kind = "backward large" if x3.numel() >= LARGE_ELEMENTS else "backward"
        dx, dw, db = ctx.runner(kind, ctx.cfg, backward_math, grad_out, x3, weight, y, log1p_a, power,
                                ctx.has_bias, *stats)
        return (dx if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None,
                db if ctx.needs_input_grad[2] else None, None, None, None)


def _eagerly(kind: str, cfg: FusedConfig, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args, cfg)` as plain torch ops: the row kernel's fallback (no compiler, so no Inductor either)."""
    return fn(*args, cfg=cfg)


def run(kind: str, cfg: FusedConfig, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args, cfg)` compiled once per (kind, configuration); eagerly if compiling fails."""
    key = (kind, cfg.partition, cfg.groups, cfg.tokens, cfg.training, cfg.eps, cfg.alpha, cfg.noise,
           cfg.lambda_min, cfg.lambda_max, cfg.detach_lambda, tuple(a is None or a is False for a in args),
           tuple(sorted(OPTIONS.items())), tuple(sorted(KIND_OPTIONS.get(kind, {}).items())))
    if _setting() == "eager":
        return fn(*args, cfg=cfg)
    with _lock:
        compiled = _compiled.get(key, ...)
        if compiled is ...:
            options = {**OPTIONS, **KIND_OPTIONS.get(kind, {})}
            compiled = _compiled[key] = torch.compile(lambda *a: fn(*a, cfg=cfg), fullgraph=True,
                                                      options=options or None)
    if compiled is None:
        return fn(*args, cfg=cfg)
    label = f"{kind} {cfg.partition}{'(tokens)' if cfg.tokens else ''}"
    first = label not in report
    start = time.perf_counter()
    try:
        result = compiled(*args)
    except Exception as err:  # noqa: BLE001 (any compile failure: fall back, once, loudly)
        with _lock:
            _compiled[key] = None
        _log.warning("normkit: compiling the normality norm's CPU %s failed (%s: %s); running it eagerly "
                     "(set NORMKIT_NN_COMPILE=0 to skip compiling)", kind, type(err).__name__,
                     str(err).splitlines()[0] if str(err) else "")
        return fn(*args, cfg=cfg)
    if first:
        report[label] = time.perf_counter() - start
        _log.info("normkit: compiled the normality norm's CPU %s in %.1f s (Inductor caches it on disk)", label,
                  report[label])
    return result


# -- the math (plain torch ops: Inductor compiles them; they also run eagerly) ------------------


def _grouped(t: Tensor, cfg: FusedConfig) -> tuple[Tensor, tuple[int, ...]]:
    """The `(N, C, S)` tensor regrouped so each normalization group reduces over the returned dims."""
    g, groups = Partition(cfg.partition, cfg.groups).group(t, cfg.tokens)
    return g, groups.dims


def _sum(t: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Keepdim sum over `dims`, the last (contiguous) dimension first when there are several.

    Why: Inductor reduces a float32 sum of more than 4096 values per output through a cascade
    helper (a running sum kept in memory, a counter and a branch per vector) and walks a per-channel
    reduction over (N, S) with N strided; reducing S first is one short contiguous loop per (n, c)
    in the same order as the elementwise loops, and the partial sums over N are tiny.
    """
    last = t.dim() - 1
    if len(dims) > 1 and dims[-1] == last:
        return t.sum(last, keepdim=True).sum(dims[:-1], keepdim=True)
    return t.sum(dims, keepdim=True)


def _moments(g: Tensor, dims: tuple[int, ...], n: int) -> tuple[Tensor, Tensor]:
    """(mean, biased variance) per group by the corrected two-pass algorithm, in `_sum`'s order.

    Why not var_mean: Inductor's Welford reduction costs about three sums. The correction sum(d)
    makes a constant group's mean that constant exactly (as Welford's is), so its h is exactly 0.
    """
    rough = _sum(g, dims) / n
    d = g - rough
    sum_d = _sum(d, dims)
    mean = rough + sum_d / n
    sum_dd = _sum(d * d, dims)
    var = ((sum_dd - sum_d * sum_d / n) / n).clamp_min(0)
    # sum_dd = inf (an outlier whose square overflows): var = inf, so rstd = 0 and h = 0, as torch's
    # own norms give, instead of inf - inf = NaN when sum_d^2 overflows too
    return mean, torch.where(sum_dd == math.inf, sum_dd, var)


def _per_channel(v: Tensor, cfg: FusedConfig) -> Tensor:
    return v.view(1, cfg.groups, -1, 1) if cfg.partition == "group" else v.view(1, -1, 1)


def standard_normal(x3: Tensor, seed: Tensor, tokens: bool) -> Tensor:
    """N(0, 1) per value of the `(N, C, S)` shape from a hash of (seed, logical index): the input's
    `(N, C, S)` order, or `(N, S, C)` for channels-last tokens (as `standard_normal_like`).

    Box-Muller with both of its outputs: pair p (of ceil(numel / 2)) hashes (seed, p) into u1, u2
    and gives r cos(2 pi u2) to logical index p and r sin(2 pi u2) to index p + ceil(numel / 2),
    so the hash, log and sqrt are paid once per two values (Inductor writes the two halves as two
    loops over the pairs; a fifth of the forward's time before this).
    int32 arithmetic (products wrap, as the hash wants; shifts masked to act as logical shifts):
    AVX2 has no 64-bit multiply, and int64 made the draw twice as slow. `seed`: one int32 value.
    """
    if tokens:  # drawn as an (N, S, C) tensor: Inductor then stores it in the tokens' memory order
        return standard_normal(x3.transpose(1, 2), seed, False).transpose(1, 2)
    numel = x3.numel()
    pair = torch.arange((numel + 1) // 2, dtype=torch.int32)
    first = _hash32(pair ^ seed)
    second = _hash32(first ^ 0x632BE5AB)
    u1 = (((first >> 8) & 0xFFFFFF).to(torch.float32) + 0.5) * (1.0 / 16777216)  # (0, 1): log(u1) is finite
    u2 = ((second >> 8) & 0xFFFFFF).to(torch.float32) * (1.0 / 16777216)
    radius = torch.sqrt(-2.0 * fastmath.log(u1))
    quarter_on = u2 + 0.75  # sin(2 pi u) = cos(2 pi (u + 3/4)), wrapped into [0, 1) (exactly)
    quarter_on = torch.where(quarter_on >= 1.0, quarter_on - 1.0, quarter_on)
    z = torch.cat([radius * fastmath.cos_2pi(u2), radius * fastmath.cos_2pi(quarter_on)])
    return z[:numel].view(x3.shape)


def _hash32(v: Tensor) -> Tensor:
    """A 32-bit integer finalizer (xorshift-multiply, 'lowbias32') on int32 values."""
    v = v ^ ((v >> 16) & 0xFFFF)
    v = v * 0x7FEB352D
    v = v ^ ((v >> 15) & 0x1FFFF)
    v = v * -0x7B935975  # 0x846CA68B as a signed 32-bit value
    return v ^ ((v >> 16) & 0xFFFF)


def _sign_over_mu(h: Tensor, lam: Tensor) -> Tensor:
    """sign(h) / mu with mu = lam (h >= 0) or 2 - lam (h < 0), and mu == 0 standing in as a tiny
    number (then expm1(mu L) / mu -> L): two reciprocals per group, then a blend per value (a
    division per value cost more than the rest of the backward's first loop).

    mu is the same rounded number that the power term expm1(mu L) was computed with: dx/dlam =
    (sign L (E + 1) - x) sign / mu cancels to O(mu L^2), so a mu rounded differently in the two
    places (L + (lam - 1) sign L, say) is amplified by 1 / mu^2 where lambda is near 0 or 2.
    """
    inv_pos = 1 / torch.where(lam == 0, _TINY_MU, lam)
    inv_neg = -1 / torch.where(lam == 2, _TINY_MU, 2 - lam)
    return torch.where(h > 0, inv_pos, torch.where(h < 0, inv_neg, torch.zeros_like(inv_pos)))


STATS = ("mean", "var", "rstd", "lam", "in_range", "g1", "den", "dvar", "mean_d")  # per group, keepdim


def forward_math(x3: Tensor, weight: Tensor | None, bias: Tensor | None, seed: Tensor, *,
                 cfg: FusedConfig) -> tuple[Tensor, ...]:
    """(output, noisy pre-affine values y, log1p|h|, expm1(mu log1p|h|) (all three grouped), *per-group
    statistics in STATS order) of a batch-statistics step. Inductor writes log1p|h| and the power
    term to memory anyway (three reductions and the output read them); handing them to backward
    spares it both transcendentals."""
    g, dims = _grouped(x3, cfg)
    n = math.prod([g.shape[d] for d in dims])
    mean, var = _moments(g, dims, n)
    rstd = torch.rsqrt(var + cfg.eps)
    h = (g - mean) * rstd
    a = h.abs()
    log1p_a = fastmath.log1p(a) if a.dtype == torch.float32 else torch.log1p(a)
    signed_log = torch.copysign(log1p_a, h)
    p = log1p_a + a * log1p_a  # (1 + a) L without rounding 1 + a: d = p - a cancels to about a^2 / 2
    d = p - a
    q = p * log1p_a - 2 * d
    mean_d = _sum(d, dims) / n
    mean_hd = _sum(h * d, dims) / n
    mean_dd = _sum(d * d, dims) / n
    mean_aq = _sum(a * q, dims) / n
    s1 = _sum(signed_log, dims) / n
    dvar = 2 * mean_hd
    d2var = 2 * (mean_aq + mean_dd - mean_d * mean_d)
    g1 = 0.5 * dvar - s1
    den = 0.5 * (d2var - dvar * dvar) + math.sqrt(cfg.eps)
    raw = 1 - cfg.alpha * g1 / den
    lam = raw if cfg.lambda_min is None and cfg.lambda_max is None else raw.clamp(cfg.lambda_min, cfg.lambda_max)
    in_range = (lam == raw).to(raw.dtype)
    mu = torch.where(h >= 0, lam, 2 - lam)
    power = (fastmath.expm1 if mu.dtype == torch.float32 else torch.expm1)(mu * log1p_a)  # (1 + a)^mu - 1
    x = power * _sign_over_mu(h, lam)
    scale = torch.zeros_like(mean)
    if cfg.training and cfg.noise:
        x_mean = _sum(x, dims) / n
        scale = _sum((x - x_mean).abs(), dims) / n
        z = standard_normal(x3, seed, cfg.tokens).reshape(g.shape)
        x = x + (cfg.noise * scale) * z
    out = x
    if weight is not None:
        out = out * _per_channel(weight, cfg)
    if bias is not None:
        out = out + _per_channel(bias, cfg)
    return out.reshape(x3.shape), x, log1p_a, power, mean, var, rstd, lam, in_range, g1, den, dvar, mean_d


def backward_math(grad_out: Tensor, x3: Tensor, weight: Tensor | None, y: Tensor, log1p_a: Tensor, power: Tensor,
                  has_bias: bool, *values: Tensor, cfg: FusedConfig) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias): gh = gx dx/dh + glam dlam/dh per group, then the standardization's backward.

    Every per-group sum is linear in glam = sum(gx dx/dlam), so one loop takes them all:
    mean(gh) = mean(A) + glam mean(B) and mean(gh h) = mean(A h) + glam mean(B h).
    """
    stats = dict(zip(STATS, values))
    g, dims = _grouped(x3, cfg)
    dy, _ = _grouped(grad_out, cfg)
    n = math.prod([g.shape[d] for d in dims])
    mean, rstd, lam = stats["mean"], stats["rstd"], stats["lam"]
    h = (g - mean) * rstd
    a = h.abs()
    signed_log = torch.copysign(log1p_a, h)
    sign = torch.sign(h)
    inverse_u = 1 / (1 + a)  # one division per value, used twice
    e1 = power + 1  # (1 + a)^mu
    inverse_mu = _sign_over_mu(h, lam)
    gx = dy * _per_channel(weight, cfg) if weight is not None else dy
    grad_a = gx * (e1 * inverse_u)  # gx dx/dh
    mean_a = _sum(grad_a, dims) / n
    mean_ah = _sum(grad_a * h, dims) / n
    gh_mean, ghh_mean = mean_a, mean_ah
    lam_grads = not cfg.detach_lambda
    if lam_grads:
        x = power * inverse_mu  # sign L (E + 1) - x cancels to O(h^2): E, not E + 1 - 1
        grad_lam = _sum(gx * ((signed_log + signed_log * power - x) * inverse_mu), dims)
        grad_lam = grad_lam * stats["in_range"]
        den, g1, dvar, mean_d = stats["den"], stats["g1"], stats["dvar"], stats["mean_d"]
        k1 = (2 / n) * (-0.5 * cfg.alpha / den - dvar * cfg.alpha * g1 / (den * den))
        k2 = cfg.alpha * g1 / (n * den * den)
        k3 = cfg.alpha / (n * den)
        p = log1p_a + a * log1p_a  # (1 + a) L, as in forward_math
        d = p - a
        q = p * log1p_a - 2 * d
        w = d + a * log1p_a
        jac = k1 * w + k2 * (sign * q + signed_log * (w + d - 2 * mean_d)) + k3 * inverse_u  # dlam/dh
        gh_mean = mean_a + grad_lam * (_sum(jac, dims) / n)
        ghh_mean = mean_ah + grad_lam * (_sum(jac * h, dims) / n)
        grad_h = grad_a + grad_lam * jac
    else:
        grad_h = grad_a
    dx = (rstd * (grad_h - gh_mean - h * ghh_mean)).reshape(x3.shape)
    dweight = _sum(grad_out * y.reshape(x3.shape), (0, 2)).reshape(-1) if weight is not None else None
    dbias = _sum(grad_out, (0, 2)).reshape(-1) if has_bias else None
    return dx, dweight, dbias
