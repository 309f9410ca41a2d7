"""The looks record of sequential seeds (`looks.json` in a results directory): the design, each look's
seeds and the comparisons it ran, and why the rounds stopped. Written by `study/rounds.py` before each
look's runs (the design before the first run), read by the summary: a comparison the budget left
undecided is `inconclusive` only when the record says the rounds stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from normkit_lab.analysis.caption import plural
from normkit_lab.analysis.summary import Summary, cell_label
from normkit_lab.analysis.verdicts import LOOK_P
from normkit_lab.errors import DamagedStudyFile
from normkit_lab.sequential import INCONCLUSIVE, Design

LOOKS_FILE = "looks.json"
STOP_DECIDED, STOP_MAX_SEEDS, STOP_BUDGET = "every comparison decided", "max seeds reached", "budget spent"


def read_looks(directory: str | Path) -> dict[str, Any] | None:
    """The record of a results directory (None when it ran fixed seeds); a damaged file is a one-line error."""
    path = Path(directory) / LOOKS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedStudyFile(f"{str(path)!r} cannot be read ({type(exc).__name__}); it records the looks of "
                               f"--seeds auto, so restore it or start the comparison again") from None
    if not (isinstance(record, dict) and isinstance(record.get("looks"), list)
            and isinstance(record.get("design"), dict)):
        raise DamagedStudyFile(f"{str(path)!r} is not a looks record written by normkit compare --seeds auto; "
                               f"restore it or start the comparison again")
    return record


def budget_ended(record: dict[str, Any] | None) -> bool:
    """True when the budget ended the rounds: undecided comparisons are then final (`inconclusive`)."""
    return record is not None and str(record.get("stopped") or "").startswith(STOP_BUDGET)


def interval_lines(summary: Summary, design: Design | None, record: dict[str, Any] | None,
                   mde: bool = True) -> list[str]:
    """The lines under the verdict table (compare and report print the same): what the adjusted interval
    is, the sequential design and why its rounds stopped, each comparison undecided at the budget with
    the smallest difference the budget could have shown, and what the MDE column means."""
    rows = [s for s in summary.rows if s.verdict is not None and s.interval is not None]
    unit = summary.metric.unit
    lines = []
    if rows:
        looks = " and the looks" if design is not None else ""
        lines.append(f"adj. CI: the interval of the difference adjusted for the {plural(len(rows), 'comparison')}"
                     f" (Holm){looks}, the one the verdict is decided on: it excludes 0 exactly when a difference "
                     f"is shown (summary.csv: diff_adj_*; diff_ci95_* unadjusted)")
    if design is not None:
        stopped = (record or {}).get("stopped") or "not yet: more looks to come (resume to continue)"
        lines.append(f"sequential seeds: looks after {', '.join(map(str, design.looks))} seeds, "
                     f"{design.spending} alpha spending, Holm across comparisons at each look; stopped: {stopped}")
        lines.append(f"{LOOK_P}: the paired t-test's p at the comparison's last look and, in brackets, the alpha "
                     f"that look spends at its Holm level; a difference is shown when p <= alpha (TOST: the "
                     f"equivalence test's, for an equivalent verdict)")
        for s in summary.rows:
            v = s.verdict
            if v is None or v.look is None:
                continue
            where = f"{s.norm} [{cell_label(s.cell)}]" if s.cell else s.norm
            if v.verdict == INCONCLUSIVE:
                could = "unknown (no spread)" if v.mde is None else f"{v.mde:.3g} {unit}".replace(" %", "%")
                lines.append(f"  {where}: {v.stop} after {v.n} seeds; the budget of {design.max_seeds} seeds could "
                             f"have shown differences of {could} (80% power)")
            else:
                lines.append(f"  {where}: {v.verdict} at look {v.look} ({v.n} seeds): {v.stop}")
    level = next((s.verdict.planning_alpha for s in summary.rows if s.verdict is not None and s.verdict.mde
                  is not None), None)
    if level is not None and mde:
        lines.append("MDE: for comparisons undecided at the budget, the difference the whole budget detects with "
                     "80% power at the last look's level" if design is not None else
                     f"MDE: the difference detected with 80% power at level {level:.3g} (alpha / comparisons, "
                     f"the strictest Holm step)")
    return lines
