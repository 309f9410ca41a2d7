"""The plugin hooks. Each receives a `register` callable so one plugin can add many items.

    @normkit.hookimpl
    def normkit_register_norms(register):
        register("bn", pipeline=batch_norm_pipeline, summary="...", citation="...")
        register("bnn", compose="bn+nn", summary="...")
        register("mynorm", factory=MyNorm)          # any (num_channels, **params) -> nn.Module

Each hook's `register` is typed by a Protocol below (`normkit.RegisterNorm`, ...), so editors
complete and check its keyword arguments; annotate your hook's argument with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import pluggy

hookspec = pluggy.HookspecMarker("normkit")
hookimpl = pluggy.HookimplMarker("normkit")


class RegisterNorm(Protocol):
    """`register` of `normkit_register_norms`: exactly one of pipeline=, compose=, factory=.

    pipeline: `(**params) -> normkit.stages.Pipeline`; compose: a spec this name expands to
    ("bn+nn"); factory: `(num_channels, **params) -> nn.Module`, which may also take a
    `channel_dim` keyword (given by build, not a spec parameter). Parameters are keyword
    arguments with defaults and bool/int/float/str/Literal hints. includes_activation: the norm
    applies its own nonlinearity (FRN+TLU, EvoNorm), so models drop the activation after it.
    ablations: the norm's stages an experiment can neutralize, by label, each as the parameter values
    that switch it off (`{"noise": {"noise": 0.0}}`); `normkit compare --ablate` runs those arms.
    """

    def __call__(self, name: str, *, pipeline: Callable[..., Any] | None = None, compose: str | None = None,
                 factory: Callable[..., Any] | None = None, aliases: Sequence[str] = (), summary: str = "",
                 citation: str = "", includes_activation: bool = False,
                 ablations: Mapping[str, Mapping[str, Any]] | None = None) -> None: ...


class RegisterStage(Protocol):
    """`register` of `normkit_register_stages`: `factory(ctx: BuildContext, **params)` returns a Step
    (kind="step"), an nn.Module (kind="activation") or a PostActivationStep (kind="post_activation").

    ablations: what an experiment can neutralize, by label: parameter values that switch a part of the
    stage off (`{"noise": {"noise": 0.0}}`), or None for the whole stage, which is then dropped from
    the spec (`{"proxy step": None}`: gn+pn -> gn(groups=8)); `normkit compare --ablate` runs those arms.
    """

    def __call__(self, name: str, factory: Callable[..., Any], *,
                 kind: Literal["step", "activation", "post_activation"] = "step",
                 position: Literal["before", "after"] = "after", activation_param: str | None = None,
                 aliases: Sequence[str] = (), summary: str = "", citation: str = "",
                 partition_defaults: dict[str, Any] | None = None,
                 ablations: Mapping[str, Mapping[str, Any] | None] | None = None) -> None: ...


class RegisterItem(Protocol):
    """`register` of `normkit_register_models` / `normkit_register_datasets`: `factory(ctx, **params)`;
    `skip` positional arguments come first, extra keywords are kept as metadata."""

    def __call__(self, name: str, factory: Callable[..., Any], *, aliases: Sequence[str] = (),
                 summary: str = "", citation: str = "", skip: int = 0, **meta: Any) -> None: ...


class RegisterPreset(Protocol):
    """`register` of `normkit_register_presets`: a reproduction preset (`normkit reproduce NAME`), a
    YAML data file the plugin ships in its package (read by normkit-lab; see docs/reproduce.md)."""

    def __call__(self, name: str, path: Any, *, summary: str = "", citation: str = "") -> None: ...


class RegisterWorkload(Protocol):
    """`register` of `normkit_register_workloads`: a workload of the norm benchmark (`normkit suite`), a
    mapping of plain data (model, data, recipe, target, held-out variants) that normkit-lab reads and
    checks (see docs/suite.md)."""

    def __call__(self, name: str, workload: Mapping[str, Any], *, summary: str = "", citation: str = "") -> None: ...


HOOK_NAMES = ("normkit_register_norms", "normkit_register_stages", "normkit_register_models",
              "normkit_register_datasets", "normkit_register_presets", "normkit_register_workloads")


@hookspec
def normkit_register_norms(register: RegisterNorm) -> None:
    """Register named norms: a pipeline builder, a composition of other names, or a factory."""


@hookspec
def normkit_register_stages(register: RegisterStage) -> None:
    """Register composable stages usable after '+': steps, activations, post-activation steps."""


@hookspec
def normkit_register_models(register: RegisterItem) -> None:
    """Register model builders for experiments (used by normkit-lab)."""


@hookspec
def normkit_register_datasets(register: RegisterItem) -> None:
    """Register datasets for experiments (used by normkit-lab)."""


@hookspec
def normkit_register_presets(register: RegisterPreset) -> None:
    """Register reproduction presets: `register(name, path)` with `path` a YAML file in the plugin's
    package (`importlib.resources.files(__name__) / "presets" / "x.yaml"`)."""


@hookspec
def normkit_register_workloads(register: RegisterWorkload) -> None:
    """Register workloads of the norm benchmark: `register(name, {"config": {...}, "tune": {...}, ...})`."""
