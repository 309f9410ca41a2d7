"""`normkit.convert`: swap every torch norm layer in a model for a spec's layer, in place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normkit.build import build_with_settings
from normkit.errors import SpecError
from normkit.interop.activation_drop import activation_user, apply_drops, plan_drops, trace_children
from normkit.interop.causal import declares_causal, pools_tokens
from normkit.interop.feeding_conv import conv_steps, feeding_convs, prepare_feeding_convs
from normkit.interop.layouts import carry_hooks, check_hooks, fit_to_source, keep_activation, per_position
from normkit.interop.sources import Source, reader_for
from normkit.layer import NormLayer
from normkit.spec import Spec, parse
from normkit.sync import ProcessSync

_STATE = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@dataclass
class Replacement:
    path: str
    old: str
    new: str
    copied: list[str]
    activation: str | None = None
    note: str | None = None  # e.g. why a '+pn' spec left this norm plain


@dataclass
class ConversionSummary:
    """What `convert` replaced: one Replacement per norm layer."""

    spec: str
    replaced: list[Replacement] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.replaced)

    def __iter__(self):
        return iter(self.replaced)

    def __str__(self) -> str:
        lines = [f"converted {len(self.replaced)} norm layers to {self.spec!r}"]
        plain = [r for r in self.replaced if r.new != self.spec]
        if plain:
            lines[0] += (f" ({len(plain)} of them to {plain[0].new!r}: no activation directly after them "
                         "for the spec's post-activation step)")
        for r in self.replaced:
            extra = f", owns {r.activation}" if r.activation else ""
            if r.activation and r.activation.startswith("kept "):
                extra = f", {r.activation}"
            elif r.activation and r.activation.endswith(" dropped"):
                extra = f", {r.activation}: the norm includes its activation"
            if r.note:
                extra += f", {r.note}"
            lines.append(f"  {r.path}: {r.old} -> {r.new} (copied {', '.join(r.copied) or 'nothing'}{extra})")
        return "\n".join(lines)


def _activation_name(module: nn.Module) -> str | None:
    """The registered activation name a module computes with default settings, else None."""
    simple = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid",
              nn.Mish: "mish", nn.Identity: None}
    if type(module) in simple:
        return simple[type(module)]
    if type(module) is nn.GELU and module.approximate == "none":
        return "gelu"
    if type(module) is nn.LeakyReLU and module.negative_slope == 0.01:
        return "leaky-relu"
    if type(module) is nn.ELU and module.alpha == 1.0:
        return "elu"
    return None


def _needs_activation(spec: Spec) -> bool:
    return any(p.entry.kind in ("activation", "post_activation") for p in spec.parts)


@dataclass
class _Site:
    parent: nn.Module
    name: str
    path: str
    old: nn.Module
    source: Source
    act_name: str | None = None  # the activation handed to the spec
    act_child: str | None = None  # the Sequential sibling the spec took over
    traced: bool = False  # the activation is a call in the parent's forward, dropped by rewriting it
    plain: bool = False  # no activation follows: a post-activation spec builds its plain norm here


def _plan(model: nn.Module, spec: Spec) -> list[_Site]:
    """Every known norm in `model`, with the activation the spec takes over (if it takes one)."""
    plan = []
    needs_act = _needs_activation(spec)
    includes_act = spec.norm.entry.includes_activation

    def visit(parent: nn.Module, prefix: str) -> None:
        children = list(parent.named_children())
        for i, (name, child) in enumerate(children):
            path = f"{prefix}{name}"
            reader = reader_for(child, path)
            if reader is None:
                visit(child, path + ".")
                continue
            try:
                source = reader(child)
            except SpecError as exc:
                raise SpecError(f"cannot convert {path} ({exc}") from None
            site = _Site(parent, name, path, child, source)
            if site.source.activation is not None:
                if needs_act or includes_act:
                    site.act_name = _activation_name(site.source.activation)
                    if site.act_name is None:
                        raise SpecError(f"cannot place {spec.text!r} at {path}: its activation "
                                        f"{site.source.activation!r} is not one normkit can take over")
            elif needs_act or includes_act:
                nxt = children[i + 1] if i + 1 < len(children) else None
                if isinstance(parent, nn.Sequential) and nxt is not None:
                    site.act_name = _activation_name(nxt[1])
                    site.act_child = nxt[0] if site.act_name else None
                site.traced = site.act_name is None and not isinstance(parent, nn.Sequential)
            plan.append(site)

    visit(model, "")
    if needs_act:
        _take_traced_activations(spec, plan)
    return plan


def _take_traced_activations(spec: Spec, plan: list[_Site]) -> None:
    """For norms with no activation found yet: the activation call that alone reads the norm's output
    in its parent's forward (torchvision's `relu(bn1(x))`, one ReLU module shared with the residual
    sum's). Where none does (the last norm of a residual branch, before the sum), a post-activation
    spec (`+pn`) builds its plain norm; a spec with an activation stage is refused."""
    post = any(p.entry.kind == "post_activation" for p in spec.parts)
    graphs: dict[str, torch.fx.Graph | None] = {}
    for site in plan:
        if site.act_name is not None:
            continue
        parent_path = site.path.rpartition(".")[0]
        if parent_path not in graphs:
            graphs[parent_path] = trace_children(site.parent)
        graph = graphs[parent_path]
        found = activation_user(graph, site.parent, site.name) if graph is not None else None
        site.act_name = _called_activation_name(site.parent, found[0]) if found else None
        site.traced = site.act_name is not None
        if site.act_name is None and post:
            site.plain = True
        elif site.act_name is None:
            raise SpecError(
                f"cannot place {spec.text!r} at {site.path}: no activation directly follows it (in an "
                "nn.Sequential or its parent's forward), so there is no activation step to take over; "
                "build the model from norm-activation blocks (docs/norms/proxy.md)")


_FUNCTION_ACTIVATIONS = {F.relu: "relu", torch.relu: "relu", torch.relu_: "relu", F.silu: "silu",
                         torch.tanh: "tanh", torch.sigmoid: "sigmoid", F.mish: "mish"}


def _called_activation_name(parent: nn.Module, user: torch.fx.Node) -> str | None:
    """The registered name of the activation a traced call computes, None when normkit has none."""
    if user.op == "call_module":
        return _activation_name(parent.get_submodule(str(user.target)))
    if user.target is F.gelu and user.kwargs.get("approximate", "none") == "none" and len(user.args) == 1:
        return "gelu"
    return _FUNCTION_ACTIVATIONS.get(user.target)


def _plain(spec: Spec) -> Spec:
    """`spec` without its activation and post-activation stages (`gn(groups=8)+pn` -> `gn(groups=8)`)."""
    parts = tuple(p for p in spec.parts if p.entry.kind not in ("activation", "post_activation"))
    return Spec("+".join(str(p) for p in parts), parts)


def _require_module(model: Any, what: str) -> None:
    """One line for a model that is not a module (`convert("model", ...)` was an AttributeError)."""
    if not isinstance(model, nn.Module):
        shown = repr(model) if len(repr(model)) <= 40 else repr(model)[:37] + "..."
        raise SpecError(f"{what}() takes your model, a torch.nn.Module, not the {type(model).__name__} {shown}; "
                        f"e.g. normkit.{what}(model{', ' + repr('gn+pn') if what == 'convert' else ''})")


def convert(model: nn.Module, spec: str | Spec, *, causal: bool | None = None,
            allow_empty: bool = False) -> ConversionSummary:
    """Replace every known norm layer in `model` (normkit.interop.sources: torch, timm, torchvision, HF).

    Channel count, layout and partition come from each layer; affine parameters, running
    statistics and settings (eps, momentum, groups, affine) are copied where the new layer has
    them. A norm-act source (timm BatchNormAct2d) keeps its activation, or hands it to a spec that
    owns one (`+pn`, frn, evonorm); otherwise specs with an activation step take over the
    activation that alone reads the norm's output (the next module in an nn.Sequential, or a call
    in the parent's forward), and a post-activation spec builds its plain norm where there is
    none (before a residual sum). Forward hooks move to the new layer. A layer-norm-family
    target on a per-position norm (LayerNorm2d) keeps normalizing each position over channels.
    Token-pooling targets are refused in a model that declares itself causal unless
    `causal=False`; converting no layer is an error unless `allow_empty`. Nothing is changed when
    any layer cannot be converted. Returns a summary of what was replaced.
    """
    _require_module(model, "convert")
    parsed = parse(spec)
    if reader_for(model, "model") is not None:
        raise SpecError("convert() replaces norms inside a model; use normkit.build() for one layer")
    plan = _plan(model, parsed)
    if not plan and not allow_empty:
        raise SpecError(f"convert found no norm layer normkit knows in {type(model).__name__}; register "
                        "its norm class with normkit.register_source, or pass allow_empty=True")
    is_causal = declares_causal(model) if causal is None else causal
    built = []
    plain = _plain(parsed)
    for site in plan:
        target = plain if site.plain else parsed
        new = _build(target, site)
        if is_causal:
            reason = pools_tokens(new)
            if reason is not None:
                raise SpecError(f"cannot convert {site.path}: {type(model).__name__} is causal and "
                                f"{parsed.text!r} {reason}, leaking future tokens; use a per-token norm "
                                "(ln, rms, lnn, dyt) or pass causal=False if the model is not causal")
        copied = _copy_state(site.old, new, site.source)
        owned = site.act_name
        if parsed.norm.entry.includes_activation and site.act_name:
            owned = f"{site.act_name} dropped"
        elif site.act_name is None and site.source.activation is not None:
            owned = f"kept {type(site.source.activation).__name__}"
        note = "plain: no activation directly after it" if site.plain else None
        built.append((site.parent, site.name, new, site.act_child,
                      Replacement(site.path, type(site.old).__name__, target.text, copied, owned, note)))
    _check_feeding_convs(model, built)  # before any change: a '+ws' norm needs a conv before it
    traced = [site for site in plan if site.traced]
    drops = plan_drops(model, _by_parent(traced)) if traced else None
    summary = ConversionSummary(parsed.text)
    for site, (parent, name, new, act_child, record) in zip(plan, built, strict=True):
        carry_hooks(site.old, new)
        setattr(parent, name, new)
        if act_child is not None:
            setattr(parent, act_child, nn.Identity())
        summary.replaced.append(record)
    if drops is not None:
        records = {r.path: r for r in summary.replaced}
        for drop in apply_drops(model, drops):
            path = f"{drop.parent_path}.{drop.norm}" if drop.parent_path else drop.norm
            if parsed.norm.entry.includes_activation:
                records[path].activation = f"{drop.activation} dropped"
    prepare_feeding_convs(model)
    return summary


def _build(parsed: Spec, site: _Site) -> nn.Module:
    src = site.source
    if src.frozen and (parsed.norm.name != "bn" or parsed.stages):
        raise SpecError(f"cannot convert {site.path}: {type(site.old).__name__} has frozen statistics and "
                        f"affine, which only 'bn' keeps (exactly); {parsed.text!r} would train them")
    layer_family = src.per_position and _builds_layer_partition(parsed, src)
    try:
        new = build_with_settings(parsed, src.channels, channel_dim=-1 if layer_family else src.channel_dim,
                                  activation=site.act_name, overrides={},
                                  norm_settings={k: v for k, v in src.settings.items() if v is not None
                                                 or k == "momentum"})
    except SpecError as exc:
        raise SpecError(f"cannot convert {site.path} ({type(site.old).__name__}({src.channels})): "
                        f"{exc}") from exc
    check_hooks(site.old, site.path)
    if layer_family:
        new = per_position(new)  # same statistics as the source: over C at each position
    if src.activation is not None and site.act_name is None:
        if not isinstance(new, NormLayer):
            raise SpecError(f"cannot convert {site.path}: {parsed.text!r} is built by a plugin factory and "
                            f"cannot keep the source's activation {src.activation!r}; use a pipeline norm")
        keep_activation(new, src.activation)
    return fit_to_source(new, src, site.path)


def _builds_layer_partition(parsed: Spec, src: Source) -> bool:
    """True when `parsed` builds a NormLayer with a layer partition (ln, lnn, rms, ...)."""
    probe = build_with_settings(parsed, src.channels, channel_dim=-1, activation=None, overrides={},
                                norm_settings={})
    return isinstance(probe, NormLayer) and probe.partition is not None and probe.partition.kind == "layer"


def _check_feeding_convs(model: nn.Module, built: list) -> None:
    wanting: dict[str, list[str]] = {}
    for _, name, new, _, record in built:
        if conv_steps(new):
            wanting.setdefault(record.path.rpartition(".")[0], []).append(name)
    feeding_convs(model, wanting)


def _by_parent(sites: list[_Site]) -> dict[str, list[str]]:
    by_parent: dict[str, list[str]] = {}
    for site in sites:
        by_parent.setdefault(site.path.rpartition(".")[0], []).append(site.name)
    return by_parent


def _copy_state(old: nn.Module, new: nn.Module, source: Source) -> list[str]:
    ref = next(iter(old.parameters()), None)
    if ref is None:
        ref = next(iter(old.buffers()), None)
    if ref is not None:
        new.to(device=ref.device, dtype=ref.dtype if ref.is_floating_point() else None)
    new.train(old.training)
    copied = []
    with torch.no_grad():
        for key in _STATE:
            src, dst = getattr(old, key, None), getattr(new, source.state.get(key, key), None)
            if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src.shape == dst.shape:
                dst.copy_(src)
                if isinstance(src, nn.Parameter) and isinstance(dst, nn.Parameter):
                    dst.requires_grad_(src.requires_grad)
                copied.append(key)
    return copied


def convert_sync(model: nn.Module, process_group: Any = None) -> nn.Module:
    """Make every batch-statistics normkit layer in `model` reduce its statistics across processes.

    In place, returns `model`. Layers whose partition does not pool over the batch (ln, gn, in,
    rms, ...) need no communication and are left alone. torch's own BatchNorm layers are torch's
    to convert (`nn.SyncBatchNorm.convert_sync_batchnorm`).
    """
    _require_module(model, "convert_sync")
    for module in model.modules():
        if isinstance(module, NormLayer) and module.partition is not None and module.partition.uses_batch:
            module.sync = ProcessSync(process_group)
    return model
