"""NormLayer: the nn.Module built from a Pipeline (partition, steps, recovery, activation)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from normkit import ghost
from normkit.errors import NormkitError, NormShapeError, PluginError, SpecError, StepError, first_line
from normkit.fx_leaf import FxLeaf
from normkit.limits import check_num_channels
from normkit.stages import BuildContext, Pipeline, PostActivationStep, Standardize, Step
from normkit.sync import warn_if_per_process

if TYPE_CHECKING:
    from normkit.sync import ProcessSync

Probe = Callable[["NormLayer", Tensor], "Tensor | None"]

__all__ = ["NormLayer", "NormShapeError", "StepError"]


class NormLayer(FxLeaf):
    """A composed normalization layer.

    Works on inputs `N, C, *` (channel_dim=1) or channels-last tokens `N, *, C`
    (channel_dim=-1). Statistics are computed in float32 even under autocast; the output has the
    input's dtype. Parameters and buffers are registered flat on the layer (`weight`, `bias`,
    `running_mean`, ...), so checkpoints of torch's own norm layers load into the matching spec.
    """

    def __init__(self, pipeline: Pipeline, num_channels: int, *, channel_dim: int = 1,
                 spec: str = "", activation_module: nn.Module | None = None) -> None:
        super().__init__()
        check_num_channels(num_channels, spec or "norm")
        if channel_dim not in (1, -1):
            raise SpecError(f"{spec or 'norm'}: channel_dim must be 1 (N,C,*) or -1 (N,*,C), got {channel_dim}")
        self.spec = spec
        self.num_channels = num_channels
        self.channel_dim = channel_dim
        self.partition = pipeline.partition
        if self.partition is not None:
            self.partition.check(num_channels, spec or "norm")
        self.activation_name = pipeline.activation
        self.post_name = pipeline.post_name
        ctx = BuildContext(num_channels, channel_dim, self.partition, pipeline.activation)
        try:
            self.steps: list[Step] = [factory(ctx) for factory in pipeline.steps]
            post = pipeline.post(ctx) if pipeline.post else None
        except SpecError as err:  # a step's own range check: say which spec it came from
            raise SpecError(f"{spec}: {err}" if spec and not str(err).startswith(spec) else str(err)) from None
        self.recovery = pipeline.recovery
        if self.recovery in ("affine", "gain"):  # the gain weight + gain_offset starts at 1
            self.weight = nn.Parameter(torch.full((num_channels,), 1.0 - pipeline.gain_offset))
        else:
            self.register_parameter("weight", None)
        if self.recovery == "affine":
            self.bias = nn.Parameter(torch.zeros(num_channels))
        else:
            self.register_parameter("bias", None)
        for step in self.steps:
            _check_step(step, spec)
            step.setup(self)
        self.act = activation_module if activation_module is not None else nn.Identity()
        self.has_activation = pipeline.activation is not None
        self.post: PostActivationStep | None = post
        if self.post is not None:
            _check_step(self.post, spec, PostActivationStep)
            self.post.setup(self)
        self.sync: ProcessSync | None = None  # set by normkit.convert_sync
        # What a converted source computed beyond its spec (set by normkit.interop.layouts, read by
        # to_torch and fold): statistics over C at each position of N,C,*; frozen in eval with a
        # frozen affine (FrozenBatchNorm2d); the stored weight w meaning the gain w + gain_offset
        # (Gemma's 1 + w); half-precision values rounded before the gain (Hugging Face's order);
        # inputs of rank unbatched_rank - 1 taken as one sample (torch's InstanceNorm).
        self.per_position = False
        self.unbatched_rank: int | None = None
        self.frozen = False
        self.gain_offset = pipeline.gain_offset if self.weight is not None else 0.0
        self.round_before_gain = False
        self.probes: list[Probe] = []
        self.recording = False
        self.records: dict[str, Tensor] = {}
        self._initial_extra = {n: b.detach().clone() for n, b in self.named_buffers(recurse=False)
                               if n not in _TORCH_BUFFERS}

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        _fill_torch_checkpoint(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)

    # -- helpers for steps ------------------------------------------------------------------

    @property
    def tokens(self) -> bool:
        """True when channels are the last dim (`N, *, C`)."""
        return self.channel_dim == -1

    @property
    def applies_recovery(self) -> bool:
        """False when a post-activation step took the affine over."""
        return not (self.post is not None and self.post.owns_recovery)

    def recovery_params(self) -> tuple[Tensor | None, Tensor | None]:
        """(weight, bias) to apply after the steps, None where not applied."""
        if not self.applies_recovery:
            return None, None
        weight, bias = self.registered("weight", "bias")
        if self.gain_offset and weight is not None:  # in float32 at least, as Gemma adds it
            return weight.to(torch.promote_types(weight.dtype, torch.float32)) + self.gain_offset, bias
        return weight, bias

    def registered(self, *names: str) -> tuple[Tensor | None, ...]:
        """The layer's parameters or buffers of these names, as `getattr` gives them. Why: nn.Module finds
        parameters and buffers in `__getattr__`, after the ordinary lookup has failed, about 7,000 machine
        instructions each; a training call of a small layer reads four to seven of them, which is up to a tenth
        of its host work (docs/performance.md, "Host work per training call"). A name reparametrized away
        (`torch.nn.utils.parametrize` moves it out of `_parameters`) is read through `getattr`."""
        params, buffers = self._parameters, self._buffers
        found = []  # a loop, not a comprehension: no function object per call (Python 3.11)
        for name in names:
            found.append(params[name] if name in params else buffers[name] if name in buffers else getattr(self, name))
        return tuple(found)

    def train(self, mode: bool = True) -> NormLayer:
        """As nn.Module.train, except that a frozen layer stays in eval (FrozenBatchNorm2d)."""
        return super().train(mode and not self.frozen)

    def shape_error(self, problem: str) -> NormShapeError:
        return NormShapeError(f"{self.spec or 'norm'}: {problem}")

    def step_error(self, step: Step, x: Tensor, exc: Exception) -> StepError:
        """The one-line error for a step that raised something other than a NormkitError."""
        kind = "post-activation step" if step is self.post else "step"
        return StepError(f"{self.spec or 'norm'}: {kind} {step.name} failed on input of shape "
                         f"{tuple(x.shape)}: {first_line(exc)}")

    def record(self, key: str, value: Tensor | Callable[[], Tensor]) -> None:
        """Keep a detached copy of `value` for inspection, only while recording is on."""
        if self.recording:
            v = value() if callable(value) else value
            self.records[key] = v.detach().clone()

    def add_probe(self, probe: Probe) -> Callable[[], None]:
        """Call `probe(layer, values)` on the post-norm values (before recovery); returns remover.

        A probe may return a replacement tensor (e.g. to inject noise). While any probe is
        attached, the layer takes its generic path so the values exist.
        """
        self.probes.append(probe)
        return lambda: self.probes.remove(probe) if probe in self.probes else None

    # -- torch-like attributes (torch.nn.utils.fusion and other tools read these) ----------

    @property
    def num_features(self) -> int:
        """torch's name for the channel count."""
        return self.num_channels

    @property
    def affine(self) -> bool:
        """True when the layer has a per-channel weight and bias, as torch's `affine=True`."""
        return self.weight is not None and self.bias is not None

    def _running_stats_step(self) -> Standardize:
        """The step of a layer that is torch's BatchNorm in eval (bn, brn; no activation): its
        eps/momentum are torch's. AttributeError for any other layer, so tools that take anything
        with `eps` and running statistics for a BatchNorm (torch's fusers) do not fold bnn or sn."""
        steps = [s for s in self.steps if not s.needs_conv]
        if (self.partition is not None and self.partition.uses_batch and len(steps) == 1
                and isinstance(steps[0], Standardize) and steps[0].eval_is_batch_norm()
                and steps[0].track_running_stats and not self.has_activation and self.post is None):
            return steps[0]
        raise AttributeError(f"{self.spec or 'norm'} is not a plain batch norm "
                             "(no eps/momentum like torch's BatchNorm)")

    @property
    def eps(self) -> float:
        return self._running_stats_step().eps

    @property
    def momentum(self) -> float | None:
        return self._running_stats_step().momentum

    def eval_affine(self, *, before_activation: bool = False) -> tuple[Tensor, Tensor] | str:
        """`(scale, shift)` per channel (float64) when this layer is exactly `x * scale + shift` in
        its current mode, else one line saying why not (what `normkit.fold` reports). With
        `before_activation`, a layer that is exactly `act(x * scale + shift)` gives its affine too
        (the caller keeps `self.act`); a post-activation stage (`+pn`) never does."""
        if self.training:
            return "in training mode (call model.eval() first)"
        if self.post is not None:
            return f"has a nonlinearity after the norm ({self.post_name})"
        if self.has_activation and not before_activation:
            return f"has a nonlinearity after the norm ({self.activation_name or type(self.act).__name__})"
        if self.probes or (self.sync is not None and self.sync.active()):
            return "has probes or process sync attached"
        scale = torch.ones(self.num_channels, dtype=torch.float64, device=self._device())
        shift = torch.zeros_like(scale)
        for step in self.steps:
            if step.needs_conv:
                return f"step {step.name} changes the conv feeding it"
            affine = step.eval_affine(self)
            if affine is None:
                why = "uses per-sample statistics" if self.partition and not self.partition.uses_batch \
                    else "is not a fixed per-channel affine in eval"
                return f"step {step.name} {why}"
            s, t = affine
            scale, shift = scale * s, shift * s + t
        weight, bias = self.recovery_params()
        if weight is not None:
            scale, shift = scale * weight.double(), shift * weight.double()
        if bias is not None:
            shift = shift + bias.double()
        return scale, shift

    def _device(self) -> torch.device:
        tensors = [*self.parameters(), *self.buffers()]
        return tensors[0].device if tensors else torch.device("cpu")

    def __prepare_scriptable__(self) -> NormLayer:
        """torch.jit.script calls this first: refuse with one line naming what works instead."""
        raise NormkitError(
            f"{self.spec or 'norm'}: torch.jit.script does not support normkit layers (TorchScript is "
            "deprecated); use torch.jit.trace(model.eval(), example), torch.export.export, or "
            "normkit.to_torch(model) for plain specs (see docs/deploy.md)")

    # -- forward ----------------------------------------------------------------------------

    def _check(self, x: Tensor) -> None:
        shape = x.shape
        if len(shape) < 2:
            raise self.shape_error(f"expects at least 2 dims (N, C, ...), got shape {tuple(shape)}")
        if shape[self.channel_dim] != self.num_channels:
            cdim = 1 if self.channel_dim == 1 else len(shape) - 1
            layout = "N,C,*" if self.channel_dim == 1 else "N,*,C"
            raise self.shape_error(
                f"expects {self.num_channels} channels in dim {cdim} ({layout}), got shape {tuple(x.shape)}"
            )

    def forward(self, x: Tensor) -> Tensor:
        if self.unbatched_rank is not None and x.dim() == self.unbatched_rank - 1:
            return self.forward(x.unsqueeze(0)).squeeze(0)
        self._check(x)
        if self.partition is not None and self.partition.ghost is not None and ghost.applies(self):
            return ghost.forward_in_ghost_batches(self, x)
        if self.training and self.sync is None and self.partition is not None and self.partition.kind == "batch":
            warn_if_per_process(self)
        if torch.is_autocast_enabled("cpu" if x.is_cpu else x.device.type):  # statistics stay float32 under autocast
            with torch.autocast(x.device.type, enabled=False):
                return self._forward(x)
        return self._forward(x)

    def _forward(self, x: Tensor, ghost_batches: bool = False) -> Tensor:
        """The layer on `x`. `ghost_batches`: `x` holds several ghost batches (normkit.ghost), so only a
        step whose fused path normalizes them itself (`Step.fused_ghost_batches`) may take it."""
        in_dtype = x.dtype
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.round_before_gain and xf.dtype != in_dtype:
            return _contiguous_like(self._round_then_recover(xf, in_dtype), x)
        out = None
        whole = False  # the post-activation step's fused path computed the whole layer
        if not self.probes and not self.recording and not self._syncing():
            # A post-activation step is offered the whole layer first (e.g. gn+pn as one autograd Function)
            candidates = self.steps if self.post is None or ghost_batches else (self.post, *self.steps)
            for step in candidates:
                if ghost_batches and not type(step).__dict__.get("fused_ghost_batches", False):
                    continue
                inp = x if step.fused_input_dtype else xf
                try:
                    out = step.fused_forward(inp, self)
                except Exception as exc:
                    if _passes_through(exc):
                        raise
                    raise self.step_error(step, inp, exc) from exc
                if out is not None:
                    whole = step is self.post
                    break
        if out is None:
            out = self._generic(xf)
        elif not whole and (self.has_activation or self.post is not None):
            out = self._after_norm(out, normalized_only=not self.applies_recovery)
        out = out.to(in_dtype) if out.dtype != in_dtype else out
        return _contiguous_like(out, x)

    def _syncing(self) -> bool:
        """True when this step's batch statistics are reduced across processes (training only)."""
        return (self.sync is not None and self.training and self.partition is not None
                and self.partition.uses_batch and self.partition.ghost is None and self.sync.active())

    def _to_ncs(self, x: Tensor) -> Tensor:
        n, c = x.shape[0], self.num_channels
        if self.tokens:
            return x.reshape(n, math.prod(x.shape[1:-1]), c).transpose(1, 2)
        return x.reshape(n, c, math.prod(x.shape[2:]))  # explicit S: an empty batch has no -1 to infer

    def _from_ncs(self, y3: Tensor, like: Tensor) -> Tensor:
        if self.tokens:
            return y3.transpose(1, 2).reshape(like.shape)
        return y3.reshape(like.shape)

    def _round_then_recover(self, xf: Tensor, dtype: torch.dtype) -> Tensor:
        """Hugging Face's Llama-family order: normalize in float32, round to the input's dtype, then
        apply the gain (and bias, activation) in that dtype."""
        y3 = self._normalize(xf).to(dtype)
        return self._from_ncs(self._recover_and_activate(y3), xf).to(dtype)

    def _generic(self, x: Tensor) -> Tensor:
        return self._from_ncs(self._recover_and_activate(self._normalize(x)), x)

    def _normalize(self, x: Tensor) -> Tensor:
        """Partition and steps on the `(N, C, S)` view of `x`, then probes: the values before recovery."""
        x3 = self._to_ncs(x)
        if self.partition is not None:
            g, groups = self.partition.group(x3, self.tokens)
            if self._syncing():
                groups = self.sync.attach(groups, x3.device)
            for step in self.steps:
                try:
                    g = step.forward(g, groups, self)
                except Exception as exc:
                    if _passes_through(exc):
                        raise
                    raise self.step_error(step, x, exc) from exc
            y3 = groups.ungroup(g)
        else:
            y3 = x3
        for probe in self.probes:
            replaced = probe(self, y3)
            if replaced is not None:
                y3 = replaced
        self.record("post_norm", y3)
        return y3

    def _recover_and_activate(self, y3: Tensor) -> Tensor:
        if self.post is not None and self.post.owns_recovery:
            return self._post(y3)
        weight, bias = self.recovery_params()
        if weight is not None:
            y3 = y3 * weight.view(1, -1, 1)
        if bias is not None:
            y3 = y3 + bias.view(1, -1, 1)
        y3 = self.act(y3)
        if self.post is not None:
            y3 = self._post(y3)
        return y3

    def _post(self, y3: Tensor) -> Tensor:
        try:
            return self.post.forward(y3, None, self)
        except Exception as exc:
            if _passes_through(exc):
                raise
            raise self.step_error(self.post, y3, exc) from exc

    def _after_norm(self, out: Tensor, normalized_only: bool) -> Tensor:
        """Activation/post step after a fused path (which applied recovery unless owned)."""
        y3 = self._to_ncs(out)
        if normalized_only:
            y3 = self._post(y3)
        else:
            y3 = self.act(y3)
            if self.post is not None:
                y3 = self._post(y3)
        return self._from_ncs(y3, out)

    # -- description ------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The stages of this layer, for `normkit show` and reports."""
        recovery = self.recovery
        if not self.applies_recovery:
            recovery = f"none ({self.recovery} moved into {self.post_name})"
        return {
            "spec": self.spec,
            "partition": str(self.partition) if self.partition else "none",
            "layout": "N,*,C" if self.tokens else "N,C,*",
            "steps": [(s.name, s.describe()) for s in self.steps],
            "recovery": recovery,
            "activation": self.activation_name,
            "post_activation": (self.post_name, self.post.describe()) if self.post else None,
            "parameters": {n: tuple(p.shape) for n, p in self.named_parameters()},
            "buffers": {n: tuple(b.shape) for n, b in self.named_buffers()},
            "learnable": sum(p.numel() for p in self.parameters()),
        }

    def decay(self) -> dict[str, bool]:
        """Weight-decay policy declared by steps: parameter name -> decayed?"""
        policy: dict[str, bool] = {}
        for step in [*self.steps, *([self.post] if self.post else [])]:
            policy.update(step.decay())
        return policy

    def extra_repr(self) -> str:
        layout = "N,*,C" if self.tokens else "N,C,*"
        return f"{self.spec!r}, {self.num_channels}, layout={layout}"


_TORCH_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _fill_torch_checkpoint(module: NormLayer, state_dict: dict, prefix: str, *args: Any) -> None:
    """A checkpoint of a torch norm (none of this layer's extra buffers) loads strictly: the extra
    buffers (e.g. bnn's running_lambda) take their initial values. A normkit checkpoint missing
    only some of them still fails strict loading."""
    extra = module._initial_extra
    if extra and not any(prefix + name in state_dict for name in extra):
        for name, value in extra.items():
            current = getattr(module, name)
            state_dict[prefix + name] = value.to(device=current.device, dtype=current.dtype)


def _passes_through(exc: Exception) -> bool:
    """normkit's own errors and torch's control flow (checkpoint recomputation stops, dynamo graph
    breaks: exceptions defined in torch's submodules) are not a step's failure."""
    return isinstance(exc, NormkitError) or type(exc).__module__.startswith("torch.")


def _contiguous_like(out: Tensor, x: Tensor) -> Tensor:
    """The output contiguous in the input's memory format (channels-last stays channels-last)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return out.contiguous(memory_format=torch.channels_last)
    return out.contiguous()


def _check_step(step: Any, spec: str, kind: type[Step] = Step) -> None:
    """A stage factory must return a Step (a PostActivationStep after the activation)."""
    if not isinstance(step, kind):
        raise PluginError(f"{spec or 'norm'}: a stage factory returned {type(step).__name__}, not a "
                          f"normkit {kind.__name__}; fix the plugin that registered it")
