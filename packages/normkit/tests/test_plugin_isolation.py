"""Plugins are isolated and validated: anything a plugin raises (SystemExit and its own
KeyboardInterrupt included) is recorded and skipped, registration checks factories, strict mode
rejects unknown hooks, and temporary_plugin leaves installed plugins alone."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import normkit
from normkit import plugins
from normkit.stages import Partition, Pipeline, Standardize, make_step
from normkit.testing import temporary_plugin


def _install_fake_plugins(monkeypatch, tmp_path: Path, sources: dict[str, str]) -> None:
    """Write each source as a module on sys.path and expose it as an entry point in group 'normkit'."""
    real = md.entry_points
    eps = []
    for name, source in sources.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        ep = md.EntryPoint(name=name, value=name, group="normkit")

        class Dist:
            version = "1.0"

        Dist.name = f"{name}-dist"
        object.__setattr__(ep, "dist", Dist())
        eps.append(ep)
    monkeypatch.syspath_prepend(str(tmp_path))

    def entry_points(**kw):
        found = list(real(**kw))
        return [*found, *eps] if kw.get("group") == "normkit" else found

    monkeypatch.setattr(md, "entry_points", entry_points)
    for name in sources:
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv("NORMKIT_STRICT_PLUGINS", raising=False)
    plugins.reload()
    yield
    plugins.reload()


BAD_PLUGINS = {
    "nk_exit_at_import": "import sys\nsys.exit(3)\n",
    "nk_ctrl_c_at_import": "raise KeyboardInterrupt\n",
    "nk_base_exception_hook": """
        import normkit

        class Odd(BaseException):
            pass

        @normkit.hookimpl
        def normkit_register_norms(register):
            raise Odd("odd")
    """,
    "nk_exit_in_hook": """
        import sys
        import normkit

        @normkit.hookimpl
        def normkit_register_norms(register):
            sys.exit("bye")
    """,
}


def test_any_base_exception_from_a_plugin_is_recorded_and_skipped(monkeypatch, tmp_path, fresh) -> None:
    _install_fake_plugins(monkeypatch, tmp_path, BAD_PLUGINS)
    plugins.reload()
    errors = {p.name: p.error for p in plugins.plugins() if p.error}
    assert errors == {
        "nk_exit_at_import": "import failed: SystemExit: the plugin called sys.exit(3)",
        "nk_ctrl_c_at_import": "import failed: KeyboardInterrupt",
        "nk_base_exception_hook": "Odd: odd",
        "nk_exit_in_hook": "SystemExit: the plugin called sys.exit('bye')",
    }
    assert torch.isfinite(normkit.build("bn", 4)(torch.randn(3, 4))).all()
    with pytest.raises(normkit.SpecError, match="unknown norm or stage 'frnn'.*; note: plugins 'nk_.*failed to "
                                                "load \\(see `normkit plugins`\\)"):
        normkit.parse("frnn")


@pytest.mark.parametrize("name", sorted(BAD_PLUGINS))
def test_strict_mode_raises_a_plugin_error_for_each(monkeypatch, tmp_path, fresh, name: str) -> None:
    _install_fake_plugins(monkeypatch, tmp_path, {name: BAD_PLUGINS[name]})
    monkeypatch.setenv("NORMKIT_STRICT_PLUGINS", "1")
    plugins.reload()
    with pytest.raises(normkit.PluginError, match=f"plugin '{name}' \\({name}-dist\\) failed"):
        plugins.registry()


def test_a_real_ctrl_c_during_loading_still_stops_the_program(tmp_path) -> None:
    """SIGINT while a plugin imports: KeyboardInterrupt reaches the caller (not recorded)."""
    (tmp_path / "nk_slow_import.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
                                                "import time\ntime.sleep(5)\n")
    probe = textwrap.dedent(f"""
        import importlib.metadata as md, sys
        sys.path.insert(0, {str(tmp_path)!r})
        real = md.entry_points
        ep = md.EntryPoint(name="nk_slow_import", value="nk_slow_import", group="normkit")
        md.entry_points = lambda **kw: [*real(**kw), ep] if kw.get("group") == "normkit" else real(**kw)
        from normkit import plugins
        try:
            plugins.registry()
        except KeyboardInterrupt:
            print("stopped")
        else:
            print("recorded", [p.error for p in plugins.plugins() if p.error])
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NORMKIT_STRICT_PLUGINS": ""})
    assert out.stdout.strip() == "stopped", out.stdout + out.stderr
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # this process: untouched


def test_load_times_are_recorded(fresh) -> None:
    infos = plugins.plugins()
    assert all(i.load_seconds >= 0 for i in infos)
    assert any(i.load_seconds > 0 for i in infos if not i.disabled)
    assert "load_seconds" in json.loads(json.dumps([vars(i) for i in infos]))[0]


# -- registration is validated ----------------------------------------------------------------


def needs_ctx() -> Any:
    return None


def no_default(ctx, alpha: float) -> Any:
    return None


def list_hint(ctx, sizes: list[int] = (1, 2)) -> Any:  # noqa: B006
    return None


def tensor_hint(ctx, scale: torch.Tensor = None) -> Any:
    return None


def pipeline_without_default(eps) -> Pipeline:
    return Pipeline(Partition("batch"), [make_step(Standardize, eps=eps)])


class NoChannels(nn.Module):
    def __init__(self) -> None:
        super().__init__()


@pytest.mark.parametrize(("hook", "args", "message"), [
    ("stages", ("s1", needs_ctx), "stage 's1' \\(.*needs_ctx\\): takes 0 positional argument\\(s\\) but normkit "
                                  "passes 1 first"),
    ("stages", ("s2", no_default), "stage 's2' \\(.*no_default\\): parameter 'alpha' needs a default value"),
    ("stages", ("s3", list_hint), "stage 's3' \\(.*list_hint\\): parameter 'sizes' has type list, which a spec "
                                  "cannot give"),
    ("stages", ("s4", tensor_hint), "stage 's4' .*: parameter 'scale' has type Tensor"),
    ("stages", ("s5", 42), "stage 's5': expected a function or class, got int"),
    ("norms", ("n1",), "norm 'n1' needs exactly one of pipeline=, compose= or factory="),
    ("norms", ("n2", "pipeline", pipeline_without_default), "norm 'n2' \\(.*pipeline_without_default\\): parameter "
                                                             "'eps' needs a default value"),
    ("norms", ("n3", "factory", NoChannels), "norm 'n3' \\(.*NoChannels\\): takes 0 positional argument"),
    ("norms", ("", "compose", "bn"), "a norm registered with name ''; names are non-empty strings"),
])
def test_registration_errors_name_plugin_and_item_without_addresses(hook: str, args: tuple, message: str) -> None:
    class Bad:
        pass

    def register_it(register):
        if hook == "norms" and len(args) == 3:
            register(args[0], **{args[1]: args[2]})
        else:
            register(*args)

    setattr(Bad, f"normkit_register_{hook}", staticmethod(normkit.hookimpl(register_it)))
    with pytest.raises(normkit.PluginError, match="plugin 'bad' failed: " + message) as info:
        with temporary_plugin(Bad(), "bad"):
            pass
    assert " at 0x" not in str(info.value) and "\n" not in str(info.value)


class FactoryWithChannelDim(nn.Module):
    def __init__(self, num_channels: int, channel_dim: int = 1, scale: float = 2.0) -> None:
        super().__init__()
        self.channel_dim, self.scale = channel_dim, scale

    def forward(self, x):
        return x * self.scale


class NotAModule:
    def __init__(self, num_channels: int) -> None:
        pass


class Factories:
    @normkit.hookimpl
    def normkit_register_norms(self, register: normkit.RegisterNorm) -> None:
        register("with-cdim", factory=FactoryWithChannelDim)
        register("not-a-module", factory=NotAModule)


def test_channel_dim_of_a_factory_norm_is_a_build_argument_not_a_spec_parameter() -> None:
    with temporary_plugin(Factories(), "factories"):
        entry = next(e for e in normkit.available() if e["name"] == "with-cdim")
        assert entry["parameters"] == {"scale": {"type": "float", "default": 2.0}}
        assert normkit.build("with-cdim", 4, channel_dim=-1).channel_dim == -1
        with pytest.raises(normkit.SpecError, match="unknown parameter 'channel_dim' for 'with-cdim'"):
            normkit.build("with-cdim(channel_dim=-1)", 4)
        with pytest.raises(normkit.PluginError, match="plugin 'factories': norm 'not-a-module' \\(factory=\\) "
                                                      "returned NotAModule, not a torch nn.Module"):
            normkit.build("not-a-module", 4)


# -- strict mode and unknown hook names -------------------------------------------------------


class Misspelled:
    @normkit.hookimpl
    def normkit_register_norm(self, register):  # missing 's': not a normkit hook
        register("never", compose="bn")


def test_misspelled_hooks_are_a_warning_and_strict_mode_rejects_them(monkeypatch) -> None:
    monkeypatch.delenv("NORMKIT_STRICT_PLUGINS", raising=False)
    with temporary_plugin(Misspelled(), "misspelled") as info:
        assert info.warnings == ["normkit_register_norm is not a normkit hook (hooks: normkit_register_norms, "
                                 "normkit_register_stages, normkit_register_models, normkit_register_datasets, "
                                 "normkit_register_presets, normkit_register_workloads)"]
    monkeypatch.setenv("NORMKIT_STRICT_PLUGINS", "1")
    with pytest.raises(normkit.PluginError, match="normkit_register_norm is not a normkit hook"):
        with temporary_plugin(Misspelled(), "misspelled"):
            pass


# -- temporary_plugin -------------------------------------------------------------------------


def _snapshot() -> tuple:
    reg = plugins.registry()
    return (dict(reg.spec_names), dict(reg.models), dict(reg.datasets), list(reg.entries),
            [(p.name, p.error) for p in plugins.plugins()], plugins.state().manager.list_name_plugin())


def pipeline_ln() -> Pipeline:
    return Pipeline(Partition("layer"), [make_step(Standardize)])


class SameNameAsInstalled:
    @normkit.hookimpl
    def normkit_register_norms(self, register):
        register("ln-again", pipeline=pipeline_ln)


def test_temporary_plugin_with_an_installed_plugins_name_leaves_it_alone() -> None:
    before = _snapshot()
    with temporary_plugin(SameNameAsInstalled(), "standard") as info:
        assert info.name != "standard" and info.name.startswith("standard (temporary")
        assert normkit.build("ln-again", 4) is not None and normkit.build("bn", 4) is not None
    assert _snapshot() == before
    assert normkit.parse("bn").norm.entry.plugin == "standard"
    with pytest.raises(normkit.SpecError):
        normkit.parse("ln-again")


def test_temporary_plugin_restores_state_after_a_failure_and_an_exception() -> None:
    before = _snapshot()

    class Clash:
        @normkit.hookimpl
        def normkit_register_norms(self, register):
            register("fresh-name", pipeline=pipeline_ln)
            register("bn", pipeline=pipeline_ln)

    with pytest.raises(normkit.PluginError, match="registered twice"):
        with temporary_plugin(Clash(), "clash"):
            pass
    assert _snapshot() == before
    with pytest.raises(RuntimeError, match="inside"):
        with temporary_plugin(SameNameAsInstalled(), "ok"):
            raise RuntimeError("inside")
    assert _snapshot() == before
