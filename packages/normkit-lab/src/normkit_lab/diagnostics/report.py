"""Writing a comparison's diagnostics: diagnostics.json, diagnostics.md and the PNG figures.

    write_report(out_dir, runs)   # after `normkit compare --diagnostics` (runs carry extras["diagnostics"])
    render(out_dir)               # re-render the tables and figures from diagnostics.json
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from normkit_lab.diagnostics import figures
from normkit_lab.diagnostics.aggregate import aggregate
from normkit_lab.diagnostics.tables import markdown
from normkit_lab.errors import ConfigError
from normkit_lab.store.results import atomic_write_text, json_text

DIAGNOSTICS_JSON = "diagnostics.json"
DIAGNOSTICS_MD = "diagnostics.md"
EXTRAS_KEY = "diagnostics"


def has_diagnostics(runs: Sequence[Any]) -> bool:
    """True when any run carries diagnostics (a comparison run with --diagnostics)."""
    return any(EXTRAS_KEY in (run.extras or {}) for run in runs)


def collect(runs: Sequence[Any], norms: Sequence[str] | None = None) -> dict[str, Any]:
    """Average the diagnostics extras of `runs` (RunResults) per norm, in `norms` order when given."""
    by_norm: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for run in runs:
        extras = (run.extras or {}).get(EXTRAS_KEY)
        if extras:
            by_norm.setdefault(run.norm, []).append((run.seed, extras))
    order = [n for n in norms or [] if n in by_norm] + [n for n in by_norm if n not in (norms or [])]
    return aggregate({n: by_norm[n] for n in order})


def write_report(out_dir: str | Path, runs: Sequence[Any], norms: Sequence[str] | None = None) -> list[Path]:
    """Write diagnostics.json, diagnostics.md and the PNGs (when matplotlib is installed) into `out_dir`.

    Returns the written paths; an empty list when no run carries diagnostics.
    """
    out = Path(out_dir)
    if not has_diagnostics(runs):
        return []
    atomic_write_text(out / DIAGNOSTICS_JSON, json_text(collect(runs, norms)))
    return [out / DIAGNOSTICS_JSON, *render(out)]


def load(out_dir: str | Path) -> dict[str, Any]:
    """The aggregated diagnostics saved in a results directory."""
    path = Path(out_dir) / DIAGNOSTICS_JSON
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} not found; run `normkit compare --diagnostics` to produce it")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("norms"), dict):
        raise ConfigError(f"{str(path)!r} is not a diagnostics file written by normkit")
    return data


def render(out_dir: str | Path) -> list[Path]:
    """(Re)write diagnostics.md and the figures from diagnostics.json; returns the written paths."""
    out = Path(out_dir)
    diag = load(out)
    atomic_write_text(out / DIAGNOSTICS_MD, markdown(diag))
    written = [out / DIAGNOSTICS_MD]
    if figures.available():
        norms = diag["norms"]
        for make, name in ((figures.normality_figure, "diagnostics_normality.png"),
                           (figures.power_figure, "diagnostics_power.png"),
                           (figures.lambda_figure, "diagnostics_lambda.png"),
                           (figures.noise_figure, "diagnostics_noise.png")):
            path = make(norms, out / name)
            if path is not None:
                written.append(path)
    return written
