"""The stage model (NAP / NOP / NRR): partitions, operation steps and the pipeline description.

A norm layer works on a canonical channels-first view `(N, C, S)` of its input (S = product of
the spatial or token dims). The partition (NAP) regroups that view so each normalization group
is reduced over `Groups.dims`; operation steps (NOP) map grouped values to grouped values;
recovery (NRR) is a per-channel affine or gain on `(N, C, S)`; an activation step may follow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from normkit.errors import SpecError
from normkit.limits import check_positive
from normkit.native import native_rms, native_standardize

PartitionKind = Literal["batch", "layer", "instance", "group"]
RecoveryKind = Literal["affine", "gain", "none"]


@dataclass(frozen=True)
class Partition:
    """NAP: which values share statistics.

    batch: per channel over batch and spatial dims; layer: per sample over channels and spatial
    dims (per token over channels for channels-last tokens); instance: per sample and channel over
    spatial dims; group: per sample and group of C/groups channels over spatial dims.
    ghost (batch only): statistics over consecutive groups of `ghost` samples of the batch, each
    group normalized on its own (ghost batches, see `normkit.ghost`); None = the whole batch.
    """

    kind: PartitionKind
    groups: int = 1
    ghost: int | None = None

    def __str__(self) -> str:
        if self.ghost is not None:
            return f"{self.kind}(ghost={self.ghost})"
        return f"group({self.groups})" if self.kind == "group" else self.kind

    @property
    def uses_batch(self) -> bool:
        """True when statistics pool over the batch (needs running statistics for eval)."""
        return self.kind == "batch"

    def groups_per_sample(self, num_channels: int) -> int:
        """Statistics groups in each sample (each token, for channels-last tokens) of a layer/instance/group
        partition: 1, C or `groups`. A batch partition has none per sample: ValueError."""
        if self.kind == "batch":
            raise ValueError("a batch partition pools samples: it has no groups per sample")
        return {"layer": 1, "instance": num_channels, "group": self.groups}[self.kind]

    def values_per_group(self, shape: Sequence[int], num_channels: int, tokens: bool) -> int:
        """Values that share one set of statistics under a layer/instance/group partition, for an input of
        `shape` (`N, C, *`, or `N, *, C` with `tokens`): at least 2 for a variance (torch's native group
        norm refuses fewer)."""
        if tokens and self.kind == "layer":  # per token over its channels
            spatial = 1
        else:
            spatial = math.prod(shape[1:-1] if tokens else shape[2:])
        return num_channels // self.groups_per_sample(num_channels) * spatial

    def check(self, num_channels: int, owner: str) -> None:
        if self.ghost is not None:
            if self.kind != "batch":
                raise SpecError(f"{owner}: ghost= splits the batch of a batch-statistics norm (bn, bnn, ...); "
                                f"a {self.kind} partition normalizes each sample on its own, drop ghost=")
            if isinstance(self.ghost, bool) or not isinstance(self.ghost, int) or not 1 <= self.ghost <= 2**31:
                raise SpecError(f"{owner}: ghost must be a number of samples >= 1 (or none for the whole "
                                f"batch), got {self.ghost!r}")
        if self.kind == "group":
            if self.groups < 1:
                raise SpecError(f"{owner}: groups must be >= 1, got {self.groups}")
            if num_channels % self.groups:
                near = sorted(_divisors(num_channels), key=lambda d: (abs(d - self.groups), d))[:3]
                raise SpecError(
                    f"{owner}: {num_channels} channels are not divisible into {self.groups} groups;"
                    f" use groups={' or groups='.join(map(str, sorted(near)))}"
                )

    def group(self, x3: Tensor, tokens: bool) -> tuple[Tensor, Groups]:
        """Regroup a `(N, C, S)` view so each normalization group reduces over `Groups.dims`."""
        n, c, s = x3.shape
        if self.kind == "batch":
            if self.ghost is None or n <= self.ghost:
                return x3, Groups(self, (0, 2), x3.shape, n * s, c)
            # ghost batches (n a multiple of ghost, normkit.ghost): (N/ghost, ghost, C, S)
            return x3.reshape(n // self.ghost, self.ghost, c, s), Groups(self, (1, 3), x3.shape, self.ghost * s, c)
        if self.kind == "layer":
            if tokens:
                return x3, Groups(self, (1,), x3.shape, c, c)
            return x3, Groups(self, (1, 2), x3.shape, c * s, c)
        if self.kind == "instance":
            return x3, Groups(self, (2,), x3.shape, s, c)
        g = x3.reshape(n, self.groups, c // self.groups, s)
        return g, Groups(self, (2, 3), x3.shape, (c // self.groups) * s, c)


@dataclass(frozen=True)
class GhostRegroup:
    """Ghost batches for a fused kernel that pools a batch per channel: a batch of `count` ghost batches of
    `ghost` samples, `(N, C, S)`, as one batch of `ghost` samples over `count * C` channels, each (ghost
    batch, channel) pair a channel (`Step.fused_ghost_batches`). Per-channel tensors (affine, running
    buffers) are repeated per ghost batch; the layer's running buffers keep the mean of their copies."""

    ghost: int
    count: int

    def batch(self, x3: Tensor) -> Tensor:
        """`(N, C, S)` -> a contiguous `(ghost, count * C, S)`."""
        _, c, s = x3.shape
        return x3.reshape(self.count, self.ghost, c, s).transpose(0, 1).reshape(self.ghost, self.count * c, s)

    def unbatch(self, y: Tensor) -> Tensor:
        """`(ghost, count * C, S)` -> `(N, C, S)`."""
        _, kc, s = y.shape
        c = kc // self.count
        return y.reshape(self.ghost, self.count, c, s).transpose(0, 1).reshape(self.count * self.ghost, c, s)

    def channels(self, v: Tensor | None) -> Tensor | None:
        """A `(C,)` tensor repeated per ghost batch (a fresh copy; None stays None)."""
        return None if v is None else v.expand(self.count, -1).reshape(-1)  # a copy; half repeat's time

    def keep_mean(self, own: Tensor, copies: Tensor) -> None:
        """Write the mean over the ghost batches of a repeated buffer's copies into the layer's buffer."""
        with torch.no_grad():
            own.copy_(copies.view(self.count, -1).mean(dim=0))

    def apply(self, fn: Callable[[Tensor, Tensor | None, Tensor | None, tuple[Tensor | None, ...]], Tensor],
              x3: Tensor, weight: Tensor | None, bias: Tensor | None,
              buffers: tuple[Tensor | None, ...]) -> Tensor:
        """`fn(batch, weight, bias, buffers)` once on the regrouped `(N, C, S)` batch, with the affine and each
        running buffer (None stays None) repeated per ghost batch; each buffer then keeps the mean of its
        copies (normkit.ghost's rule). Returns fn's output as `(N, C, S)`."""
        copies = tuple(self.channels(b) for b in buffers)
        y = fn(self.batch(x3), self.channels(weight), self.channels(bias), copies)
        for own, copy in zip(buffers, copies, strict=True):
            if own is not None:
                self.keep_mean(own, copy)
        return self.unbatch(y)


def ghost_regroup(partition: Partition, n: int, training: bool, tracks: bool) -> GhostRegroup | None:
    """How a fused path takes ghost batches: a GhostRegroup when a batch of `n` samples normalizes over
    ghost batches now (training, or without running statistics), else None (one batch as usual)."""
    ghost = partition.ghost
    if ghost is None or n <= ghost or not (training or not tracks):
        return None
    if n % ghost:
        raise ValueError(f"a batch of {n} is not a multiple of ghost={ghost} (normkit.ghost splits off a remainder)")
    return GhostRegroup(ghost, n // ghost)


# Sums a per-group statistic over the processes of a synced batch (see `normkit.convert_sync`).
Reducer = Callable[[Tensor], Tensor]


def _divisors(n: int) -> list[int]:
    """All divisors of n, in O(sqrt(n)) steps (n is at most MAX_CHANNELS, so at most 4096 steps)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


@dataclass(frozen=True)
class Groups:
    """How a grouped tensor maps back to channels: reduction dims, sizes, per-channel views.

    The step API's statistics hook: steps compute every group statistic through `mean` and
    `var_mean`. For a layer synced across processes (`normkit.convert_sync`) `reduce` sums the
    local partial sums over the process group and `count` is the group size over all processes,
    so a step written this way computes on K processes exactly what it computes on the whole
    batch in one process. A step that reduces otherwise does not sync.
    """

    partition: Partition
    dims: tuple[int, ...]
    ncs_shape: torch.Size
    count: int  # elements in one normalization group (over every process when synced)
    num_channels: int
    reduce: Reducer | None = None

    def per_channel(self, v: Tensor) -> Tensor:
        """View a `(C,)` tensor so it broadcasts against the grouped values."""
        if self.partition.kind == "group":
            g = self.partition.groups
            return v.view(1, g, self.num_channels // g, 1)
        if self.ghosted:
            return v.view(1, 1, -1, 1)
        return v.view(1, -1, 1)

    @property
    def ghosted(self) -> bool:
        """True for ghost batches grouped as `(N/ghost, ghost, C, S)` (statistics per ghost batch)."""
        return self.dims == (1, 3) and self.partition.kind == "batch"

    def channel_stat(self, stat: Tensor) -> Tensor:
        """A batch partition's keepdim statistic `(1, C, 1)` as a `(C,)` vector; for ghost batches,
        `(N/ghost, 1, C, 1)`, the mean over the ghost batches (what running buffers average)."""
        if self.ghosted:
            return stat.mean(dim=0).reshape(self.num_channels)
        return stat.reshape(self.num_channels)

    def ungroup(self, g: Tensor) -> Tensor:
        return g.reshape(self.ncs_shape)

    @property
    def synced(self) -> bool:
        return self.reduce is not None

    def mean(self, t: Tensor) -> Tensor:
        """Mean of `t` over each normalization group (keepdim), across processes when synced."""
        if self.reduce is None:
            return t.mean(dim=self.dims, keepdim=True)
        return self.reduce(t.sum(dim=self.dims, keepdim=True)) / self.count

    def var_mean(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """Biased variance and mean per group (keepdim); two passes over the processes when synced."""
        if self.reduce is None:
            return torch.var_mean(t, dim=self.dims, unbiased=False, keepdim=True)
        mean = self.mean(t)
        return self.mean((t - mean) ** 2), mean


class StepHost(Protocol):
    """What a step sees of the layer that runs it (`normkit.NormLayer` is the one implementation).

    The stage model is typed against this protocol, not against the layer, so `stages.py` does
    not import the layer that uses it. Buffers and parameters a step registered in `setup`
    (`running_mean`, ...) are plain attributes of the host; `registered(*names)` reads several at
    once without nn.Module's slow attribute fallback (for per-call paths).
    """

    spec: str
    num_channels: int
    channel_dim: int
    partition: Partition | None
    steps: list[Step]
    training: bool
    act: Any

    @property
    def tokens(self) -> bool: ...

    def shape_error(self, problem: str) -> Exception: ...

    def record(self, key: str, value: Tensor | Callable[[], Tensor]) -> None: ...

    def recovery_params(self) -> tuple[Tensor | None, Tensor | None]: ...

    def registered(self, *names: str) -> tuple[Tensor | None, ...]: ...

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None: ...

    def register_parameter(self, name: str, param: Any) -> None: ...

    def __getattr__(self, name: str) -> Any: ...


@dataclass(frozen=True)
class BuildContext:
    """What a stage factory knows when the layer is built."""

    num_channels: int
    channel_dim: int
    partition: Partition | None
    activation: str | None = None


class Step:
    """One NOP operation on grouped values.

    Subclasses implement `forward`; `setup` registers parameters or buffers on the layer (so
    state_dict keys stay flat, e.g. `running_mean`, `running_lambda`), and `fused_forward` may
    compute the whole layer (partition, steps and recovery) at once, returning None to decline.
    """

    name: str = "step"
    # True (declared on the class itself, not inherited) when `forward` reduces only through the Groups
    # API (mean, var_mean, per_channel, channel_stat, dims): ghost batches then run as one grouped
    # tensor instead of one layer call per ghost batch (normkit.ghost).
    reduces_through_groups: bool = False
    # True (declared on the class itself) when `fused_forward` normalizes ghost batches itself: given a
    # training batch of several ghost batches (`layer.partition.ghost` divides it), it computes each one
    # alone and keeps the mean of their running-buffer updates (normkit.ghost's rule). Only such a step's
    # fused path is offered the grouped ghost batches of a `reduces_through_groups` layer.
    fused_ghost_batches: bool = False
    # When True, fused_forward gets the input in its own dtype (fp16/bf16 included, so a kernel can
    # read half the bytes) and must compute statistics in float32 itself; otherwise it gets float32.
    fused_input_dtype: bool = False

    def setup(self, layer: StepHost) -> None:
        """Register this step's parameters and buffers on `layer`."""

    def forward(self, x: Tensor, groups: Groups, layer: StepHost) -> Tensor:
        raise NotImplementedError

    def fused_forward(self, x: Tensor, layer: StepHost) -> Tensor | None:
        """Optionally compute partition+steps+recovery on the raw input in one go. A post-activation
        step's `fused_forward` is offered first and, when it returns a tensor, that is the whole layer's
        output (steps, recovery, activation and itself)."""
        return None

    def describe(self) -> dict[str, Any]:
        """Parameters shown by `normkit show`."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    # Steps that act on the conv feeding the norm (e.g. `ws`) set this and implement prepare_conv;
    # normkit.convert and normkit-lab's models call it through normkit.prepare_feeding_convs.
    needs_conv: bool = False

    def prepare_conv(self, conv: Any) -> None:
        """Change the conv module whose output this norm normalizes (called once per model)."""
        raise NotImplementedError

    def decay(self) -> dict[str, bool]:
        """Weight-decay policy for parameters this step registered: name -> decayed?"""
        return {}

    def eval_affine(self, layer: StepHost) -> tuple[Tensor, Tensor] | None:
        """`(scale, shift)` per channel when this step's output in the layer's current mode is
        exactly `x * scale + shift` (so `normkit.fold` can fold it into the conv before); None
        when it depends on the input's statistics or is not affine."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.describe().items())
        return f"{self.name}({args})"


class PostActivationStep(Step):
    """A step after the activation (e.g. proxy normalization).

    With `owns_recovery` the layer hands it the values before recovery; the step applies the
    layer's `weight`/`bias` itself, then `layer.act`, then its own operation.
    """

    owns_recovery: bool = False

    def forward(self, x: Tensor, groups: Groups, layer: StepHost) -> Tensor:  # (N, C, S)
        raise NotImplementedError


StepFactory = Callable[[BuildContext], Step]


def make_step(cls: type[Step], **kwargs: Any) -> StepFactory:
    """A picklable step factory that builds `cls(**kwargs)` whatever the BuildContext.

    Use it in pipelines instead of `lambda ctx: Standardize(eps)`: lambdas and closures do not
    pickle. A factory that needs the context is a module-level function `f(ctx, ...)`, given its
    arguments with `functools.partial(f, ...)`.
    """
    return functools.partial(_construct, cls, **kwargs)


def _construct(cls: type[Step], ctx: BuildContext, **kwargs: Any) -> Step:
    return cls(**kwargs)


@dataclass
class Pipeline:
    """A norm layer's description: partition, ordered steps, recovery, activation, post step.

    `core` indexes the base normalizing step (standardize, RMS scale, ...) that '+' stages are
    placed before or after; None when the pipeline has none (e.g. `none`). `gain_offset`: the gain
    is the stored weight plus this (1.0: a zero-centred gain `1 + w`, w starting at 0, so weight decay
    pulls the gain towards 1 rather than 0).
    """

    partition: Partition | None
    steps: list[StepFactory] = field(default_factory=list)
    recovery: RecoveryKind = "affine"
    core: int | None = 0
    activation: str | None = None
    activation_params: dict[str, Any] = field(default_factory=dict)
    post: Callable[[BuildContext], PostActivationStep] | None = None
    post_name: str | None = None
    gain_offset: float = 0.0

    def copy(self) -> Pipeline:
        return replace(self, steps=list(self.steps), activation_params=dict(self.activation_params))


# --------------------------------------------------------------------------------------------
# The standard operation steps. Statistics are computed in float32 by the layer.


class Standardize(Step):
    """Centre and scale by the group's biased std; running statistics for batch partitions.

    Matches torch's BatchNorm/LayerNorm/GroupNorm/InstanceNorm: biased variance for
    normalizing, unbiased for the running estimate, `momentum=None` = cumulative average.
    """

    name = "standardize"
    reduces_through_groups = True
    fused_ghost_batches = True  # torch's batch_norm on the regrouped batch (GhostRegroup)

    def __init__(self, eps: float = 1e-5, momentum: float | None = 0.1,
                 track_running_stats: bool = True) -> None:
        check_positive(eps, self.name, "eps")
        if momentum is not None and not (math.isfinite(momentum) and 0.0 <= momentum <= 1.0):
            raise SpecError(f"{self.name}: momentum must be in [0, 1] or none, got {momentum}")
        self.eps = eps
        self.momentum = momentum
        self.track_running_stats = track_running_stats

    def setup(self, layer: StepHost) -> None:
        self._batch = layer.partition.uses_batch
        if self._batch and self.track_running_stats:
            c = layer.num_channels
            layer.register_buffer("running_mean", torch.zeros(c))
            layer.register_buffer("running_var", torch.ones(c))
            layer.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def describe(self) -> dict[str, Any]:
        if not getattr(self, "_batch", True):
            return {"eps": self.eps}  # momentum and running stats only mean something for batch statistics
        return {"eps": self.eps, "momentum": self.momentum, "track_running_stats": self.track_running_stats}

    def uses_running_stats(self, layer: StepHost) -> bool:
        return layer.partition.uses_batch and self.track_running_stats and not layer.training

    def update_factor(self, layer: StepHost) -> float | None:
        """Bump num_batches_tracked and return the EMA factor, or None when not updating."""
        if not (layer.training and layer.partition.uses_batch and self.track_running_stats):
            return None
        (tracked,) = layer.registered("num_batches_tracked")
        tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(tracked)
        return self.momentum

    def statistics(self, x: Tensor, groups: Groups, layer: StepHost) -> tuple[Tensor, Tensor]:
        """Mean and biased variance used to normalize `x` (updates running stats when training)."""
        if self.uses_running_stats(layer):
            return (groups.per_channel(layer.running_mean.to(x.dtype)),
                    groups.per_channel(layer.running_var.to(x.dtype)))
        if groups.count == 1 and layer.partition.uses_batch and layer.training:
            raise layer.shape_error("needs more than 1 value per channel when training")
        if x.numel() == 0 and not groups.synced:  # an empty local batch: nothing to normalize (var_mean
            # would warn); a synced one still takes part in the reductions of the other processes.
            self.update_factor(layer)  # counted, as torch counts it; no statistics to average in
            zero = x.sum(dim=groups.dims, keepdim=True)
            return zero, zero
        var, mean = groups.var_mean(x)
        factor = self.update_factor(layer)
        if factor is not None:
            n = groups.count
            with torch.no_grad():
                unbiased = groups.channel_stat(var) * (n / max(n - 1, 1))
                layer.running_mean.lerp_(groups.channel_stat(mean).to(layer.running_mean), factor)
                layer.running_var.lerp_(unbiased.to(layer.running_var), factor)
        return mean, var

    def forward(self, x: Tensor, groups: Groups, layer: StepHost) -> Tensor:
        mean, var = self.statistics(x, groups, layer)
        return (x - mean) * torch.rsqrt(var + self.eps)

    def eval_is_batch_norm(self) -> bool:
        """True when this step in eval is torch's BatchNorm with running statistics. A subclass
        that changes `forward` (whitening, switchable, grouped...) is not, unless it says so."""
        return type(self).forward is Standardize.forward

    def eval_affine(self, layer: StepHost) -> tuple[Tensor, Tensor] | None:
        """In eval with running statistics: `(x - running_mean) / sqrt(running_var + eps)`."""
        if not (self.eval_is_batch_norm() and self.uses_running_stats(layer)):
            return None
        scale = torch.rsqrt(layer.running_var.double() + self.eps)
        return scale, -layer.running_mean.double() * scale

    def fused_forward(self, x: Tensor, layer: StepHost) -> Tensor | None:
        """Dispatch a plain standardize+recovery pipeline to torch's native kernels.

        Steps that only act on the conv feeding the norm (`needs_conv`, e.g. `ws`) are identities
        on the values, so `gn+ws` still takes the native kernel.
        """
        steps = layer.steps
        if len(steps) != 1 and [s.needs_conv for s in steps].count(False) != 1:  # one step: itself
            return None
        partition = layer.partition
        if partition.kind in ("instance", "group") and partition.values_per_group(x.shape, layer.num_channels,
                                                                                    layer.tokens) < 2:
            return None  # one value per group: torch's kernel refuses it; the generic path gives 0 + bias
        weight, bias = layer.recovery_params()
        tracks = partition.uses_batch and self.track_running_stats
        if partition.uses_batch and layer.training and x.numel() // layer.num_channels == 1:  # torch's rule:
            # one value per channel has no variance; an empty batch normalizes nothing and is allowed
            raise layer.shape_error("needs more than 1 value per channel when training")
        factor = (self.update_factor(layer) or 0.0) if tracks else 0.0
        running = (layer.running_mean, layer.running_var) if tracks else (None, None)
        regroup = ghost_regroup(partition, x.shape[0], layer.training, tracks) if partition.uses_batch else None
        if regroup is not None:  # ghost batches: one batch of `ghost` samples over (ghost batch, channel) pairs
            n, c = x.shape[0], layer.num_channels
            s = x.numel() // (n * c)
            x3 = x.reshape(n, s, c).transpose(1, 2) if layer.tokens else x.reshape(n, c, s)

            def standardize(xb: Tensor, w: Tensor | None, b: Tensor | None,
                            buffers: tuple[Tensor | None, ...]) -> Tensor:
                return native_standardize(
                    xb, kind="batch", tokens=False, num_channels=xb.shape[1], groups_per_sample=1, weight=w, bias=b,
                    eps=self.eps, running_mean=buffers[0], running_var=buffers[1], use_batch_stats=True,
                    factor=factor)

            y3 = regroup.apply(standardize, x3, weight, bias, running)
            return y3.transpose(1, 2).reshape(x.shape) if layer.tokens else y3.reshape(x.shape)
        return native_standardize(
            x, kind=partition.kind, tokens=layer.tokens, num_channels=layer.num_channels,
            groups_per_sample=1 if partition.uses_batch else partition.groups_per_sample(layer.num_channels),
            weight=weight, bias=bias, eps=self.eps,
            running_mean=running[0], running_var=running[1],
            use_batch_stats=layer.training or not tracks, factor=factor)


class Centre(Step):
    """Subtract the group mean (no scaling)."""

    name = "centre"

    def forward(self, x: Tensor, groups: Groups, layer: StepHost) -> Tensor:
        return x - groups.mean(x)


class RMSScale(Step):
    """Divide by sqrt(mean(x^2) + eps) over the group, no centring (RMSNorm).

    `eps=None` is torch's `RMSNorm(eps=None)`: the machine epsilon of the dtype the statistics are
    computed in (float32 for float32 and half inputs, float64 for float64).
    """

    name = "rms-scale"

    def __init__(self, eps: float | None = 1e-6) -> None:
        if eps is not None:
            check_positive(eps, self.name, "eps")
        self.eps = eps

    def _eps(self, x: Tensor) -> float:
        return torch.finfo(x.dtype).eps if self.eps is None else self.eps

    def forward(self, x: Tensor, groups: Groups, layer: StepHost) -> Tensor:
        return x * torch.rsqrt(groups.mean(x * x) + self._eps(x))

    def fused_forward(self, x: Tensor, layer: StepHost) -> Tensor | None:
        if len(layer.steps) != 1 or not layer.tokens or layer.partition.kind != "layer":
            return None
        weight, bias = layer.recovery_params()
        return native_rms(x, num_channels=layer.num_channels, weight=weight, bias=bias, eps=self._eps(x))

