"""What `--tune` tried and chose, as a person reads it: per (cell, norm) every candidate's validation
score, the chosen one, and whether the choice sits at an edge of its grid.

The input is tuning.json's rows (`normkit_lab.study.plan.choose`): one per (cell, norm, candidate),
with `val_acc` (the built-in trainer: mean validation accuracy over the tuning seeds, a fraction;
null when a tuning run diverged) or, for your own code, `score_field` naming the metric's
validation field and its mean. A choice at the smallest or largest value of a key's grid may be
handicapped by the grid rather than by the norm: the best value may lie beyond it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normkit_lab.store.results import TUNING_FILE


@dataclass(frozen=True)
class Candidate:
    """One value (or grid point) tried for a norm: its mean validation score (None: a run diverged or failed)."""

    values: dict[str, Any]
    score: float | None
    chosen: bool


@dataclass(frozen=True)
class TunedNorm:
    """Everything tuning tried for one norm in one cell, and what it chose."""

    norm: str
    cell: dict[str, Any]
    candidates: list[Candidate]
    edges: list[tuple[str, Any, str]]  # (key, chosen value, "smallest" or "largest") per key chosen at an edge

    @property
    def chosen(self) -> dict[str, Any]:
        return next((c.values for c in self.candidates if c.chosen), {})

    def edge_text(self) -> str:
        """`lr=0.3 is the largest value tried` (several joined by "; "), "" when no choice is at an edge."""
        return "; ".join(f"{key}={value} is the {side} value tried" for key, value, side in self.edges)


def score_label(table: Sequence[Mapping[str, Any]]) -> str:
    """What the scores are: `validation accuracy (%)` for the built-in trainer, else the field's name."""
    field = table[0].get("score_field") if table else None
    return f"{field}, mean over the tuning seeds" if field else "validation accuracy (%), mean over the tuning seeds"


def _score(row: Mapping[str, Any]) -> float | None:
    field = row.get("score_field")
    value = row.get(field) if field else row.get("val_acc")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or abs(value) == float("inf"):
        return None
    return float(value) if field else 100.0 * float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _grids(table: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Each tuned key's values in increasing order; only numeric grids have an order (a program's own
    key may be tuned over text such as "010" or "adam", which has no edge), so others are left out."""
    grids: dict[str, list[Any]] = {}
    for row in table:
        for key, value in row["values"].items():
            if value not in grids.setdefault(key, []):
                grids[key].append(value)
    return {key: sorted(values) for key, values in grids.items() if all(_is_number(v) for v in values)}


def tuned_norms(table: Sequence[Mapping[str, Any]]) -> list[TunedNorm]:
    """The tuning table grouped per (cell, norm), in the order tuning ran them."""
    grids = _grids(table)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in table:
        groups.setdefault(json.dumps([row["cell"], row["norm"]], sort_keys=True, default=str), []).append(row)
    out = []
    for rows in groups.values():
        candidates = [Candidate(dict(r["values"]), _score(r), bool(r["chosen"])) for r in rows]
        chosen = next((c.values for c in candidates if c.chosen), {})
        edges = [(key, value, "smallest" if value == grids[key][0] else "largest") for key, value in chosen.items()
                 if key in grids and len(grids[key]) > 1 and value in (grids[key][0], grids[key][-1])]
        out.append(TunedNorm(rows[0]["norm"], dict(rows[0]["cell"]), candidates, edges))
    return out


def edge_warnings(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per (cell, norm, key) whose chosen value is the smallest or largest value tried."""
    lines = []
    for t in tuned_norms(table):
        where = f"{t.norm} [{', '.join(f'{k}={v}' for k, v in t.cell.items())}]" if t.cell else t.norm
        lines += [f"warning: tuning chose {key}={value} for {where}, the {side} value tried; the best may lie "
                  f"beyond the grid, so extend --tune {key}=... past it" for key, value, side in t.edges]
    return lines


def read_tuning(dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """tuning.json of the first of `dirs` that has one ([] when none tuned). Merged directories that
    tuned agree on every choice (the merge checks it), so the first one's table stands for all."""
    for path in dirs:
        file = Path(path) / TUNING_FILE
        if file.is_file():
            try:
                rows = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(rows, list) and all(isinstance(r, dict) and {"cell", "norm", "values", "chosen"} <= set(r)
                                              for r in rows):
                return rows
    return []
