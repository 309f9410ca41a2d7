"""The `nn` step: power transform to normality plus scaled noise, after a standardizing step.

`forward` is the readable reference on grouped values (used while the layer records or probes,
and as the oracle in tests); `fused_forward` computes the whole layer through `normality_norm`
(torch) or the Triton kernel, which compute the same function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from normkit import NormkitError, SpecError
from normkit.stages import BuildContext, GhostRegroup, Groups, Standardize, Step, ghost_regroup
from torch import Tensor

from normkit_normalnorm import rows
from normkit_normalnorm.compiled import fused_config, needs_grad, normality_compiled, takes_grouped_step
from normkit_normalnorm.functional import normality_norm
from normkit_normalnorm.yeojohnson import (
    clamp_lambda,
    newton_lambda,
    noise_scale,
    standard_normal_like,
    yeo_johnson,
)

if TYPE_CHECKING:
    from normkit.layer import NormLayer

Kernel = Literal["auto", "torch", "triton", "compiled"]
DEFAULT_NOISE = {"batch": 0.4, "group": 0.4, "instance": 0.4, "layer": 1.0}


class NormalityStep(Step):
    """Estimate lambda per group (one Newton step), apply Yeo-Johnson, add noise when training."""

    name = "nn"
    reduces_through_groups = True  # ghost batches run through `forward` as one grouped tensor
    fused_ghost_batches = True  # and through `fused_forward`, regrouped (see `_fused_ghost_batches`)
    fused_input_dtype = True  # fp16/bf16 reach the Triton kernel as they are (half the bytes read)

    def __init__(self, partition_kind: str, *, noise: float | None, alpha: float, eps: float,
                 momentum: float | None, lambda_min: float | None, lambda_max: float | None,
                 detach_lambda: bool, kernel: Kernel) -> None:
        _validate(noise, alpha, eps, momentum, lambda_min, lambda_max)
        self.noise = DEFAULT_NOISE[partition_kind] if noise is None else noise
        self.alpha = alpha
        self.eps = eps
        self.momentum = momentum
        self.lambda_min = lambda_min
        self.lambda_max = lambda_max
        self.detach_lambda = detach_lambda
        self.kernel = kernel
        self._standardize: Standardize | None = None
        self._noise_given = noise is not None

    # -- setup ------------------------------------------------------------------------------

    def setup(self, layer: NormLayer) -> None:
        index = next(i for i, step in enumerate(layer.steps) if step is self)
        before = layer.steps[index - 1] if index > 0 else None
        if not isinstance(before, Standardize):
            got = before.name if before is not None else "nothing"
            raise SpecError(f"{layer.spec or 'norm'}: nn needs standardized input, so a standardizing norm "
                            f"(bn, ln, gn, in) right before it; got {got}")
        self._standardize = before
        if self._tracks(layer):
            layer.register_buffer("running_lambda", torch.ones(layer.num_channels))

    def _tracks(self, layer: NormLayer) -> bool:
        """Batch partitions with running statistics keep running_lambda for eval."""
        return layer.partition.uses_batch and self._standardize.track_running_stats

    # -- reference path -----------------------------------------------------------------------

    def forward(self, x: Tensor, groups: Groups, layer: NormLayer) -> Tensor:
        dims = groups.dims
        if self._tracks(layer) and not layer.training:
            lam = clamp_lambda(groups.per_channel(layer.running_lambda.to(x.dtype)),
                               self.lambda_min, self.lambda_max)
        else:
            lam = clamp_lambda(newton_lambda(x, dims, self.alpha, self.eps, mean=groups.mean),
                               self.lambda_min, self.lambda_max)
            if self.detach_lambda:
                lam = lam.detach()
            if self._tracks(layer) and layer.training:
                with torch.no_grad():
                    layer.running_lambda.lerp_(groups.channel_stat(lam).to(layer.running_lambda),
                                               self._factor(layer))
        layer.record("lambda", lambda: lam.squeeze(dims))
        out = yeo_johnson(x, lam)
        layer.record("post_transform", lambda: groups.ungroup(out))
        if layer.training and self.noise:
            z = _ghost_noise(out) if groups.ghosted else \
                standard_normal_like(groups.ungroup(out), layer.tokens).reshape(out.shape)
            out = out + self.noise * noise_scale(out, dims, mean=groups.mean) * z
        return out

    def _factor(self, layer: NormLayer) -> float:
        """EMA factor for running_lambda (the standardize step already counted this batch)."""
        if self.momentum is None:
            return 1.0 / float(layer.num_batches_tracked)
        return self.momentum

    # -- fast paths ---------------------------------------------------------------------------

    def fused_forward(self, x: Tensor, layer: NormLayer) -> Tensor | None:
        """The whole layer in one call: standardize, lambda, transform, noise, affine.

        Declines (reference path) when other steps are composed in, or when the standardize step's
        eps/momentum differ from nn's (the fused contract has one eps and one momentum).
        """
        std = self._standardize
        if len(layer.steps) != 2 or std.eps != self.eps:
            return None
        tracks = self._tracks(layer)
        if tracks and std.momentum != self.momentum:
            return None
        kernel = self._kernel_for(x)
        on_torch = kernel is normality_norm or kernel is normality_compiled
        if on_torch and (torch.compiler.is_compiling() or torch.jit.is_tracing()):
            # The fused CPU path writes into `out=` views of scratch buffers, which inductor cannot
            # functionalize and torch.jit.trace records as different graphs on each call; under
            # torch.compile or jit tracing the reference path (same function) is traced.
            return None
        if kernel is normality_compiled:
            out = self._small_step(x, layer, tracks)
            if out is not None:
                return out
        if on_torch and x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # the PyTorch path computes in float32; the Triton kernel reads x as it is
        n, c = x.shape[0], layer.num_channels
        s = math.prod(x.shape[1:-1]) if layer.tokens else math.prod(x.shape[2:])  # explicit: N may be 0
        x3 = _as_shape(x, (n, s, c)).transpose(1, 2) if layer.tokens else _as_shape(x, (n, c, s))
        batch = layer.partition.uses_batch
        if batch and layer.training and x3.shape[0] * x3.shape[2] < 2:
            raise layer.shape_error("needs more than 1 value per channel when training")
        regroup = ghost_regroup(layer.partition, n, layer.training, tracks)
        if regroup is not None:
            y3 = self._fused_ghost_batches(kernel, x3, layer, tracks, regroup)
        else:
            y3 = self._call(kernel, x3, layer, tracks, layer.recovery_params(), _layer_buffers(layer, tracks),
                            layer.tokens)
        return _as_shape(y3.transpose(1, 2) if layer.tokens else y3, x.shape)

    def _small_step(self, x: Tensor, layer: NormLayer, tracks: bool) -> Tensor | None:
        """A small float32 CPU step in one call of rows.c's grouped functions on `x` itself, or None (the general
        route below). The same function `normality_compiled` calls for these steps, with what it would decide
        decided here (`compiled.takes_grouped_step`): at tiny shapes the layer's cost is its host work, and the
        general route spends more of it on views of x, keyword arguments and repeated checks than rows.c
        spends on the arithmetic (docs/performance.md, "Host work per training call")."""
        if not (type(x) is Tensor and x.dtype == torch.float32 and x.is_cpu and x.is_contiguous()):
            return None
        partition, training = layer.partition, layer.training
        if partition.ghost is not None or (tracks and not training):
            return None
        weight, bias = layer.recovery_params()
        wants_grad = needs_grad(x, weight, bias)
        running = _layer_buffers(layer, tracks)
        layout = takes_grouped_step(x, weight, bias, running, partition.kind, partition.groups, layer.tokens,
                                    training, wants_grad)
        if layout is None or (partition.kind == "batch" and training and layout.runs * layout.length < 2):
            return None  # the general route (its one-line error for one value per channel)
        factor = self._standardize.update_factor(layer) if tracks else None
        cfg = fused_config(partition.kind, partition.groups, layer.tokens, training, self.eps, self.alpha,
                           self.noise, 0.0 if factor is None else factor, self.lambda_min, self.lambda_max,
                           self.detach_lambda, wants_grad)
        return rows.normality_groups(x, weight, bias, cfg, layout, running)

    def _call(self, kernel: Callable[..., Tensor], x3: Tensor, layer: NormLayer, tracks: bool,
              affine: tuple[Tensor | None, Tensor | None], buffers: tuple[Tensor, ...] | None,
              tokens: bool) -> Tensor:
        """One call of the fused function on an `(N, C, S)` view with these affine and running buffers."""
        factor = self._standardize.update_factor(layer) if tracks else None
        running_mean, running_var, running_lambda = buffers if buffers is not None else (None, None, None)
        return kernel(
            x3, *affine, partition=layer.partition.kind, groups=layer.partition.groups,
            tokens=tokens, training=layer.training, eps=self.eps, alpha=self.alpha,
            noise=self.noise, running_mean=running_mean, running_var=running_var, running_lambda=running_lambda,
            momentum=factor if factor is not None else self.momentum, lambda_min=self.lambda_min,
            lambda_max=self.lambda_max, detach_lambda=self.detach_lambda)

    def _fused_ghost_batches(self, kernel: Callable[..., Tensor], x3: Tensor, layer: NormLayer, tracks: bool,
                             regroup: GhostRegroup) -> Tensor:
        """Ghost batches in one call: the `(N, C, S)` view regrouped into one batch of `ghost` samples whose
        channels are the (ghost batch, channel) pairs, the affine and running buffers repeated per ghost
        batch, the layer keeping the mean of the buffers' copies (normkit.ghost's rule). The noise is drawn
        in the regrouped order, as the reference path draws it for ghost batches (`_ghost_noise`)."""
        def normalize(xb: Tensor, w: Tensor | None, b: Tensor | None, buffers: tuple[Tensor | None, ...]) -> Tensor:
            return self._call(kernel, xb, layer, tracks, (w, b), buffers if tracks else None, tokens=False)

        return regroup.apply(normalize, x3, *layer.recovery_params(), _layer_buffers(layer, tracks) or ())

    def _kernel_for(self, x: Tensor) -> Callable[..., Tensor]:
        if self.kernel == "torch" or x.numel() == 0:  # an empty batch has nothing to launch a kernel on
            return normality_norm
        if self.kernel == "compiled" or (self.kernel == "auto" and not x.is_cuda):
            return normality_compiled  # compiled on CPU where it pays, normality_norm otherwise
        try:
            from normkit_normalnorm import triton_kernels
        except ImportError as err:
            if self.kernel == "auto":
                return normality_norm
            raise NormkitError(f"nn(kernel=triton): the Triton kernel cannot be imported ({err}); "
                               "install triton or use kernel=torch") from err
        if triton_kernels.available(x):
            return triton_kernels.normality_triton
        if self.kernel == "auto":
            return normality_norm
        raise NormkitError("nn(kernel=triton): Triton is not available on this machine/device; "
                           "use kernel=auto or kernel=torch")

    # -- description --------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        clamp = "none" if self.lambda_min is None and self.lambda_max is None else (
            f"[{'-inf' if self.lambda_min is None else self.lambda_min}, "
            f"{'inf' if self.lambda_max is None else self.lambda_max}]")
        return {
            "noise": self.noise if self._noise_given else f"{self.noise} (default for this partition)",
            "alpha": self.alpha,
            "eps": self.eps,
            "momentum": self.momentum,
            "lambda_clamp": clamp,
            "detach_lambda": self.detach_lambda,
            "kernel": self.kernel,
        }


def _ghost_noise(grouped: Tensor) -> Tensor:
    """N(0, 1) noise for ghost batches grouped as `(N/ghost, ghost, C, S)`, drawn in the order of the fused
    path's regrouped `(ghost, N/ghost * C, S)` batch, so the reference and fused paths add the same noise."""
    k, ghost, c, s = grouped.shape
    return standard_normal_like(grouped.new_empty(ghost, k * c, s), False).view(ghost, k, c, s).transpose(0, 1)


def _as_shape(t: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """`t.reshape(shape)`, or `t` itself when it has that shape already (no view op, no autograd view node:
    at tiny shapes each costs host work in the forward and again in the backward)."""
    return t if t.shape == shape else t.reshape(shape)


def _layer_buffers(layer: NormLayer, tracks: bool) -> tuple[Tensor, Tensor, Tensor] | None:
    """The layer's (running_mean, running_var, running_lambda) when it tracks them, else None."""
    return layer.registered("running_mean", "running_var", "running_lambda") if tracks else None


def _validate(noise: float | None, alpha: float, eps: float, momentum: float | None,
              lambda_min: float | None, lambda_max: float | None) -> None:
    if noise is not None and not noise >= 0:
        raise SpecError(f"nn: noise must be >= 0 (0 turns the noise off), got {noise}")
    if not alpha > 0:
        raise SpecError(f"nn: alpha (the Newton step size) must be > 0, got {alpha}")
    if not eps > 0:
        raise SpecError(f"nn: eps must be > 0, got {eps}")
    if momentum is not None and not 0.0 <= momentum <= 1.0:
        raise SpecError(f"nn: momentum must be in [0, 1] or none, got {momentum}")
    if lambda_min is not None and lambda_max is not None and not lambda_min <= lambda_max:
        raise SpecError(f"nn: lambda_min ({lambda_min}) must be <= lambda_max ({lambda_max})")
    for name, value in (("lambda_min", lambda_min), ("lambda_max", lambda_max)):
        if value is not None and not math.isfinite(value):
            raise SpecError(f"nn: {name} must be a finite number or none, got {value}")


def normality_stage(ctx: BuildContext, *, noise: float | None = None, alpha: float = 1.0,
                    eps: float = 1e-5, momentum: float | None = 0.1, lambda_min: float | None = None,
                    lambda_max: float | None = None, detach_lambda: bool = False,
                    kernel: Kernel = "auto") -> NormalityStep:
    """nn: Yeo-Johnson power transform with a one-Newton-step lambda, plus noise scaled per group.

    noise: the factor xi; None means 0.4, or 1.0 for layer partitions (the paper's settings).
    alpha: Newton step size. eps: Newton denominator guard sqrt(eps) (and the standardize eps
    when given through `bnn`). momentum: EMA factor of running_lambda (None: cumulative average).
    lambda_min/lambda_max: optional clamp of lambda_hat. detach_lambda: no gradient through it.
    kernel: "torch" fused path, "triton" CUDA kernel, "compiled" the fused math compiled by
    torch.compile on CPU for large training steps (`compiled.py`; the torch path otherwise),
    "auto": Triton on CUDA when available, else "compiled".
    """
    if ctx.partition is None:
        raise SpecError("nn needs a standardizing norm before it (bn, ln, gn, in)")
    return NormalityStep(ctx.partition.kind, noise=noise, alpha=alpha, eps=eps, momentum=momentum,
                         lambda_min=lambda_min, lambda_max=lambda_max, detach_lambda=detach_lambda,
                         kernel=kernel)
