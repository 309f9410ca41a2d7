"""Pre-registered reproductions of published findings: `normkit reproduce`.

Presets are YAML files that plugins ship and register with the `normkit_register_presets` hook
(`preset.py` reads them); `runner.py` plans and runs them with the lab's own comparison and
random-net code; `outcomes.py` reads each hypothesis's verdict from the lab's statistics.

    from normkit_lab.reproduce import available, load_preset
    [p.name for p in available()]
    preset = load_preset("proxynorm-bn-pn-equivalent")
"""

from __future__ import annotations

from normkit import plugins
from normkit_lab.reproduce.preset import Hypothesis, Preset, Scale, read_preset

__all__ = ["Hypothesis", "Preset", "Scale", "available", "load_preset"]


def load_preset(name: str) -> Preset:
    """The registered preset `name`, read and checked (a one-line ConfigError/SpecError otherwise)."""
    entry = plugins.registry().lookup_item("preset", name)
    return read_preset(entry.name, entry.meta["path"], entry.plugin)


def available() -> list[Preset]:
    """Every registered preset, read and checked, sorted by name."""
    entries = sorted({e.name: e for e in plugins.registry().presets.values()}.values(), key=lambda e: e.name)
    return [read_preset(e.name, e.meta["path"], e.plugin) for e in entries]
