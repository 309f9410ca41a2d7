"""`normkit.convert`: swap every torch norm layer in a model for a spec's layer, in place."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normkit.build import build_with_settings
from normkit.errors import SpecError, first_line
from normkit.interop.activation_drop import activation_user, apply_drops, plan_drops, trace_children
from normkit.interop.causal import causality, pools_same_values, pools_tokens
from normkit.interop.feeding_conv import conv_steps, feeding_convs, prepare_feeding_convs
from normkit.interop.layouts import carry_hooks, check_hooks, fit_to_source, keep_activation, per_position
from normkit.interop.sources import Source, is_not_norm, reader_for
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
    """What `convert` replaced: one Replacement per norm layer; `left` as (path, why) for the norms
    and modules it left as they are (`leave=`, `register_not_norm`, kinds a mapping does not name)."""

    spec: str  # the spec's text, "same", or the mapping as "{kind: spec, ...}"
    replaced: list[Replacement] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.replaced)

    def __iter__(self):
        return iter(self.replaced)

    def __str__(self) -> str:
        shown = self.spec if self.spec.startswith("{") else repr(self.spec)  # a mapping, or one spec
        lines = [f"converted {len(self.replaced)} norm layers to {shown}"]
        plain = [r for r in self.replaced if r.note == _PLAIN_NOTE]
        if plain:
            lines[0] += (f" ({len(plain)} of them to {plain[0].new!r}: no activation directly after them "
                         "for the spec's post-activation step)")
        if self.left:
            lines[0] += f", left {len(self.left)}"
        for r in self.replaced:
            extra = f", owns {r.activation}" if r.activation else ""
            if r.activation and r.activation.startswith("kept "):
                extra = f", {r.activation}"
            elif r.activation and r.activation.endswith(" dropped"):
                extra = f", {r.activation}: the norm includes its activation"
            if r.note:
                extra += f", {r.note}"
            lines.append(f"  {r.path}: {r.old} -> {r.new} (copied {', '.join(r.copied) or 'nothing'}{extra})")
        lines += [f"  left {path}: {why}" for path, why in self.left]
        return "\n".join(lines)


_PLAIN_NOTE = "plain: no activation directly after it"
SAME = "same"  # the spec that converts every norm to its own kind
_OWN_KIND = {"batch": "bn", "group": "gn", "instance": "in", "layer": "ln", "rms": "rms"}
SpecChoice = str | Spec | Mapping[str | type, str | Spec]


class _Choice:
    """Which spec each source norm becomes: one spec, `"same"` (its own kind), or a mapping from
    source kinds or classes to specs (kinds and classes it does not name are left as they are)."""

    def __init__(self, spec: SpecChoice) -> None:
        self.by_class: list[tuple[type, Spec | None]] = []
        self.by_kind: dict[str, Spec | None] = {}
        if isinstance(spec, Mapping):
            for key, value in spec.items():
                target = self._parse(value)
                if isinstance(key, type):
                    self.by_class.append((key, target))
                elif key in _OWN_KIND:
                    self.by_kind[key] = target
                else:
                    raise SpecError(f"convert: {key!r} is neither a source kind ({', '.join(_OWN_KIND)}) nor a "
                                    "norm class; map kinds or classes to specs, e.g. {'batch': 'gn(groups=8)'}")
            self.text = "{" + ", ".join(f"{getattr(k, '__name__', k)}: {self._text(v)}"
                                        for k, v in spec.items()) + "}"
        else:
            self.by_kind = dict.fromkeys(_OWN_KIND, self._parse(spec))
            self.text = self._text(spec)

    @staticmethod
    def _parse(value: str | Spec) -> Spec | None:
        if value == SAME:
            return None  # resolved per source: its own kind
        if not isinstance(value, (str, Spec)):
            raise SpecError(f"convert: {value!r} is not a spec; give a spec string such as 'bn' or 'gn(groups=8)'")
        return parse(value)

    @staticmethod
    def _text(value: str | Spec) -> str:
        return SAME if value == SAME else parse(value).text

    def __call__(self, module: nn.Module, source: Source) -> Spec | str:
        """The spec for `module`, or why it is left as it is."""
        for cls, target in self.by_class:
            if isinstance(module, cls):
                return target if target is not None else parse(_OWN_KIND[source.kind])
        if source.kind not in self.by_kind:
            return f"its kind '{source.kind}' is not in the mapping"
        target = self.by_kind[source.kind]
        return target if target is not None else parse(_OWN_KIND[source.kind])


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
    spec: Spec
    act_name: str | None = None  # the activation handed to the spec
    act_child: str | None = None  # the Sequential sibling the spec took over
    traced: bool = False  # the activation is a call in the parent's forward, dropped by rewriting it
    plain: bool = False  # no activation follows: a post-activation spec builds its plain norm here


def _read(reader: Any, module: nn.Module, path: str) -> Source:
    """`reader(module)`, refused in one line when it fails or returns something else than a Source."""
    cls = f"{type(module).__module__}.{type(module).__name__}"
    try:
        source = reader(module)
    except SpecError as exc:
        raise SpecError(f"cannot convert {path} ({exc}") from None
    except Exception as exc:  # a user's reader: any failure is the reader's, said in one line
        raise SpecError(f"cannot convert {path}: the reader registered for {cls} failed ({type(exc).__name__}: "
                        f"{first_line(exc)}); fix the reader or leave the class with leave=") from None
    if not isinstance(source, Source):
        raise SpecError(f"cannot convert {path}: the reader registered for {cls} returned "
                        f"{type(source).__name__}, not a normkit.interop.Source; return one, or register the "
                        "class with normkit.register_not_norm(cls) to leave it as it is")
    return source


class _Leave:
    """The classes and module paths `leave=` keeps as they are."""

    def __init__(self, model: nn.Module, leave: Iterable[type | str]) -> None:
        if isinstance(leave, (str, type)):
            leave = [leave]
        self.classes = tuple(item for item in leave if isinstance(item, type))
        self.paths = [item for item in leave if isinstance(item, str)]
        wrong = [item for item in leave if not isinstance(item, (str, type))]
        if wrong:
            raise SpecError(f"convert: leave= takes classes and module paths, not {wrong[0]!r}")
        for path in self.paths:
            try:
                model.get_submodule(path)
            except AttributeError:
                raise SpecError(f"convert: leave={path!r} is no module path in {type(model).__name__} "
                                "(paths as model.named_modules() gives them)") from None

    def why(self, module: nn.Module, path: str) -> str | None:
        if path in self.paths:
            return "leave= names its path"
        if isinstance(module, self.classes):
            return f"leave= names its class {type(module).__name__}"
        if is_not_norm(module):
            return f"{type(module).__name__} is registered as not a norm to replace"
        return None


def _plan(model: nn.Module, choice: _Choice, leave: _Leave, left: list[tuple[str, str]]) -> list[_Site]:
    """Every known norm in `model` the choice converts, with the activation its spec takes over."""
    plan = []

    def visit(parent: nn.Module, prefix: str) -> None:
        children = list(parent.named_children())
        for i, (name, child) in enumerate(children):
            path = f"{prefix}{name}"
            why = leave.why(child, path)
            if why is not None:
                left.append((path, why))
                continue
            reader = reader_for(child, path)
            if reader is None:
                visit(child, path + ".")
                continue
            source = _read(reader, child, path)
            spec = choice(child, source)
            if isinstance(spec, str):
                left.append((path, spec))
                continue
            site = _Site(parent, name, path, child, source, spec)
            needs_act = _needs_activation(spec) or spec.norm.entry.includes_activation
            if site.source.activation is not None:
                if needs_act:
                    site.act_name = _activation_name(site.source.activation)
                    if site.act_name is None:
                        raise SpecError(f"cannot place {spec.text!r} at {path}: its activation "
                                        f"{site.source.activation!r} is not one normkit can take over")
            elif needs_act:
                nxt = children[i + 1] if i + 1 < len(children) else None
                if isinstance(parent, nn.Sequential) and nxt is not None:
                    site.act_name = _activation_name(nxt[1])
                    site.act_child = nxt[0] if site.act_name else None
                site.traced = site.act_name is None and not isinstance(parent, nn.Sequential)
            plan.append(site)

    visit(model, "")
    _take_traced_activations([site for site in plan if _needs_activation(site.spec)])
    return plan


def _take_traced_activations(plan: list[_Site]) -> None:
    """For norms with no activation found yet: the activation call that alone reads the norm's output
    in its parent's forward (torchvision's `relu(bn1(x))`, one ReLU module shared with the residual
    sum's). Where none does (the last norm of a residual branch, before the sum), a post-activation
    spec (`+pn`) builds its plain norm; a spec with an activation stage is refused."""
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
        if site.act_name is None and any(p.entry.kind == "post_activation" for p in site.spec.parts):
            site.plain = True
        elif site.act_name is None:
            raise SpecError(
                f"cannot place {site.spec.text!r} at {site.path}: no activation directly follows it (in an "
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


def convert(model: nn.Module, spec: SpecChoice, *, leave: Iterable[type | str] = (), causal: bool | None = None,
            allow_empty: bool = False) -> ConversionSummary:
    """Replace every known norm layer in `model` (normkit.interop.sources: torch, timm, torchvision, HF,
    and classes whose code repeats one of those), in place.

    `spec` is one spec for every norm, `"same"` (each norm to its own kind: bn, gn, in, ln, rms), or
    a mapping from source kinds ("batch", "group", "instance", "layer", "rms") or classes to specs
    (or "same"), e.g. `{"batch": "gn(groups=8)+pn", "layer": "rms"}`; norms it does not name are
    left as they are. `leave` names classes and module paths kept as they are (with their
    submodules). Channel count, layout and partition come from each layer; affine parameters,
    running statistics and settings (eps, momentum, groups, affine) are copied where the new layer
    has them. A norm-act source (timm BatchNormAct2d) keeps its activation, or hands it to a spec
    that owns one (`+pn`, frn, evonorm); otherwise specs with an activation step take over the
    activation that alone reads the norm's output (the next module in an nn.Sequential, or a call
    in the parent's forward), and a post-activation spec builds its plain norm where there is
    none (before a residual sum). Forward hooks move to the new layer. A layer-norm-family
    target on a per-position norm (LayerNorm2d) keeps normalizing each position over channels.
    A norm pooling over tokens that its source did not pool over is refused in a causal model
    (or part of one: a config or `causal`/`is_causal` mark inside says so) unless `causal=False`,
    and on token norms of a model that cannot tell unless `causal` is given. Converting no layer
    is an error unless `allow_empty`. Nothing is changed when any layer cannot be converted.
    Returns a summary of what was replaced and left.
    """
    _require_module(model, "convert")
    choice = _Choice(spec)
    if reader_for(model, "model") is not None:
        raise SpecError("convert() replaces norms inside a model; use normkit.build() for one layer")
    summary = ConversionSummary(choice.text)
    plan = _plan(model, choice, _Leave(model, leave), summary.left)
    if not plan and not allow_empty:
        raise SpecError(f"convert found no norm layer normkit knows in {type(model).__name__} to convert; "
                        "register its norm class with normkit.register_source, or pass allow_empty=True")
    is_causal = causality(model) if causal is None else causal
    built = []
    for site in plan:
        target = _plain(site.spec) if site.plain else site.spec
        new = _build(target, site)
        _check_causal(model, site, new, is_causal)
        copied = _copy_state(site.old, new, site.source)
        owned = site.act_name
        if site.spec.norm.entry.includes_activation and site.act_name:
            owned = f"{site.act_name} dropped"
        elif site.act_name is None and site.source.activation is not None:
            owned = f"kept {type(site.source.activation).__name__}"
        note = _PLAIN_NOTE if site.plain else None
        built.append((site.parent, site.name, new, site.act_child,
                      Replacement(site.path, type(site.old).__name__, target.text, copied, owned, note)))
    _check_feeding_convs(model, built)  # before any change: a '+ws' norm needs a conv before it
    traced = [site for site in plan if site.traced]
    drops = plan_drops(model, _by_parent(traced)) if traced else None
    for site, (parent, name, new, act_child, record) in zip(plan, built, strict=True):
        carry_hooks(site.old, new)
        setattr(parent, name, new)
        if act_child is not None:
            setattr(parent, act_child, nn.Identity())
        summary.replaced.append(record)
    if drops is not None:
        sites = {site.path: site for site in plan}
        records = {r.path: r for r in summary.replaced}
        for drop in apply_drops(model, drops):
            path = f"{drop.parent_path}.{drop.norm}" if drop.parent_path else drop.norm
            if sites[path].spec.norm.entry.includes_activation:
                records[path].activation = f"{drop.activation} dropped"
    prepare_feeding_convs(model)
    return summary


def _check_causal(model: nn.Module, site: _Site, new: nn.Module, is_causal: bool | None) -> None:
    """Refuse a norm that lets a token read later tokens through statistics its source did not pool."""
    if is_causal is False:
        return
    reason = pools_tokens(new)
    if reason is None or pools_same_values(site.source, new):
        return
    if is_causal:
        raise SpecError(f"cannot convert {site.path}: {type(model).__name__} is causal (or part of a causal "
                        f"model) and {site.spec.text!r} {reason}, leaking future tokens; use a per-token norm "
                        "(ln, rms, lnn, dyt) or pass causal=False if the model is not causal")
    if site.source.channel_dim == -1:
        raise SpecError(f"cannot convert {site.path}: {site.spec.text!r} {reason} where "
                        f"{type(site.old).__name__} normalized each token alone, and nothing in "
                        f"{type(model).__name__} says whether it is causal (no config, no causal mark); pass "
                        "causal=True or causal=False")


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
    rms, ...) need no communication and are left alone. Ghost batches (`bn(ghost=2)`) stay within a
    process and only their running buffers are averaged across processes (normkit.ghost). torch's
    own BatchNorm layers are torch's to convert (`nn.SyncBatchNorm.convert_sync_batchnorm`).
    """
    _require_module(model, "convert_sync")
    layers = [m for m in model.modules() if isinstance(m, NormLayer) and m.partition is not None
              and m.partition.uses_batch]
    for module in layers:
        module.sync = ProcessSync(process_group)
    return model
