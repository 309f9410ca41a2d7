"""Plugin loading: entry points in group `normkit`, one at a time, failures recorded not fatal.

Environment:
    NORMKIT_STRICT_PLUGINS=1        a plugin that fails to load raises instead of being skipped
    NORMKIT_DISABLED_PLUGINS=a,b    entry-point or distribution names to skip
    NORMKIT_PLUGIN_TIMEOUT=SECONDS  how long one plugin's import may take (default 10); a plugin
                                    still importing after that is recorded as failed and skipped

A plugin imports in a daemon thread that the loader waits on with a timeout (after
`NOTICE_SECONDS` it logs which plugin it is waiting for). Python cannot stop a thread, so a
plugin that blocks keeps its thread (and its module's import lock) for the rest of the process:
anything that later imports that module waits too (a later plugin doing so times out in turn), and
if the import ever finishes its result is ignored. The daemon thread never keeps the process alive.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import itertools
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pluggy

from normkit import hookspecs
from normkit.errors import PluginError, first_line
from normkit.registry import Registry

ENTRY_POINT_GROUP = "normkit"
TIMEOUT_ENV = "NORMKIT_PLUGIN_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 10.0
NOTICE_SECONDS = 3.0  # a plugin still importing after this is named on stderr (logging)
log = logging.getLogger("normkit.plugins")
BUILTIN_PLUGINS = ("normkit.activations",)
# normkit's own plugins load before third-party ones, so a third-party name clash rejects the
# newcomer rather than knocking out the standard norms.
FIRST_PARTY = ("normkit-standard", "normkit-normalnorm", "normkit-proxynorm", "normkit-ibnorm", "normkit-zoo",
               "normkit-whitening", "normkit-lab")
IN_PROCESS_DISTRIBUTION = "(in-process)"  # a `temporary_plugin`'s: installed by no package, so it has no version


@dataclass
class PluginInfo:
    """A plugin as `normkit plugins` shows it."""

    name: str
    distribution: str
    version: str
    registered: list[str] = field(default_factory=list)
    error: str | None = None
    disabled: bool = False  # skipped on purpose (NORMKIT_DISABLED_PLUGINS)
    load_seconds: float = 0.0  # import plus hooks, wall clock
    warnings: list[str] = field(default_factory=list)  # e.g. functions named like a hook that is not one


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


def import_timeout() -> float:
    """Seconds one plugin's import may take: NORMKIT_PLUGIN_TIMEOUT, default 10."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise PluginError(f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds; set it to e.g. 30 "
                          "or unset it for the default (10)")
    return value


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("normkit")
    pm.add_hookspecs(hookspecs)
    return pm


class _CtrlC:
    """Tells a real Ctrl-C apart from a KeyboardInterrupt a plugin raises itself.

    While plugins load (in the main thread), SIGINT goes through a handler that notes it before
    raising KeyboardInterrupt as Python's default does. A KeyboardInterrupt with no SIGINT behind it
    came from the plugin's code and is recorded like any failure; a real Ctrl-C stops the program.
    """

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, TypeError):
                if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                    self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def check(self, exc: BaseException) -> None:
        """Re-raise `exc` when it is the user's Ctrl-C (or the interpreter shutting down)."""
        if isinstance(exc, KeyboardInterrupt) and self.pressed:
            raise exc
        if isinstance(exc, GeneratorExit):
            raise exc


def _fail(state: PluginState, info: PluginInfo, error: str, exc: BaseException, started: float,
          what: str = "failed") -> None:
    info.error = f"import failed: {error}" if what == "failed to import" else error
    info.load_seconds = time.perf_counter() - started
    state.plugins.append(info)
    state.registry.failed_plugins.append(info.name)
    if strict():
        raise PluginError(f"plugin {info.name!r} ({info.distribution}) {what}: {error}") from exc


def _describe(exc: BaseException, plugin: str) -> str:
    """One line for a plugin's failure; a PluginError from `register` loses its repeated prefix."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: the plugin called sys.exit({exc.code!r})"
    if isinstance(exc, PluginError):
        return first_line(exc).removeprefix("PluginError: ").removeprefix(f"plugin {plugin!r}: ")
    return first_line(exc)


def _unknown_hooks(plugin: Any) -> list[str]:
    """Names that look like normkit hooks (normkit_...) but are not one, e.g. a misspelling."""
    names = [n for n in dir(plugin) if n.startswith("normkit_") and callable(getattr(plugin, n, None))]
    return [n for n in names if n not in hookspecs.HOOK_NAMES]


def _collect(state: PluginState, plugin: Any, info: PluginInfo, started: float | None = None,
             manager_name: str | None = None, ctrl_c: _CtrlC | None = None) -> None:
    """Run one plugin's hooks into the registry; roll back and record on failure (any exception,
    SystemExit and a KeyboardInterrupt the plugin raised itself included)."""
    started = time.perf_counter() if started is None else started
    registrars = state.registry.registrars(info.name)
    try:
        unknown = _unknown_hooks(plugin)
        if unknown:
            verb = "is not a normkit hook" if len(unknown) == 1 else "are not normkit hooks"
            message = f"{', '.join(unknown)} {verb} (hooks: {', '.join(hookspecs.HOOK_NAMES)})"
            if strict():
                raise PluginError(message)
            info.warnings.append(message)
        state.manager.register(plugin, name=manager_name or info.name)
        for hook_name, register in registrars.items():
            hook = getattr(plugin, hook_name, None)
            if hook is not None:
                hook(register=register)
    except BaseException as exc:
        (ctrl_c or _CtrlC()).check(exc)
        state.registry.remove_plugin(info.name)
        if state.manager.is_registered(plugin):
            state.manager.unregister(plugin)
        _fail(state, info, _describe(exc, info.name), exc, started)
        return
    info.registered = [e.name for e in state.registry.entries if e.plugin == info.name]
    info.load_seconds = time.perf_counter() - started
    state.plugins.append(info)


class _ImportTimedOut(Exception):
    """The loader's own timeout (a TimeoutError the plugin raises is an ordinary failure)."""


def _import_bounded(ep: md.EntryPoint, info: PluginInfo, limit: float) -> Any:
    """`ep.load()` in a daemon thread, waited on for at most `limit` seconds.

    Returns the plugin object; re-raises what the import raised; raises _ImportTimedOut when the
    import is still running after `limit` (its thread is left behind, see the module docstring).
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["plugin"] = ep.load()
        except BaseException as exc:  # noqa: BLE001 - handed to the loading thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"normkit-plugin-import:{info.name}", daemon=True)
    started = time.perf_counter()
    thread.start()
    thread.join(min(NOTICE_SECONDS, limit))
    if thread.is_alive():
        log.warning("normkit: waiting for plugin %r (%s %s) to finish importing (%.0f s so far, limit %g s, "
                    "%s)", info.name, info.distribution, info.version, time.perf_counter() - started, limit,
                    TIMEOUT_ENV)
        thread.join(max(0.0, limit - (time.perf_counter() - started)))
    if thread.is_alive():
        raise _ImportTimedOut(f"did not finish importing within {limit:g} s (still running after "
                           f"{time.perf_counter() - started:.1f} s; raise {TIMEOUT_ENV} if it is only slow)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["plugin"]


def _load() -> PluginState:
    state = PluginState(_new_manager(), Registry(), [])
    import importlib

    import normkit

    for module_name in BUILTIN_PLUGINS:
        started = time.perf_counter()
        module = importlib.import_module(module_name)
        _collect(state, module, PluginInfo(module_name, "normkit", normkit.__version__), started)
    disabled = _disabled()
    def order(ep: md.EntryPoint) -> tuple[bool, str]:
        return (ep.dist is None or ep.dist.name not in FIRST_PARTY, ep.name)

    eps = sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=order)
    limit = import_timeout()
    with _CtrlC() as ctrl_c:
        for ep in eps:
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else "?"
            if ep.name.lower() in disabled or dist.lower() in disabled:
                state.plugins.append(PluginInfo(ep.name, dist, version, disabled=True))
                continue
            info = PluginInfo(ep.name, dist, version)
            started = time.perf_counter()
            try:
                plugin = _import_bounded(ep, info, limit)
            except _ImportTimedOut as exc:
                log.warning("normkit: plugin %r (%s) %s; going on without it", info.name, dist, exc)
                _fail(state, info, str(exc), exc, started, "timed out")
                continue
            except BaseException as exc:
                ctrl_c.check(exc)
                _fail(state, info, _describe(exc, info.name), exc, started, "failed to import")
                continue
            _collect(state, plugin, info, started, ctrl_c=ctrl_c)
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


_temporary_ids = itertools.count(1)


@contextlib.contextmanager
def temporary_plugin(plugin: Any, name: str = "temporary") -> Iterator[PluginInfo]:
    """Register an in-process plugin object for the duration of a `with` block (for tests).

    Installed plugins are left alone, one with the same name included: the temporary plugin gets
    its own internal name, and on exit the registry and plugin list are restored exactly as they
    were. A name that clashes with an installed norm fails with the usual PluginError.
    """
    with _lock:
        st = state()
        reg = st.registry
        saved = (dict(reg.spec_names), dict(reg.models), dict(reg.datasets), dict(reg.presets), dict(reg.workloads),
                 list(reg.entries), list(reg.failed_plugins), list(st.plugins))
        taken = {i.name for i in st.plugins}
        label = name if name not in taken else f"{name} (temporary {next(_temporary_ids)})"
        info = PluginInfo(label, IN_PROCESS_DISTRIBUTION, "0")
        manager_name = f"normkit-temporary-{next(_temporary_ids)}"
    try:
        with _lock:
            try:
                _collect(st, plugin, info, manager_name=manager_name)
            except PluginError as exc:  # strict mode raises inside _collect: the same message either way
                raise PluginError(f"plugin {name!r} failed: {info.error or exc}") from exc
        if info.error:
            raise PluginError(f"plugin {name!r} failed: {info.error}")
        yield info
    finally:
        with _lock:
            if st.manager.has_plugin(manager_name):
                st.manager.unregister(name=manager_name)
            (reg.spec_names, reg.models, reg.datasets, reg.presets, reg.workloads, reg.entries, reg.failed_plugins,
             st.plugins[:]) = saved
