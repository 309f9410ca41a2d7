"""Sequential seeds (`seeds: auto`): run the first look's seeds, then add seeds in rounds only to the
comparisons still undecided, until every comparison is decided, the last look is run, or the CPU
budget (`max_cpu_minutes`) would be spent by the next round.

Each round is one look of the design (normkit_lab.sequential): the runs it lists go through the same
plan, executor and store as fixed seeds (`compare_plan` with the look's seeds and the arms still
running). looks.json records the design before the first run, and each look's seeds and comparisons
before its runs start, so a resumed comparison finishes the look it was in and then decides from the
same runs as an uninterrupted one would: the same decisions. Whether to start a round is decided from
the runs alone (the summary's verdicts), except the budget, whose stop is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from normkit_lab.analysis.looks import LOOKS_FILE, STOP_BUDGET, STOP_DECIDED, STOP_MAX_SEEDS, read_looks
from normkit_lab.analysis.summary import Summary, cell_key
from normkit_lab.records import SAME_RUN, RunId
from normkit_lab.sequential import CONTINUE, INCONCLUSIVE, Design
from normkit_lab.spec import CompareConfig, grid
from normkit_lab.store.results import ResultsDir, atomic_write_text, group_runs, json_text
from normkit_lab.study.plan import compare_plan

Chosen = dict[tuple[Any, str], dict[str, Any]] | None


def _write(store: ResultsDir, record: dict[str, Any]) -> None:
    atomic_write_text(store.path / LOOKS_FILE, json_text(record))


def cpu_minutes(store: ResultsDir) -> tuple[float, int]:
    """The training CPU time recorded so far (minutes, every run and epoch) and the number of runs it covers;
    a run recorded as the same run as another (study/twins.py) cost nothing and is not counted."""
    trained = [rows for rows in group_runs(store.rows()).values()
               if not any(SAME_RUN in (row.get("extras") or {}) for row in rows)]
    seconds = sum(r["cpu_time_s"] for rows in trained for r in rows if isinstance(r.get("cpu_time_s"), (int, float)))
    return seconds / 60.0, len(trained)


def _undecided(summary: Summary) -> list[dict[str, Any]]:
    return [{"cell": s.cell, "norm": s.norm} for s in summary.rows
            if s.verdict is not None and s.verdict.verdict == CONTINUE]


def _arms(cfg: CompareConfig, wanted: list[dict[str, Any]], first: bool) -> Callable[[dict[str, Any]], list[str]]:
    """The arms a look runs in a cell: every arm at the first look, then the baseline and the undecided norms
    (and, with --ablate, the stage ablations) of the cells with an undecided comparison."""
    by_cell: dict[str, set[str]] = {}
    for item in wanted:
        by_cell.setdefault(cell_key(item["cell"]), set()).add(item["norm"])

    def arms(cell: dict[str, Any]) -> list[str]:
        if first:
            return list(cfg.arms)
        norms = by_cell.get(cell_key(cell))
        if not norms:
            return []
        return [a for a in cfg.arms if a in norms or a == cfg.baseline_norm or a not in cfg.norms]

    return arms


def run_rounds(cfg: CompareConfig, store: ResultsDir, chosen: Chosen, run_all: Callable[[list[RunId]], None],
               summary_of: Callable[[], Summary]) -> dict[str, Any]:
    """Run the looks of `cfg.looks` through `run_all` (the compare loop's executor call); return the record."""
    design = Design(tuple(cfg.looks or ()))
    record = read_looks(store.path) or {"design": design.as_dict(), "max_cpu_minutes": cfg.max_cpu_minutes,
                                        "looks": [], "stopped": None}
    _write(store, record)  # the design is on disk before the first run
    every = [{"cell": cell, "norm": norm} for cell in grid(cfg.sweep) for norm in cfg.norms
             if norm != cfg.baseline_norm]

    def runs_of(k: int, wanted: list[dict[str, Any]]) -> list[RunId]:
        finished = store.finished()
        plan = compare_plan(cfg, chosen, seeds=design.looks[k], arms=_arms(cfg, wanted, k == 0))
        return [run_id for run_id in plan if run_id not in finished]

    for k, count in enumerate(design.looks):
        if k < len(record["looks"]):  # resuming: finish the look that was started, with its comparisons
            wanted = record["looks"][k]["comparisons"]
        else:
            if record["stopped"]:
                break
            wanted = every if k == 0 else _undecided(summary_of())
            if not wanted and k > 0:
                record["stopped"] = STOP_DECIDED
                _write(store, record)
                break
            spent, runs = cpu_minutes(store)
            if k > 0 and cfg.max_cpu_minutes is not None and runs:
                estimate = spent / runs * len(runs_of(k, wanted))
                if spent + estimate > cfg.max_cpu_minutes:
                    record["stopped"] = (f"{STOP_BUDGET}: {spent:.1f} CPU minutes used, the next look (to {count} "
                                         f"seeds) needs about {estimate:.1f} more, over --max-cpu-minutes "
                                         f"{cfg.max_cpu_minutes:g}")
                    _write(store, record)
                    break
            record["looks"].append({"look": k + 1, "seeds": count, "comparisons": wanted,
                                    "cpu_minutes_before": round(spent, 3)})
            _write(store, record)
        run_all(runs_of(k, wanted))
    if not record["stopped"]:
        left = [s for s in summary_of().rows if s.verdict is not None and s.verdict.verdict in (CONTINUE, INCONCLUSIVE)]
        record["stopped"] = STOP_MAX_SEEDS if left else STOP_DECIDED
        _write(store, record)
    return record
