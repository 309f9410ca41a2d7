"""What a comparison runs: the tuning and comparison plans, and the values tuning chooses.

Each run of a plan is a `RunId` (`normkit_lab.records`: norm, seed, phase, cell and tuned values);
`RunId.key()` is the one identity used everywhere: resume skips the identities already in
runs.jsonl, and a results store can be keyed by it.

    tune_plan(cfg)                  # every (cell, tune seed, norm, candidate): phase "tune"
    chosen = choose(cfg, runs)      # per (cell, norm): the candidate with the best val metric
    compare_plan(cfg, chosen)       # every (cell, seed, norm) at its chosen values: phase "compare"

Nothing here reads a test metric: selection and tuning see validation only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from normkit_lab.records import RunId, RunResult, frozen
from normkit_lab.runs.builtin import val_accuracy_score
from normkit_lab.spec import CompareConfig, grid

if TYPE_CHECKING:
    from collections.abc import Callable

    Score = Callable[[CompareConfig, RunResult | None, RunId], float]


def tune_plan(cfg: CompareConfig) -> list[RunId]:
    """The tuning runs: each cell, tune seed, norm and candidate (none without `tune`)."""
    if not cfg.tune:
        return []
    return [RunId.of(norm, seed, "tune", cell, candidate) for cell in grid(cfg.sweep)
            for seed in cfg.tune_seeds for norm in cfg.arms for candidate in grid(cfg.tune)]


def compare_plan(cfg: CompareConfig, chosen: dict[tuple[Any, str], dict[str, Any]] | None = None, *,
                 seeds: int | None = None, arms: Callable[[dict[str, Any]], list[str]] | None = None) -> list[RunId]:
    """The comparison runs, seed-major within each cell so an interruption keeps full pairs.

    `chosen` maps (frozen cell, norm) to the tuned values (from `choose`); required with `tune`.
    Sequential seeds (study/rounds.py) list one look's runs: `seeds` the first N seeds, `arms(cell)` the
    arms that still run in a cell (default every arm).
    """
    if cfg.tune and chosen is None:
        raise ValueError("compare_plan needs the values chosen by tuning")
    chosen = chosen or {}
    return [RunId.of(norm, seed, "compare", cell, chosen.get((frozen(cell), norm)))
            for cell in grid(cfg.sweep) for seed in cfg.seeds[:seeds]
            for norm in (cfg.arms if arms is None else arms(cell))]


def run_count(cfg: CompareConfig) -> tuple[int, int]:
    """(tuning runs, comparison runs): the cost, known before anything runs."""
    return len(tune_plan(cfg)), len(grid(cfg.sweep)) * len(cfg.seeds) * len(cfg.arms)


def choose(cfg: CompareConfig, runs: list[RunResult], score: Score | None = None,
           column: tuple[str, float] | None = None) -> tuple[dict[tuple[Any, str], dict[str, Any]],
                                                              list[dict[str, Any]]]:
    """Per (cell, norm), the candidate with the best mean val accuracy over the tune seeds (`score`:
    a trainer's own validation score of a run, higher is better; default the built-in one; `column`:
    then the table's (field name, sign that turns the score back into that field's value)).

    Returns (chosen, table): `chosen[(frozen cell, norm)]` = values; `table` one row per cell,
    norm and candidate with the mean val accuracy, its runs and whether it was chosen (the
    tuning.json content). A candidate with a diverged tuning run scores -inf (null in JSON).
    """
    by_id = {RunId.of_run(r): r for r in runs if r.phase == "tune"}
    chosen: dict[tuple[Any, str], dict[str, Any]] = {}
    table: list[dict[str, Any]] = []
    for cell in grid(cfg.sweep):
        for norm in cfg.arms:
            rows = []
            for candidate in grid(cfg.tune):
                ids = [RunId.of(norm, seed, "tune", cell, candidate) for seed in cfg.tune_seeds]
                scores = [(score or val_accuracy_score)(cfg, by_id.get(run_id), run_id) for run_id in ids]
                mean = sum(scores) / len(scores)
                row = {"cell": cell, "norm": norm, "values": candidate, "val_acc": mean,
                       "seeds": list(cfg.tune_seeds), "chosen": False}
                if column is not None:
                    row = {"cell": cell, "norm": norm, "values": candidate, "score_field": column[0],
                           column[0]: column[1] * mean if math.isfinite(mean) else None, "score": mean,
                           "seeds": list(cfg.tune_seeds), "chosen": False}
                rows.append(row)
            best = max(range(len(rows)), key=lambda i: rows[i]["score" if column is not None else "val_acc"])
            rows[best]["chosen"] = True
            chosen[(frozen(cell), norm)] = rows[best]["values"]
            table += rows
    return chosen, table
