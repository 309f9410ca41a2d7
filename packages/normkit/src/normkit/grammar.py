"""The spec grammar, syntax only (names are resolved against the registry in `spec.py`).

    spec := part ('+' part)*
    part := name ['(' key=value {',' key=value} ')']
    value := int | float | true | false | none | name

A `--norms` list splits on commas outside parentheses and brackets (`split_specs`). A value list
`key=[a,b,c]` is a sweep: `expand_lists` turns one spec into one spec per combination (only
`normkit compare` does that; `normkit.parse` refuses lists with a hint).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from normkit.errors import SpecError

# ASCII only: Python's \d and str.isdigit() also accept e.g. Arabic-Indic digits (int('\u0661') == 1).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*", re.ASCII)
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|nan)", re.I | re.ASCII)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


@dataclass(frozen=True)
class RawPart:
    """One `name(key=value, ...)` as typed, before the registry gives it meaning."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


def check_ascii(text: str) -> None:
    """Refuse any character outside printable ASCII, naming it and its position.

    Look-alikes (Cyrillic 'а', fullwidth 'ｂ', Arabic-Indic digits) would otherwise read as a
    different name or, through int(), as a digit nobody typed on purpose.
    """
    for i, ch in enumerate(text):
        if not (" " <= ch <= "~" or ch in "\t\n\r"):
            name = unicodedata.name(ch, "control character" if ord(ch) < 32 or ord(ch) == 127 else "?")
            raise SpecError(f"character {ch!r} (U+{ord(ch):04X} {name}) at position {i} of {text!r} is not "
                            "plain ASCII; type spec names, numbers and punctuation in ASCII")


def canonical_name(name: str) -> str:
    """Names compare case-insensitively; '_' and '-' are the same character."""
    return name.strip().lower().replace("_", "-")


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on `sep` outside parentheses and brackets; raises on unbalanced ones."""
    items, depth, current = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                raise SpecError(f"unbalanced {ch!r} in {text!r}")
        if ch == sep and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise SpecError(f"unbalanced '(' or '[' in {text!r}")
    items.append("".join(current).strip())
    return items


def split_specs(text: str) -> list[str]:
    """Split a comma list of specs, ignoring commas inside parentheses and brackets."""
    check_ascii(text)
    items = _split_top_level(text, ",")
    if any(not item for item in items):
        raise SpecError(f"empty entry in norm list {text!r}; separate specs with single commas")
    return items


def parse_value(text: str) -> Any:
    """A parameter value: int, float, true/false, none, or a bare name (kept as a string)."""
    t = text.strip()
    if t.startswith("["):
        raise SpecError(f"value list {t!r} sweeps values, which only `normkit compare --norms` expands "
                        "into one arm per value; give one value here")
    low = t.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if low == "none":
        return None
    if _INT.fullmatch(t):
        return int(t)
    if _FLOAT.fullmatch(t):
        return float(t)
    if _NAME.fullmatch(t):
        return t
    raise SpecError(f"cannot read value {text!r}; use a number, true/false, none or a name")


def parse_raw(spec: str) -> list[RawPart]:
    """Parse `spec` into parts; raises SpecError with the position of a syntax problem."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty norm spec; try 'bn' or see `normkit list`")
    check_ascii(spec)
    parts: list[RawPart] = []
    for chunk in _split_plus(spec):
        parts.append(_parse_part(chunk, spec))
    return parts


def _split_plus(spec: str) -> list[str]:
    chunks = _split_top_level(spec, "+")
    if any(not chunk for chunk in chunks):
        raise SpecError(f"empty part in {spec!r}; join parts with single '+'")
    return chunks


def _parse_part(chunk: str, spec: str) -> RawPart:
    text = chunk.strip()
    m = _NAME.match(text)
    if not m:
        raise SpecError(f"expected a norm or stage name at {text!r} in {spec!r}")
    name = m.group(0)
    rest = text[m.end() :].strip()
    params: dict[str, Any] = {}
    if rest:
        if not (rest.startswith("(") and rest.endswith(")")):
            raise SpecError(f"expected '(key=value, ...)' after {name!r} in {spec!r}, got {rest!r}")
        body = rest[1:-1].strip()
        if body:
            for item in _split_top_level(body, ","):
                if "=" not in item:
                    raise SpecError(
                        f"parameter {item.strip()!r} of {name!r} needs the form key=value"
                    )
                key, value = item.split("=", 1)
                key = key.strip().replace("-", "_")  # as in names, '-' and '_' are the same
                if not _KEY.fullmatch(key):
                    raise SpecError(f"bad parameter name {key!r} in {name!r}")
                if key.lower() in params:
                    raise SpecError(f"parameter {key!r} given twice in {name!r}")
                params[key.lower()] = parse_value(value)
    return RawPart(name, params)


def expand_lists(spec: str) -> list[str]:
    """One spec per combination of its value lists: `bnn(noise=[0,0.4])` -> `bnn(noise=0)`,
    `bnn(noise=0.4)` (a spec without lists comes back unchanged, as the only item)."""
    parts = []
    for chunk in _split_plus(spec):
        text = chunk.strip()
        m = _NAME.match(text)
        rest = text[m.end():].strip() if m else ""
        if not (m and rest.startswith("(") and rest.endswith(")")):
            parts.append([text])
            continue
        options = []
        for item in _split_top_level(rest[1:-1], ","):
            key, sep, value = item.partition("=")
            value = value.strip()
            if sep and value.startswith("[") and value.endswith("]"):
                values = [v.strip() for v in _split_top_level(value[1:-1], ",")]
                if not all(values):
                    raise SpecError(f"empty value in list {value!r} of {spec!r}; write e.g. [0,0.4,0.8]")
                options.append([f"{key.strip()}={v}" for v in values])
            else:
                options.append([item.strip()])
        parts.append([f"{m.group(0)}({', '.join(combo)})" for combo in itertools.product(*options)])
    return ["+".join(combo) for combo in itertools.product(*parts)]
