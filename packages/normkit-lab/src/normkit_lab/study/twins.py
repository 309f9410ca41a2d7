"""Runs a swept `norm_batch` cannot change, trained once.

`norm_batch` makes the layers whose statistics pool over the batch normalize over ghost batches; a norm
with no such layer (gn+pn, ln: `runs.checks.norm_batch_changes` proves it from the model built from the
spec) trains the same run in every norm_batch cell. A comparison trains it in the first cell that needs
it and records it in the others as that run (the same rows, under the other cell), with
`extras["same_run"]` naming the cell it was trained in and why, so runs.jsonl says which runs were
trained and which repeat one. Only the built-in trainer: the user's own code may read norm_batch.
"""

from __future__ import annotations

from typing import Any

from normkit_lab.records import SAME_RUN, RunId
from normkit_lab.runs.checks import norm_batch_changes
from normkit_lab.spec import CompareConfig
from normkit_lab.store.results import ResultsDir, group_runs

Key = tuple[Any, ...]


def twin_key(cfg: CompareConfig, run_id: RunId) -> Key | None:
    """`run_id`'s identity without its norm_batch when norm_batch provably leaves the run unchanged, else None."""
    if cfg.external or "norm_batch" not in dict(run_id.cell):
        return None
    if norm_batch_changes(run_id.train_config(cfg.train), run_id.norm):
        return None
    cell = tuple(item for item in run_id.cell if item[0] != "norm_batch")
    return run_id.norm, run_id.seed, run_id.phase, cell, run_id.tuned


def split_twins(cfg: CompareConfig, store: ResultsDir, run_ids: list[RunId]) -> tuple[list[RunId],
                                                                                       list[tuple[RunId, RunId]]]:
    """(the runs to train, (run, the trained run it repeats) pairs), in the order of `run_ids`: a run
    whose twin is finished in `store` or trained earlier in the list is a copy."""
    keys: dict[RunId, Key | None] = {}

    def key_of(run_id: RunId) -> Key | None:
        if run_id not in keys:
            keys[run_id] = twin_key(cfg, run_id)
        return keys[run_id]

    trained: dict[Key, RunId] = {}
    for run_id, rows in group_runs(store.rows()).items():  # the runs trained here, not those recorded as copies
        key = key_of(run_id) if rows[-1].get("status") != "failed" else None
        if key is not None and key not in trained and not any(SAME_RUN in (row.get("extras") or {}) for row in rows):
            trained[key] = run_id
    train, copies = [], []
    for run_id in run_ids:
        key = key_of(run_id)
        if key is not None and key in trained:
            copies.append((run_id, trained[key]))
        else:
            if key is not None:
                trained[key] = run_id
            train.append(run_id)
    return train, copies


def record_copy(store: ResultsDir, run_id: RunId, source: RunId) -> bool:
    """Append `source`'s rows to `store` as `run_id`'s, marked as the same run; False when `source` has no
    finished record (it failed: then neither is finished, and a resume trains it again)."""
    rows = group_runs(store.rows()).get(source) or []
    if not rows or rows[-1].get("status") == "failed":
        return False
    trained_in = ", ".join(f"{k}={v}" for k, v in source.cell)
    note = {"trained_in": dict(source.cell),
            "why": f"{run_id.norm} has no layer pooling over the batch, so norm_batch changes nothing: the run "
                   f"trained in {trained_in}"}
    copied = [{**row, "cell": dict(run_id.cell)} for row in rows]
    copied[-1] = {**copied[-1], "extras": {**(copied[-1].get("extras") or {}), SAME_RUN: note}}
    store.append_rows(copied)
    return True
