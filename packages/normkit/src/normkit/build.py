"""`normkit.build`: turn a spec into an nn.Module."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from normkit import plugins
from normkit.errors import PluginError, SpecError
from normkit.layer import NormLayer
from normkit.limits import check_num_channels
from normkit.registry import Entry
from normkit.spec import Part, Spec, params_of, parse, route
from normkit.stages import BuildContext, Pipeline, PostActivationStep, Step


def _with_overrides(spec: Spec, overrides: dict[str, Any], norm_settings: dict[str, Any]) -> list[Part]:
    """Apply keyword overrides to every part that declares them (explicit spec values win).

    `norm_settings` go to the base norm only, when it declares them (convert() carries an old
    layer's eps/momentum this way, so a stage's own eps, e.g. pn's 0.03, is left alone).
    """
    parts = [Part(p.entry, dict(p.params)) for p in spec.parts]
    head = parts[0]
    norm_declared = {q.name: q for q in head.entry.params}
    for key, value in norm_settings.items():
        if key in norm_declared and key not in head.params:
            head.params[key] = norm_declared[key].coerce(value, head.name)
    for key, value in overrides.items():
        route(key, value, [(p.entry, p.params) for p in parts], repr(spec.text))
    return parts


class CheckedFactory:
    """A stage factory whose result is checked: a broken plugin fails at build with a PluginError
    naming the plugin and the registered name, not later inside forward."""

    def __init__(self, entry: Entry, factory: Callable[[BuildContext], Any], kind: type) -> None:
        self.entry, self.factory, self.kind = entry, factory, kind

    def __call__(self, ctx: BuildContext) -> Any:
        step = self.factory(ctx)
        if not isinstance(step, self.kind):
            raise PluginError(f"plugin {self.entry.plugin!r}: {self.entry.kind} {self.entry.name!r} returned "
                              f"{type(step).__name__}, not a normkit {self.kind.__name__}")
        return step


def _activation_module(name: str, params: dict[str, Any], ctx: BuildContext) -> nn.Module:
    entry = plugins.registry().lookup(name)
    if entry.kind != "activation":
        raise SpecError(f"{name!r} is a {entry.kind}, not an activation")
    module = entry.factory(ctx, **params)
    if not isinstance(module, nn.Module):
        raise PluginError(f"plugin {entry.plugin!r}: activation {entry.name!r} returned "
                          f"{type(module).__name__}, not a torch nn.Module")
    return module


def _place_stages(spec: Spec, pipeline: Pipeline, parts: list[Part], activation: str | None) -> None:
    after = pipeline.core
    for part in parts[1:]:
        entry, params = part.entry, part.params
        if entry.kind == "step":
            if pipeline.core is None:
                raise SpecError(f"{spec.text}: {parts[0].name!r} has no normalizing step to place "
                                f"{entry.name!r} {entry.position}")
            factory = CheckedFactory(entry, functools.partial(entry.factory, **params), Step)
            if entry.position == "before":
                pipeline.steps.insert(pipeline.core, factory)
                pipeline.core += 1
                after += 1
            else:
                after += 1
                pipeline.steps.insert(after, factory)
        elif entry.kind == "activation":
            if activation is not None and _canon(activation) != entry.name:
                raise SpecError(f"{spec.text}: the spec's activation {entry.name!r} differs from the "
                                f"model's {activation!r} after this norm; drop '+{entry.name}'")
            pipeline.activation, pipeline.activation_params = entry.name, dict(params)
        else:
            _place_post(spec, pipeline, entry, params, activation)
    if pipeline.activation is None and activation is not None:
        pipeline.activation = _canon(activation)


def _place_post(spec: Spec, pipeline: Pipeline, entry: Entry, params: dict[str, Any],
                activation: str | None) -> None:
    current = pipeline.activation or (_canon(activation) if activation else None)
    key = entry.activation_param
    if key is None:
        if current is None:
            raise SpecError(f"{spec.text}: post-activation step {entry.name!r} needs an activation "
                            f"before it, e.g. '{spec.norm.name}+relu+{entry.name}'")
    elif key in params:
        wanted = _canon(str(params[key]))
        if current is not None and current != wanted:
            raise SpecError(f"{spec.text}: {entry.name}({key}={params[key]}) conflicts with the "
                            f"activation {current!r} that follows this norm")
        current = wanted
    elif current is None:
        current = _canon(str({p.name: p for p in entry.params}[key].default))
    if key is not None:
        params = {**params, key: current}
    pipeline.activation = current
    pipeline.post = CheckedFactory(entry, functools.partial(entry.factory, **params), PostActivationStep)
    pipeline.post_name = entry.name


def activation_kept(spec: Spec, activation: str | None) -> str | None:
    """The model activation a layer of `spec` owns: None when the norm includes its nonlinearity.

    Such a norm (FRN+TLU, EvoNorm) replaces norm *and* activation, so the activation that follows
    it in the model is dropped, and '+relu' / '+pn' stages on it are refused.
    """
    if not spec.norm.entry.includes_activation:
        return activation
    extra = [p.name for p in spec.stages if p.entry.kind in ("activation", "post_activation")]
    if extra:
        raise SpecError(f"{spec.text}: {spec.norm.name!r} includes its own activation, so "
                        f"'+{extra[0]}' would add a second one; drop '+{extra[0]}'")
    return None


def _canon(name: str) -> str:
    return plugins.registry().lookup(name).name


def build(spec: str | Spec, num_channels: int, *, channel_dim: int = 1,
          activation: str | None = None, **overrides: Any) -> nn.Module:
    """Build the layer a spec names, for `num_channels` channels.

    channel_dim: 1 for `N, C, *` inputs, -1 for channels-last tokens `N, *, C`.
    activation: the activation that follows this norm in the model; the layer then owns it
        (needed by post-activation steps such as `pn`). Default: no activation.
    overrides: parameter values applied to every part that declares them, unless the spec
        sets them explicitly (e.g. `build("bn", 64, momentum=0.01)`).
    """
    return build_with_settings(spec, num_channels, channel_dim=channel_dim, activation=activation,
                               overrides=overrides, norm_settings={})


def build_with_settings(spec: str | Spec, num_channels: int, *, channel_dim: int, activation: str | None,
                        overrides: dict[str, Any], norm_settings: dict[str, Any]) -> nn.Module:
    """`build`, plus settings that only the base norm takes when it declares them (see convert)."""
    parsed = parse(spec)
    check_num_channels(num_channels, parsed.text)  # before any allocation, for factory norms too
    activation = activation_kept(parsed, activation)
    parts = _with_overrides(parsed, overrides, norm_settings)
    head = parts[0]
    if head.entry.factory is not None:
        factory = head.entry.factory
        kwargs = dict(head.params)
        if "channel_dim" in inspect.signature(factory).parameters:
            kwargs["channel_dim"] = channel_dim
        module = factory(num_channels, **kwargs)
        if not isinstance(module, nn.Module):
            raise PluginError(f"plugin {head.entry.plugin!r}: norm {head.name!r} (factory=) returned "
                              f"{type(module).__name__}, not a torch nn.Module")
        if activation is not None:
            module = nn.Sequential(module, _activation_module(activation, {}, BuildContext(
                num_channels, channel_dim, None, activation)))
        return module
    pipeline = head.entry.make_pipeline(head.params)
    if not isinstance(pipeline, Pipeline):
        raise PluginError(f"plugin {head.entry.plugin!r}: norm {head.name!r} (pipeline=) returned "
                          f"{type(pipeline).__name__}, not a normkit Pipeline")
    pipeline = pipeline.copy()
    pipeline.steps = [CheckedFactory(head.entry, f, Step) for f in pipeline.steps]
    _place_stages(parsed, pipeline, parts, activation)
    act = None
    if pipeline.activation is not None:
        ctx = BuildContext(num_channels, channel_dim, pipeline.partition, pipeline.activation)
        act = _activation_module(pipeline.activation, pipeline.activation_params, ctx)
    return NormLayer(pipeline, num_channels, channel_dim=channel_dim, spec=parsed.text,
                     activation_module=act)


def available() -> list[dict[str, Any]]:
    """Every registered norm and stage: name, kind, aliases, plugin, summary, parameters, citation."""
    reg = plugins.registry()
    out = []
    for entry in reg.of_kind("norm", "step", "activation", "post_activation"):
        d = entry.as_dict()
        d["parameters"] = {p.name: {"type": p.type_name, "default": p.default}
                           for p in params_of(entry, reg)}
        out.append(d)
    return out
