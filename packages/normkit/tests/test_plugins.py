"""Plugin loading and registration: the register callables, duplicates, broken plugins, strict mode."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import normkit
from normkit import plugins
from normkit.stages import Partition, Pipeline, Standardize, Step
from normkit.testing import check_norm, temporary_plugin


class Doubler(Step):
    name = "double"

    def forward(self, x, groups, layer):
        return 2 * x


class ToyPlugin:
    @normkit.hookimpl
    def normkit_register_stages(self, register):
        register("double", lambda ctx: Doubler(), kind="step", position="after", summary="x2")

    @normkit.hookimpl
    def normkit_register_norms(self, register):
        register("toy-bn", compose="bn+double", summary="bn then double")
        register("scalenorm", factory=ScaleNorm, summary="a ready-made module", citation="none")
        register("centred", pipeline=lambda eps=1e-5: Pipeline(Partition("layer"), [lambda ctx: Standardize(eps)]))


class ScaleNorm(nn.Module):
    def __init__(self, num_channels: int, scale: float = 2.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def test_a_plugin_registers_stages_norms_and_factories() -> None:
    with temporary_plugin(ToyPlugin(), "toy") as info:
        assert set(info.registered) == {"double", "toy-bn", "scalenorm", "centred"}
        layer = normkit.build("toy-bn(eps=1e-3)", 4)
        assert [s.name for s in layer.steps] == ["standardize", "double"]
        assert layer.steps[0].eps == 1e-3
        assert isinstance(normkit.build("scalenorm(scale=3)", 4), ScaleNorm)
        entry = next(e for e in normkit.available() if e["name"] == "scalenorm")
        assert entry["parameters"] == {"scale": {"type": "float", "default": 2.0}}
        assert entry["plugin"] == "toy"
        assert next(e for e in normkit.available() if e["name"] == "toy-bn")["expands_to"] == "bn+double"
        with pytest.raises(normkit.SpecError, match="ready-made module"):
            normkit.build("scalenorm+relu", 4)
        check_norm("toy-bn", 4, only=["shapes", "gradients", "state_dict"])
    with pytest.raises(normkit.SpecError, match="unknown norm"):
        normkit.parse("toy-bn")


def test_a_name_registered_twice_names_both_plugins() -> None:
    class Clash:
        @normkit.hookimpl
        def normkit_register_norms(self, register):
            register("mine", pipeline=lambda: Pipeline(Partition("batch"), [lambda ctx: Standardize()]))
            register("bn", pipeline=lambda: Pipeline(Partition("batch"), [lambda ctx: Standardize()]))

    with pytest.raises(normkit.PluginError, match="'bn' is registered twice: by plugin 'standard'.*'clash'"):
        with temporary_plugin(Clash(), "clash"):
            pass
    with pytest.raises(normkit.SpecError):  # its partial registration was rolled back
        normkit.parse("mine")


def test_stage_and_norm_registration_is_validated() -> None:
    class Bad:
        @normkit.hookimpl
        def normkit_register_stages(self, register):
            register("oops", lambda ctx, p=1: Doubler(), kind="weird")

    with pytest.raises(normkit.PluginError, match="unknown kind 'weird'"):
        with temporary_plugin(Bad(), "bad"):
            pass


def _fake_entry_point(monkeypatch, module_name: str, module: types.ModuleType | None, dist="broken-dist"):
    """Make importlib.metadata return one extra entry point in group 'normkit'."""
    import importlib.metadata as md

    if module is not None:
        monkeypatch.setitem(sys.modules, module_name, module)
    real = md.entry_points
    ep = md.EntryPoint(name=module_name, value=module_name, group="normkit")

    class Dist:
        name, version = dist, "9.9"

    object.__setattr__(ep, "dist", Dist())

    def entry_points(**kw):
        found = list(real(**kw))
        return [*found, ep] if kw.get("group") == "normkit" else found

    monkeypatch.setattr(md, "entry_points", entry_points)


def test_a_plugin_that_fails_to_import_is_recorded_and_skipped(monkeypatch) -> None:
    _fake_entry_point(monkeypatch, "normkit_missing_plugin_xyz", None)
    monkeypatch.delenv("NORMKIT_STRICT_PLUGINS", raising=False)
    plugins.reload()
    try:
        failed = [p for p in plugins.plugins() if p.error]
        assert [p.name for p in failed] == ["normkit_missing_plugin_xyz"]
        assert "import failed: ModuleNotFoundError" in failed[0].error
        assert normkit.build("bn", 4) is not None  # everything else still works
        monkeypatch.setenv("NORMKIT_STRICT_PLUGINS", "1")
        plugins.reload()
        with pytest.raises(normkit.PluginError, match="normkit_missing_plugin_xyz.*failed to import"):
            plugins.registry()
    finally:
        monkeypatch.delenv("NORMKIT_STRICT_PLUGINS", raising=False)
        plugins.reload()


def test_a_plugin_whose_hook_raises_is_rolled_back(monkeypatch) -> None:
    module = types.ModuleType("normkit_halfway_plugin")

    @normkit.hookimpl
    def normkit_register_norms(register):
        register("halfway", pipeline=lambda: Pipeline(Partition("batch"), [lambda ctx: Standardize()]))
        raise RuntimeError("boom")

    module.normkit_register_norms = normkit_register_norms
    _fake_entry_point(monkeypatch, "normkit_halfway_plugin", module)
    monkeypatch.delenv("NORMKIT_STRICT_PLUGINS", raising=False)
    plugins.reload()
    try:
        info = next(p for p in plugins.plugins() if p.name == "normkit_halfway_plugin")
        assert info.error == "RuntimeError: boom" and info.distribution == "broken-dist"
        with pytest.raises(normkit.SpecError):
            normkit.parse("halfway")
    finally:
        plugins.reload()


def test_disabled_plugins_are_skipped(monkeypatch) -> None:
    monkeypatch.setenv("NORMKIT_DISABLED_PLUGINS", "standard")
    plugins.reload()
    try:
        with pytest.raises(normkit.SpecError, match="unknown norm"):
            normkit.parse("bn")
        assert any(p.name == "standard" and p.disabled and not p.error for p in plugins.plugins())
    finally:
        monkeypatch.delenv("NORMKIT_DISABLED_PLUGINS")
        plugins.reload()
    assert torch.isfinite(normkit.build("bn", 4)(torch.randn(3, 4))).all()


def test_a_third_party_clash_rejects_the_newcomer_not_the_standard_norms(monkeypatch) -> None:
    module = types.ModuleType("aaa_normkit_clash")

    @normkit.hookimpl
    def normkit_register_norms(register):
        register("bn", pipeline=lambda: Pipeline(Partition("batch"), [lambda ctx: Standardize()]))

    module.normkit_register_norms = normkit_register_norms
    _fake_entry_point(monkeypatch, "aaa_normkit_clash", module, dist="aaa-clash")
    monkeypatch.delenv("NORMKIT_STRICT_PLUGINS", raising=False)
    plugins.reload()
    try:
        clash = next(p for p in plugins.plugins() if p.name == "aaa_normkit_clash")
        assert "'bn' is registered twice: by plugin 'standard'" in clash.error
        assert normkit.parse("bn").norm.entry.plugin == "standard"
    finally:
        plugins.reload()
