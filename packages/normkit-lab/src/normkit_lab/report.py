"""Views of results directories: the per-norm summary and plots, for one directory or several merged.

Directories merge when their configurations agree on everything that changes what a run computes
(model, dataset, epochs, optimizer, ...); they may differ in norms, seeds and runtime keys such as
the device. The same (norm, seed) in two directories is an error: it would count one seed twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from normkit_lab import plots
from normkit_lab.config import RUNTIME_KEYS
from normkit_lab.diagnostics.report import write_report as write_diagnostics
from normkit_lab.errors import ConfigError
from normkit_lab.plan import RunId
from normkit_lab.results import ENVIRONMENT_FILE, ResultsDir
from normkit_lab.summary import NormSummary, summarize, summary_rows
from normkit_lab.training import RunResult

# Keys that may differ between merged directories besides the runtime ones.
_MERGE_FREE = RUNTIME_KEYS | {"norms", "seeds", "baseline"}


@dataclass
class Results:
    """Runs of one or more directories, with the config they share."""

    config: dict[str, Any]
    runs: list[RunResult]
    norms: list[str]
    baseline: str
    sources: list[Path] = field(default_factory=list)

    def summaries(self) -> list[NormSummary]:
        return summarize(self.runs, self.norms, self.baseline)


def read_config(store: ResultsDir) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(store.config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {str(store.config_path)!r}: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("norms"), list):
        raise ConfigError(f"{str(store.config_path)!r} is not a config written by `normkit compare`")
    return raw


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    keys = sorted((set(a) | set(b)) - _MERGE_FREE)
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]


def load_results(dirs: Sequence[str | Path], baseline: str | None = None) -> Results:
    """Load and merge results directories; refuse different configs and duplicate runs (same identity)."""
    if not dirs:
        raise ConfigError("give at least one results directory")
    stores = [ResultsDir.open(d) for d in dirs]
    if len({s.path.resolve() for s in stores}) != len(stores):
        raise ConfigError("the same results directory is given twice")
    configs = [read_config(s) for s in stores]
    first = configs[0]
    norms: list[str] = []
    runs: list[RunResult] = []
    seen: dict[RunId, Path] = {}
    for store, cfg in zip(stores, configs, strict=True):
        diff = _differences(first, cfg)
        if diff:
            raise ConfigError(f"cannot merge {str(store.path)!r} with {str(stores[0].path)!r}: their configs "
                              f"differ ({'; '.join(diff)}); merge only runs of the same configuration")
        norms += [n for n in cfg["norms"] if n not in norms]
        for run in (r for r in store.runs() if r.phase == "compare"):  # tuning runs are in tuning.json
            key = RunId.of_run(run)
            if key in seen:
                raise ConfigError(f"{run.norm} seed {run.seed} is in both {str(seen[key])!r} and "
                                  f"{str(store.path)!r}; merge directories that ran different seeds or norms")
            seen[key] = store.path
            runs.append(run)
    chosen = baseline or first.get("baseline") or first["norms"][0]
    if chosen not in norms:
        raise ConfigError(f"baseline {chosen!r} is not among the norms of these results ({', '.join(norms)})")
    return Results(config=first, runs=runs, norms=norms, baseline=chosen, sources=[s.path for s in stores])


def write_summary(store: ResultsDir, results: Results) -> list[NormSummary]:
    """Rewrite summary.csv/json of `store` from `results`."""
    summaries = results.summaries()
    store.write_summary(summary_rows(summaries, results.baseline))
    return summaries


def write_plots(store: ResultsDir, results: Results) -> list[Path] | None:
    """The PNG plots, or None when matplotlib is not installed (see plots.PLOTS_HINT).

    Runs made with --diagnostics also get diagnostics.json/.md (always) and their figures.
    """
    diagnostics_files = write_diagnostics(store.path, results.runs, results.norms)
    if not plots.available():
        return None
    return [*plots.write_plots(store.path, results.runs, results.norms),
            *(p for p in diagnostics_files if p.suffix == ".png")]


def merge_into(results: Results, out: str | Path | None) -> ResultsDir:
    """A new results directory holding the merged config and runs, and each source's environment."""
    environments = {}
    for source in results.sources:
        env_path = source / ENVIRONMENT_FILE
        env = json.loads(env_path.read_text(encoding="utf-8")) if env_path.is_file() else None
        environments[str(source)] = env
    config = {**results.config, "norms": results.norms, "baseline": results.baseline,
              "seeds": sorted({r.seed for r in results.runs})}
    store = ResultsDir.create(out, yaml.safe_dump(config, sort_keys=False), {"merged_from": environments},
                              kind="report")
    for source in results.sources:
        store.append_rows(ResultsDir.open(source).rows())
    return store
