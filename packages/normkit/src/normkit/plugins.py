"""Plugin loading: entry points in group `normkit`, one at a time, failures recorded not fatal.

Environment:
    NORMKIT_STRICT_PLUGINS=1        a plugin that fails to load raises instead of being skipped
    NORMKIT_DISABLED_PLUGINS=a,b    entry-point or distribution names to skip
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pluggy

from normkit import hookspecs
from normkit.errors import PluginError
from normkit.registry import Registry

ENTRY_POINT_GROUP = "normkit"
BUILTIN_PLUGINS = ("normkit.activations",)
# normkit's own plugins load before third-party ones, so a third-party name clash rejects the
# newcomer rather than knocking out the standard norms.
FIRST_PARTY = ("normkit-standard", "normkit-normalnorm", "normkit-proxynorm", "normkit-ibnorm", "normkit-zoo",
               "normkit-whitening", "normkit-lab")


@dataclass
class PluginInfo:
    """A plugin as `normkit plugins` shows it."""

    name: str
    distribution: str
    version: str
    registered: list[str] = field(default_factory=list)
    error: str | None = None
    disabled: bool = False  # skipped on purpose (NORMKIT_DISABLED_PLUGINS)


@dataclass
class PluginState:
    manager: pluggy.PluginManager
    registry: Registry
    plugins: list[PluginInfo]


_state: PluginState | None = None
_lock = threading.RLock()


def strict() -> bool:
    return os.environ.get("NORMKIT_STRICT_PLUGINS", "").strip().lower() in ("1", "true", "yes")


def _disabled() -> set[str]:
    raw = os.environ.get("NORMKIT_DISABLED_PLUGINS", "")
    return {x.strip().lower() for x in raw.split(",") if x.strip()}


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("normkit")
    pm.add_hookspecs(hookspecs)
    return pm


def _collect(state: PluginState, plugin: Any, info: PluginInfo) -> None:
    """Run one plugin's hooks into the registry; roll back and record on failure."""
    registrars = state.registry.registrars(info.name)
    try:
        state.manager.register(plugin, name=info.name)
        for hook_name, register in registrars.items():
            hook = getattr(plugin, hook_name, None)
            if hook is not None:
                hook(register=register)
    except Exception as exc:
        state.registry.remove_plugin(info.name)
        if state.manager.is_registered(plugin):
            state.manager.unregister(plugin)
        info.error = f"{type(exc).__name__}: {exc}"
        state.plugins.append(info)
        if strict():
            raise PluginError(f"plugin {info.name!r} failed: {info.error}") from exc
        return
    info.registered = [e.name for e in state.registry.entries if e.plugin == info.name]
    state.plugins.append(info)


def _load() -> PluginState:
    state = PluginState(_new_manager(), Registry(), [])
    import importlib

    import normkit

    for module_name in BUILTIN_PLUGINS:
        module = importlib.import_module(module_name)
        _collect(state, module, PluginInfo(module_name, "normkit", normkit.__version__))
    disabled = _disabled()
    def order(ep: md.EntryPoint) -> tuple[bool, str]:
        return (ep.dist is None or ep.dist.name not in FIRST_PARTY, ep.name)

    eps = sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=order)
    for ep in eps:
        dist = ep.dist.name if ep.dist else "?"
        version = ep.dist.version if ep.dist else "?"
        if ep.name.lower() in disabled or dist.lower() in disabled:
            state.plugins.append(PluginInfo(ep.name, dist, version, disabled=True))
            continue
        info = PluginInfo(ep.name, dist, version)
        try:
            plugin = ep.load()
        except Exception as exc:
            info.error = f"import failed: {type(exc).__name__}: {exc}"
            state.plugins.append(info)
            if strict():
                raise PluginError(f"plugin {ep.name!r} ({dist}) failed to import: {exc}") from exc
            continue
        _collect(state, plugin, info)
    return state


def state() -> PluginState:
    """The loaded plugins and registry (loaded once, on first use)."""
    global _state
    with _lock:
        if _state is None:
            _state = _load()
        return _state


def registry() -> Registry:
    return state().registry


def plugins() -> list[PluginInfo]:
    return state().plugins


def reload() -> None:
    """Forget loaded plugins; the next lookup loads them again (tests, after installs)."""
    global _state
    with _lock:
        _state = None


@contextlib.contextmanager
def temporary_plugin(plugin: Any, name: str = "temporary") -> Iterator[PluginInfo]:
    """Register an in-process plugin object for the duration of a `with` block (for tests)."""
    st = state()
    info = PluginInfo(name, "(in-process)", "0")
    _collect(st, plugin, info)
    try:
        if info.error:
            raise PluginError(f"plugin {name!r} failed: {info.error}")
        yield info
    finally:
        st.registry.remove_plugin(name)
        if st.manager.has_plugin(name):
            st.manager.unregister(name=name)
        if info in st.plugins:
            st.plugins.remove(info)
