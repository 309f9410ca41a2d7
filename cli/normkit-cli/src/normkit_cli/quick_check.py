"""A misspelled norm answered before torch and the plugins are imported (seconds; a minute on a busy
machine): each name in `--norms` is looked up in the plugin catalog that `normkit list`, or a `compare`
that found none, caches (`catalog_cache`, current only while the installed plugins are unchanged and
all of them loaded).

Only a name that is certainly unknown is refused here, with the line the registry itself gives; every
other spec, and every spec when there is no current catalog, goes on to the full parser.
Kept free of torch and normkit imports: the point is not to load them.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

_NAME = re.compile(r"\s*([A-Za-z][A-Za-z0-9_.\-]*)\s*(\(.*\))?\s*", re.DOTALL)


def _top_level(text: str, sep: str) -> list[str] | None:
    """`text` split on `sep` outside brackets (None when they do not balance: the full parser says why)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "([{"
        depth -= char in ")]}"
        if depth < 0:
            return None
        if char == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return None if depth else [*parts, text[start:]]


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-")  # as normkit.grammar.canonical_name


def unknown_norm(norms: str, catalog: dict[str, Any]) -> str | None:
    """The error line for the first name in `norms` (e.g. "bn,gnn2+pn") that the cached `catalog`
    (`catalog_cache.read()`) does not know; None when all are known or a spec is not plain enough to
    read here."""
    known: set[str] = set()
    for entry in catalog["list"]["norms"]:
        known.update(_canonical(n) for n in (entry["name"], *entry.get("aliases", ())))
    for spec in _top_level(norms, ",") or []:
        for stage in _top_level(spec, "+") or []:
            match = _NAME.fullmatch(stage)
            if match is None:
                return None
            name = match.group(1)
            if _canonical(name) not in known:
                close = difflib.get_close_matches(_canonical(name), sorted(known), n=3, cutoff=0.5)
                hint = "; did you mean " + " or ".join(repr(m) for m in close) + "?" if close else ""
                return f"unknown norm or stage {name!r}{hint} (see `normkit list`)"
    return None
