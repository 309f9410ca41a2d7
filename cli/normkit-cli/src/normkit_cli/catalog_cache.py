"""A cache of what `normkit list`, `normkit plugins` and `normkit show` print, so that browsing norms
does not import torch and every plugin (seconds) each time.

The cache is one JSON file per installed plugin set, named by a fingerprint of everything that can
change what plugins register: the Python and its sys.path, the normkit environment variables that
select plugins, and for normkit, normkit-cli, torch and every distribution with a `normkit` entry
point its name, version and entry points plus, for an editable install, the size and modification
time of every source file (for a regular install, its RECORD). Any change gives a new fingerprint,
so a stale catalog is never read; it is rebuilt by the next command (which then pays the full
load). A catalog is only written when every plugin loaded: a failure is always reported fresh.

Environment:
    NORMKIT_CACHE_DIR=DIR          where catalogs live (default $XDG_CACHE_HOME/normkit or ~/.cache/normkit)
    NORMKIT_NO_CATALOG_CACHE=1     always load the plugins (neither read nor write a catalog)

Kept free of torch and normkit imports: the point is not to load them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FORMAT = 1  # bump when the catalog's content changes shape
CACHE_DIR_ENV = "NORMKIT_CACHE_DIR"
OFF_ENV = "NORMKIT_NO_CATALOG_CACHE"
SELECTING_ENV = ("NORMKIT_DISABLED_PLUGINS", "NORMKIT_STRICT_PLUGINS")
ALWAYS = ("normkit", "normkit-cli", "torch")
SOURCE_SUFFIXES = (".py", ".toml", ".txt", ".cfg")

_fingerprint: str | None = None


def enabled() -> bool:
    """False when switched off, or when this process already loaded plugins itself (a test's
    temporary plugin, an embedding program): then the loaded registry is the truth."""
    off = os.environ.get(OFF_ENV, "").strip().lower() not in ("", "0", "false", "no")
    return not off and "normkit.plugins" not in sys.modules


def cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "normkit"


def _source_state(root: Path) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of the source files under an editable install's `src` (or root)."""
    top = root / "src" if (root / "src").is_dir() else root
    state = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "tests"))
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES):
                path = os.path.join(dirpath, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    state.append((path, st.st_size, st.st_mtime_ns))
    return state


def _distribution_state(dist: md.Distribution) -> list[Any]:
    state: list[Any] = [dist.metadata["Name"], dist.version,
                        sorted(f"{ep.group}:{ep.name}={ep.value}" for ep in dist.entry_points)]
    direct = dist.read_text("direct_url.json")
    info = json.loads(direct) if direct else {}
    if info.get("dir_info", {}).get("editable") and str(info.get("url", "")).startswith("file://"):
        state.append(_source_state(Path(info["url"].removeprefix("file://"))))
    elif dist.metadata["Name"] != "torch":  # torch: its version says enough, its RECORD is large
        state.append(hashlib.sha256((dist.read_text("RECORD") or "").encode()).hexdigest())
    return state


def fingerprint() -> str:
    """Changes whenever anything that decides what the plugins register changes."""
    global _fingerprint
    if _fingerprint is None:
        dists: dict[str, md.Distribution] = {}
        for ep in md.entry_points(group="normkit"):
            if ep.dist is not None:
                dists.setdefault(ep.dist.metadata["Name"], ep.dist)
        for name in ALWAYS:
            with contextlib.suppress(md.PackageNotFoundError):
                dists.setdefault(name, md.distribution(name))
        loose = sorted(f"{ep.name}={ep.value}" for ep in md.entry_points(group="normkit") if ep.dist is None)
        key = [FORMAT, sys.executable, sys.version, sys.path, {k: os.environ.get(k) for k in SELECTING_ENV},
               loose, [_distribution_state(dists[name]) for name in sorted(dists)]]
        _fingerprint = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    return _fingerprint


def _prefix() -> str:
    """One environment's catalogs (several virtual environments may share the cache directory)."""
    return f"catalog-{hashlib.sha256(sys.executable.encode()).hexdigest()[:12]}-"


def _path(fp: str) -> Path:
    return cache_dir() / f"{_prefix()}{fp[:32]}.json"


def read() -> dict[str, Any] | None:
    """The catalog for the installed plugins, or None (none yet, stale, unreadable, switched off)."""
    if not enabled():
        return None
    fp = fingerprint()
    try:
        data = json.loads(_path(fp).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != fp or data.get("format") != FORMAT:
        return None
    return data if _well_formed(data) else None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _entries(value: Any, keys: tuple[str, ...]) -> bool:
    """A list of objects, each with text `keys` and a list of text aliases."""
    return isinstance(value, list) and all(
        isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys) and _strings(e.get("aliases"))
        for e in value)


def _plugin(info: Any) -> bool:
    return (isinstance(info, dict) and all(isinstance(info.get(k), str) for k in ("name", "distribution", "version"))
            and _strings(info.get("registered")) and _strings(info.get("warnings"))
            and isinstance(info.get("disabled"), bool) and isinstance(info.get("error"), (str, type(None)))
            and isinstance(info.get("load_seconds"), (int, float)) and not isinstance(info["load_seconds"], bool))


def _shown(data: Any) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("title"), str) and _strings(data.get("lines"))
            and (data.get("rows") is None or (isinstance(data["rows"], list)
                                              and all(_strings(row) for row in data["rows"]))))


def _well_formed(data: dict[str, Any]) -> bool:
    """The content `list`, `plugins` and `show` read has the shape they read (a catalog that parses as
    JSON and carries the right fingerprint may still have been edited or written by other code): an
    ill-formed one is ignored like a stale one, and rebuilt."""
    listing = data.get("list")
    return (isinstance(data.get("created"), str) and isinstance(listing, dict)
            and _entries(listing.get("norms"), ("name", "kind", "plugin", "summary"))
            and _entries(listing.get("items"), ("name", "kind", "plugin", "summary"))
            and isinstance(data.get("plugins"), list) and all(map(_plugin, data["plugins"]))
            and isinstance(data.get("show"), dict) and all(map(_shown, data["show"].values())))


def write(content: dict[str, Any]) -> None:
    """Store `content` (list, plugins, show) as the catalog for the installed plugins; other
    catalogs of this environment are removed. Silently does nothing when the cache directory cannot be written.
    The caller decides with `enabled()` before it loads the plugins itself."""
    fp = fingerprint()
    data = {"format": FORMAT, "fingerprint": fp, "created": time.strftime("%Y-%m-%d %H:%M:%S"), **content}
    with contextlib.suppress(OSError):
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".catalog-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, _path(fp))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for old in directory.glob(f"{_prefix()}*.json"):
            if old != _path(fp):
                with contextlib.suppress(OSError):
                    old.unlink()
