"""Parameter declarations read from factory signatures, and typing of spec values.

A plugin declares parameters the Pythonic way, as keyword arguments with type hints and
defaults; normkit reads them so `gn(groups=8)` is typed, checked and listed without a
separate schema.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union

from normkit.errors import PluginError, SpecError

_SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class Param:
    """One declared parameter of a norm or stage."""

    name: str
    type: Any
    default: Any
    help: str = ""

    @property
    def type_name(self) -> str:
        return _type_name(self.type)

    def coerce(self, value: Any, owner: str) -> Any:
        """Convert a parsed spec value (or a Python value) to this parameter's type.

        A float that is NaN or infinite is refused for every parameter: no norm, stage, model
        or dataset setting means anything at inf or nan, and `eps <= 0` style checks let NaN through.
        """
        if _non_finite(value):
            raise SpecError(f"{owner}: parameter {self.name!r} must be a finite number, got {value!r}")
        ok, result = _coerce(value, self.type)
        if not ok:
            raise SpecError(
                f"{owner}: parameter {self.name!r} expects {self.type_name}, got {value!r}"
            )
        if _non_finite(result):
            raise SpecError(f"{owner}: parameter {self.name!r} must be a finite number, got {value!r}")
        return result


def _non_finite(value: Any) -> bool:
    """True for float (or numpy/torch scalar) NaN and +-inf; False for everything else."""
    if isinstance(value, bool) or isinstance(value, (str, type(None))):
        return False
    if isinstance(value, int):
        return False
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return False


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if tp is Any or tp is inspect.Parameter.empty:
        return True, value
    if origin is Literal:
        for choice in typing.get_args(tp):
            if isinstance(value, str) and isinstance(choice, str):
                if value.lower() == choice.lower():
                    return True, choice
            elif value == choice and type(value) is type(choice):
                return True, choice
        return False, None
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        # Try exact-type members first so 3 stays an int in `int | float`.
        for arg in sorted(args, key=lambda a: 0 if type(value) is a else 1):
            ok, result = _coerce(value, arg)
            if ok:
                return True, result
        return False, None
    if tp is type(None) or tp is None:
        return (value is None), None
    if tp is bool:
        return (isinstance(value, bool)), value
    if tp is int:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return False, None
    if tp is float:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, (int, float)):
            return True, float(value)
        return False, None
    if tp is str:
        return (isinstance(value, str)), value
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return True, value


def describe_callable(fn: Any) -> str:
    """`module.qualname` of a function or class, never its repr (no memory addresses in messages)."""
    target = getattr(fn, "func", fn)  # functools.partial
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    return f"{module}.{name}" if module else str(name)


def supported_type(tp: Any) -> bool:
    """Types a spec value can be coerced to: bool, int, float, str, None, Any, Literal of those,
    and unions of these (`float | None`)."""
    if tp is Any or tp is inspect.Parameter.empty or tp is type(None) or tp is None or tp in _SCALARS:
        return True
    origin = typing.get_origin(tp)
    if origin is Literal:
        return all(isinstance(a, (*_SCALARS, type(None))) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return all(supported_type(a) for a in typing.get_args(tp))
    return False


def signature_params(fn: Callable[..., Any], skip: int = 0, owner: str = "") -> tuple[Param, ...]:
    """Declared parameters of `fn`: its keyword arguments after the first `skip` positionals.

    Every parameter must have a default (that is what a bare `gn` uses) and a type a spec value
    can take (see `supported_type`). The type comes from the annotation, or from the default's type
    when there is none. Problems raise PluginError naming `owner` (plugin and registered name).
    """
    where = f"{owner} ({describe_callable(fn)})" if owner else describe_callable(fn)
    if not callable(fn):
        raise PluginError(f"{owner or 'register'}: expected a function or class, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise PluginError(f"{where}: cannot read its signature ({err})") from None
    try:
        hints = typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else getattr(fn, "func", fn))
    except Exception as err:
        raise PluginError(f"{where}: cannot resolve its type hints ({type(err).__name__}: {err}); "
                          "import the names its annotations use at module level") from None
    items = list(sig.parameters.items())
    positional = [p for _, p in items if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for _, p in items)
    if skip and len(positional) < skip and not has_varargs:
        raise PluginError(f"{where}: takes {len(positional)} positional argument(s) but normkit passes "
                          f"{skip} first (e.g. `ctx` for a stage factory, `num_channels` for factory=)")
    params = []
    for i, (name, p) in enumerate(items):
        if i < skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            raise PluginError(f"{where}: parameter {name!r} needs a default value (what a bare spec uses)")
        tp = hints.get(name)
        if tp is None:
            tp = type(p.default) if p.default is not None else Any
        if not supported_type(tp):
            raise PluginError(f"{where}: parameter {name!r} has type {_type_name(tp)}, which a spec cannot "
                              "give; use bool, int, float, str, a Literal, or an optional of these")
        params.append(Param(name, tp, p.default))
    return tuple(params)
