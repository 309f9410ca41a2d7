"""Resolve spec strings against the registry: expand aliases, type parameters, check compositions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from normkit import plugins
from normkit.errors import SpecError, did_you_mean
from normkit.grammar import RawPart, parse_raw
from normkit.params import Param
from normkit.registry import Entry, Registry


@dataclass(frozen=True)
class Part:
    """One resolved part: the registry entry and the parameters given explicitly (typed)."""

    entry: Entry
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.entry.name

    def __str__(self) -> str:
        if not self.params:
            return self.name
        args = ",".join(f"{k}={_fmt(v)}" for k, v in self.params.items())
        return f"{self.name}({args})"


def _fmt(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


@dataclass(frozen=True)
class Spec:
    """A validated spec: `text` as the user wrote it (canonical case), `parts` after expansion."""

    text: str
    parts: tuple[Part, ...]

    @property
    def norm(self) -> Part:
        return self.parts[0]

    @property
    def stages(self) -> tuple[Part, ...]:
        return self.parts[1:]

    def expanded(self) -> str:
        return "+".join(str(p) for p in self.parts)

    def __str__(self) -> str:
        return self.text


def params_of(entry: Entry, reg: Registry) -> tuple[Param, ...]:
    """Declared parameters; a composition's are the union of its parts' (first declaration wins)."""
    if entry.compose is None:
        return entry.params
    seen: dict[str, Param] = {}
    for raw in parse_raw(entry.compose):
        for p in params_of(reg.lookup(raw.name), reg):
            seen.setdefault(p.name, p)
    return tuple(seen.values())


def _expand(raw: RawPart, reg: Registry, depth: int = 0) -> list[tuple[Entry, dict[str, Any]]]:
    """Expand aliases of compositions, routing each given parameter to the parts declaring it."""
    entry = reg.lookup(raw.name)
    if entry.compose is None:
        return [(entry, dict(raw.params))]
    if depth > 8:
        raise SpecError(f"composition {entry.name!r} expands into itself")
    expanded: list[tuple[Entry, dict[str, Any]]] = []
    for sub in parse_raw(entry.compose):
        expanded.extend(_expand(sub, reg, depth + 1))
    for key, value in raw.params.items():
        route(key, value, expanded, f"{entry.name!r} (= {entry.compose})")
    return expanded


def route(key: str, value: Any, parts: list[tuple[Entry, dict[str, Any]]], owner: str) -> None:
    """Give `value` (typed) to every part that declares `key` and has no value for it yet.

    One rule for alias parameters (`bnn(noise=0.6)`) and build overrides; SpecError when no part
    declares the key.
    """
    targets = [(e, params) for e, params in parts if key in {p.name for p in e.params}]
    if not targets:
        valid = sorted({p.name for e, _ in parts for p in e.params})
        raise SpecError(f"unknown parameter {key!r} for {owner}{did_you_mean(key, valid)}; "
                        f"valid: {', '.join(valid) or 'none'}")
    for e, params in targets:
        if key not in params:
            where = e.name if owner == repr(e.name) else f"{e.name} in {owner}"
            params[key] = {p.name: p for p in e.params}[key].coerce(value, where)


def _typed(entry: Entry, params: dict[str, Any]) -> dict[str, Any]:
    declared = {p.name: p for p in entry.params}
    out = {}
    for key, value in params.items():
        if key not in declared:
            valid = ", ".join(declared) or "none"
            raise SpecError(
                f"unknown parameter {key!r} for {entry.name!r}{did_you_mean(key, declared)}; valid: {valid}"
            )
        out[key] = declared[key].coerce(value, entry.name)
    return out


def parse(spec: str | Spec, registry: Registry | None = None) -> Spec:
    """Parse and validate a spec such as `gn(groups=8)+pn`; raises SpecError with a hint."""
    if isinstance(spec, Spec):
        return spec
    reg = registry or plugins.registry()
    raws = parse_raw(spec)
    parts: list[Part] = []
    for raw in raws:
        for entry, params in _expand(raw, reg):
            parts.append(Part(entry, _typed(entry, params)))
    text = "+".join(str(_as_typed(r, reg)) for r in raws)
    _check_composition(parts, text)
    return Spec(text, tuple(_with_stage_defaults(parts)))


def _with_stage_defaults(parts: list[Part]) -> list[Part]:
    """Fill the norm's parameters that a later stage declares defaults for (`partition_defaults`,
    e.g. pn: few groups) where the user did not set them; the spec text stays as written."""
    head, declared = parts[0], {p.name: p for p in parts[0].entry.params}
    extra = {}
    for part in parts[1:]:
        for key, value in part.entry.meta.get("partition_defaults", {}).items():
            if key in declared and key not in head.params and key not in extra:
                extra[key] = declared[key].coerce(value, head.name)
    return [Part(head.entry, {**head.params, **extra}), *parts[1:]] if extra else parts


def _as_typed(raw: RawPart, reg: Registry) -> Part:
    """A part as written, with values in their declared types (so gn(groups=8.0) reads gn(groups=8))."""
    entry = reg.lookup(raw.name)
    declared = {p.name: p for p in params_of(entry, reg)}
    return Part(entry, {k: declared[k].coerce(v, entry.name) for k, v in raw.params.items()})


def _check_composition(parts: list[Part], text: str) -> None:
    head = parts[0]
    if head.entry.kind != "norm":
        raise SpecError(
            f"{text!r} starts with {head.entry.kind} {head.name!r}; a spec starts with a norm, "
            f"e.g. 'bn+{head.name}' or 'gn+{head.name}'"
        )
    norms = [p.name for p in parts if p.entry.kind == "norm"]
    if len(norms) > 1:
        raise SpecError(
            f"{text!r} names {len(norms)} norms ({', '.join(norms)}), i.e. two partitions; "
            "a spec has one norm followed by '+' stages such as nn, pn or relu"
        )
    if head.entry.factory is not None and len(parts) > 1:
        raise SpecError(f"{head.name!r} is a ready-made module and takes no '+' stages")
    steps = [p.name for p in parts[1:] if p.entry.kind == "step"]
    if steps and getattr(head.entry.make_pipeline(head.params), "core", 0) is None:
        raise SpecError(f"{text!r}: {head.name!r} has no normalizing step to place {steps[0]!r} next to")
    seen_activation = seen_post = None
    for part in parts[1:]:
        kind = part.entry.kind
        if kind == "step" and (seen_activation or seen_post):
            raise SpecError(f"{text!r}: step {part.name!r} must come before the activation")
        if kind == "activation":
            if seen_activation:
                raise SpecError(f"{text!r} has two activations ({seen_activation}, {part.name})")
            if seen_post:
                raise SpecError(f"{text!r}: activation {part.name!r} must come before {seen_post!r}")
            seen_activation = part.name
        if kind == "post_activation":
            if seen_post:
                raise SpecError(f"{text!r} has two post-activation steps ({seen_post}, {part.name})")
            seen_post = part.name

