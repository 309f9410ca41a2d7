"""The registry of norms, stages, models, datasets, presets and workloads, filled by plugins through `register`.

Norms and stages share one namespace (both appear in spec strings); models, datasets and
reproduction presets and suite workloads have their own. Every name and alias is unique: a second registration fails
naming both plugins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from normkit.errors import PluginError, SpecError, did_you_mean
from normkit.grammar import canonical_name
from normkit.params import Param, signature_params
from normkit.stages import Pipeline

Kind = Literal["norm", "step", "activation", "post_activation", "model", "dataset", "preset", "workload"]
STAGE_KINDS = ("step", "activation", "post_activation")
# Keyword arguments `normkit.build` passes to a factory= norm itself; never spec parameters.
BUILD_ARGUMENTS = ("channel_dim",)
# Declared for every pipeline norm whose partition pools over the batch (bn, bnn, brn, a plugin's):
# `bn(ghost=2)` normalizes over ghost batches of 2 samples (normkit.ghost). The core gives it to the
# partition, never to the plugin's pipeline function.
GHOST = Param("ghost", int | None, None)


def _ghost_params(pipeline: Callable[..., Any], params: tuple[Param, ...]) -> tuple[Param, ...]:
    """(GHOST,) when the pipeline's default partition pools over the batch and it declares no `ghost`."""
    if any(p.name == "ghost" for p in params):
        return ()
    try:
        default = pipeline()
    except Exception:  # a pipeline that cannot build at its defaults fails later, with its own message
        return ()
    partition = getattr(default, "partition", None) if isinstance(default, Pipeline) else None
    return (GHOST,) if partition is not None and partition.uses_batch else ()


# Names that become a directory or a link (a workload's results directory in a suite, `cnn@narrow` for a
# held-out variant, the scorecard page's link to it): a letter or digit, then letters, digits, '-' or '_'.
# No '.', '/', '\\', ':', '@' or spaces, so no such name can climb out of the directory it is written in
# (`../x`), be absolute, name a URL scheme (`javascript:`), collide with a suite's own files (`suite.json`)
# or split at the variant separator.
PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def path_name(owner: str, what: str, name: Any) -> str:
    """`name` when it is safe as a directory name and a relative link; else one PluginError naming `owner`."""
    if not isinstance(name, str) or not PATH_NAME.fullmatch(name):
        raise PluginError(f"{owner}: {what} {name!r} becomes a directory and a link, so it must be 1 to 64 "
                          f"letters, digits, '-' or '_', starting with a letter or digit (no '.', '/', ':' or "
                          f"spaces)")
    return name


def _owner(plugin: str, kind: str, name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"plugin {plugin!r}: a {kind} registered with name {name!r}; names are non-empty strings")
    return f"plugin {plugin!r}: {kind} {name!r}"


@dataclass
class Entry:
    """One registered item and everything `normkit list` / `available()` shows about it."""

    name: str
    kind: Kind
    plugin: str
    summary: str = ""
    citation: str = ""
    aliases: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    pipeline: Callable[..., Any] | None = None  # norms: (**params) -> Pipeline
    compose: str | None = None  # norms: spec this name expands to
    factory: Callable[..., Any] | None = None  # norms: (C, **p) -> Module; stages: (ctx, **p)
    position: Literal["before", "after"] | None = None  # steps: relative to the core step
    activation_param: str | None = None  # post-activation stages that bring their activation
    includes_activation: bool = False  # norms whose output is already nonlinear (FRN+TLU, EvoNorm)
    meta: dict[str, Any] = field(default_factory=dict)

    def make_pipeline(self, params: dict[str, Any]) -> Any:
        """The norm's Pipeline for typed spec `params`; the core's `ghost` goes to its partition."""
        if not self.meta.get("ghost"):
            return self.pipeline(**params)
        params = dict(params)
        ghost = params.pop("ghost", None)
        pipeline = self.pipeline(**params)
        if ghost is None or not isinstance(pipeline, Pipeline) or pipeline.partition is None:
            return pipeline
        return replace(pipeline, partition=replace(pipeline.partition, ghost=ghost))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "aliases": list(self.aliases),
            "plugin": self.plugin,
            "summary": self.summary,
            "parameters": {p.name: {"type": p.type_name, "default": p.default} for p in self.params},
            "citation": self.citation,
            **({"expands_to": self.compose} if self.compose else {}),
            **({"includes_activation": True} if self.includes_activation else {}),
            **({"ablations": dict(self.meta["ablations"])} if self.meta.get("ablations") else {}),
        }


def _ablations(owner: str, ablations: Any, params: tuple[Param, ...], *,
               removable: bool) -> dict[str, dict[str, Any] | None]:
    """Checked `ablations=` of a norm or stage: label -> the values of its declared parameters that
    switch that part off (typed), or None (stages only) to drop the whole stage. Stored in meta."""
    if ablations is None:
        return {}
    if not isinstance(ablations, Mapping):
        raise PluginError(f"{owner}: ablations= maps a label to parameter values, e.g. {{'noise': {{'noise': 0.0}}}}")
    declared = {p.name: p for p in params}
    out: dict[str, dict[str, Any] | None] = {}
    for label, values in ablations.items():
        if not isinstance(label, str) or not label.strip():
            raise PluginError(f"{owner}: ablation labels are non-empty strings, not {label!r}")
        if values is None and removable:
            out[label] = None
            continue
        if not isinstance(values, Mapping) or not values:
            what = "parameter values or None (drop the stage)" if removable else "parameter values"
            raise PluginError(f"{owner}: ablation {label!r} must be {what}, not {values!r}")
        unknown = [k for k in values if k not in declared]
        if unknown:
            raise PluginError(f"{owner}: ablation {label!r} sets {unknown[0]!r}, which is not a parameter"
                              f"{did_you_mean(str(unknown[0]), declared)}")
        out[label] = {k: declared[k].coerce(v, owner) for k, v in values.items()}
    return out


class Registry:
    """Name -> Entry maps; `registrar(plugin)` gives the `register` callables for one plugin."""

    def __init__(self) -> None:
        self.spec_names: dict[str, Entry] = {}  # norms and stages, names and aliases
        self.models: dict[str, Entry] = {}
        self.datasets: dict[str, Entry] = {}
        self.presets: dict[str, Entry] = {}  # reproduction presets: meta["path"] is the YAML file
        self.workloads: dict[str, Entry] = {}  # suite workloads: meta["workload"] is their mapping
        self.entries: list[Entry] = []
        self.failed_plugins: list[str] = []  # set by the loader: named in "unknown name" errors

    # -- registration -----------------------------------------------------------------------

    def _table(self, kind: Kind) -> dict[str, Entry]:
        return {"model": self.models, "dataset": self.datasets, "preset": self.presets,
                "workload": self.workloads}.get(kind, self.spec_names)

    def add(self, entry: Entry) -> None:
        table = self._table(entry.kind)
        keys = [canonical_name(entry.name), *(canonical_name(a) for a in entry.aliases)]
        if len(set(keys)) != len(keys):
            raise PluginError(f"plugin {entry.plugin!r} registers {entry.name!r} with a repeated alias")
        for key in keys:
            if key in table:
                other = table[key]
                raise PluginError(
                    f"{key!r} is registered twice: by plugin {other.plugin!r} ({other.kind} "
                    f"{other.name!r}) and by plugin {entry.plugin!r}; uninstall one or disable it "
                    "with NORMKIT_DISABLED_PLUGINS"
                )
        for key in keys:
            table[key] = entry
        self.entries.append(entry)

    def remove_plugin(self, plugin: str) -> None:
        """Roll back everything a plugin registered (used when its hook fails half-way)."""
        self.entries = [e for e in self.entries if e.plugin != plugin]
        for table in (self.spec_names, self.models, self.datasets, self.presets, self.workloads):
            for key in [k for k, e in table.items() if e.plugin == plugin]:
                del table[key]

    def registrars(self, plugin: str) -> dict[str, Callable[..., None]]:
        """The `register` callable handed to each hook, stamped with the plugin's name."""

        def register_norm(name: str, *, pipeline: Callable[..., Any] | None = None,
                          compose: str | None = None, factory: Callable[..., Any] | None = None,
                          aliases: Sequence[str] = (), summary: str = "", citation: str = "",
                          includes_activation: bool = False,
                          ablations: Mapping[str, Mapping[str, Any]] | None = None) -> None:
            owner = _owner(plugin, "norm", name)
            given = [x for x in (pipeline, compose, factory) if x is not None]
            if len(given) != 1:
                raise PluginError(f"{owner} needs exactly one of pipeline=, compose= or factory=")
            ghost: tuple[Param, ...] = ()
            if pipeline is not None:
                params = signature_params(pipeline, owner=owner)
                ghost = _ghost_params(pipeline, params)
            elif factory is not None:
                params = tuple(p for p in signature_params(factory, skip=1, owner=owner)
                               if p.name not in BUILD_ARGUMENTS)
            else:
                if not isinstance(compose, str):
                    raise PluginError(f"{owner}: compose= takes a spec string such as 'bn+nn'")
                params = ()  # a composition's parameters are those of its parts
            if compose is not None and ablations:
                raise PluginError(f"{owner}: a composition's ablations are those of its parts; declare them there")
            ablated = _ablations(owner, ablations, params, removable=False)
            meta: dict[str, Any] = {"ablations": ablated} if ablated else {}
            if ghost:
                meta["ghost"] = True
            self.add(Entry(name, "norm", plugin, summary, citation, tuple(aliases), params + ghost,
                           pipeline=pipeline, compose=compose, factory=factory,
                           includes_activation=includes_activation, meta=meta))

        def register_stage(name: str, factory: Callable[..., Any], *,
                           kind: Literal["step", "activation", "post_activation"] = "step",
                           position: Literal["before", "after"] = "after",
                           activation_param: str | None = None, aliases: Sequence[str] = (),
                           summary: str = "", citation: str = "",
                           partition_defaults: dict[str, Any] | None = None,
                           ablations: Mapping[str, Mapping[str, Any] | None] | None = None) -> None:
            owner = _owner(plugin, "stage", name)
            if kind not in STAGE_KINDS:
                raise PluginError(f"{owner} has unknown kind {kind!r}; use one of {', '.join(STAGE_KINDS)}")
            if position not in ("before", "after"):
                raise PluginError(f"{owner}: position must be 'before' or 'after'")
            params = signature_params(factory, skip=1, owner=owner)
            if activation_param and activation_param not in {p.name for p in params}:
                raise PluginError(f"{owner} has no parameter {activation_param!r}")
            meta: dict[str, Any] = {"partition_defaults": dict(partition_defaults)} if partition_defaults else {}
            ablated = _ablations(owner, ablations, params, removable=True)
            if ablated:
                meta["ablations"] = ablated
            self.add(Entry(name, kind, plugin, summary, citation, tuple(aliases), params,
                           factory=factory, position=position if kind == "step" else None,
                           activation_param=activation_param, meta=meta))

        def register_item(kind: Kind) -> Callable[..., None]:
            def register(name: str, factory: Callable[..., Any], *, aliases: Sequence[str] = (),
                         summary: str = "", citation: str = "", skip: int = 0, **meta: Any) -> None:
                params = signature_params(factory, skip=skip, owner=_owner(plugin, kind, name))
                self.add(Entry(name, kind, plugin, summary, citation, tuple(aliases), params,
                               factory=factory, meta=meta))

            return register

        def register_preset(name: str, path: Any, *, summary: str = "", citation: str = "") -> None:
            owner = _owner(plugin, "preset", name)
            if not (isinstance(path, (str, os.PathLike)) or hasattr(path, "read_text")):
                raise PluginError(f"{owner}: path must be a file path or an importlib.resources file, "
                                  f"not {type(path).__name__}")
            self.add(Entry(name, "preset", plugin, summary, citation, meta={"path": path}))

        def register_workload(name: str, workload: Mapping[str, Any], *, summary: str = "",
                              citation: str = "") -> None:
            owner = _owner(plugin, "workload", name)
            if not isinstance(workload, Mapping):
                raise PluginError(f"{owner}: the workload must be a mapping (see docs/suite.md), "
                                  f"not {type(workload).__name__}")
            path_name(f"plugin {plugin!r}", "workload name", name)
            variants = workload.get("variants")
            seen: dict[str, str] = {}
            for variant in variants if isinstance(variants, Mapping) else ():
                path_name(owner, "variant name", variant)
                if canonical_name(variant) in seen:  # one directory on a case-insensitive file system
                    raise PluginError(f"{owner}: variants {seen[canonical_name(variant)]!r} and {variant!r} "
                                      f"differ only in case or '-'/'_'; rename one")
                seen[canonical_name(variant)] = variant
            self.add(Entry(name, "workload", plugin, summary, citation, meta={"workload": dict(workload)}))

        return {
            "normkit_register_norms": register_norm,
            "normkit_register_stages": register_stage,
            "normkit_register_models": register_item("model"),
            "normkit_register_datasets": register_item("dataset"),
            "normkit_register_presets": register_preset,
            "normkit_register_workloads": register_workload,
        }

    # -- lookup -----------------------------------------------------------------------------

    def lookup(self, name: str) -> Entry:
        """A norm or stage by name or alias (case-insensitive)."""
        key = canonical_name(name)
        if key not in self.spec_names:
            raise SpecError(f"unknown norm or stage {name!r}{did_you_mean(key, self.spec_names)}"
                            f" (see `normkit list`){self._failed_note()}")
        return self.spec_names[key]

    def lookup_item(self, kind: Literal["model", "dataset", "preset", "workload"], name: str) -> Entry:
        table = self._table(kind)
        key = canonical_name(name)
        if key not in table:
            known = ", ".join(sorted({e.name for e in table.values()})) or "none installed"
            raise SpecError(f"unknown {kind} {name!r}{did_you_mean(key, table)} (available: {known})"
                            f"{self._failed_note()}")
        return table[key]

    def _failed_note(self) -> str:
        if not self.failed_plugins:
            return ""
        names = ", ".join(repr(n) for n in self.failed_plugins)
        noun = "plugin" if len(self.failed_plugins) == 1 else "plugins"
        return f"; note: {noun} {names} failed to load (see `normkit plugins`)"

    def of_kind(self, *kinds: Kind) -> list[Entry]:
        return sorted((e for e in self.entries if e.kind in kinds), key=lambda e: (e.kind != "norm", e.name))
