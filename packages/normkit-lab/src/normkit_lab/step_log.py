"""The per-step log of a run: `metrics/steps/<run_slug>.csv`, one row per optimizer step.

Written by `runs.loggers.CSVLogger` (normkit's own training loop), read by `analysis.plots` to draw
the training loss and the learning rate as they ran, step by step (an epoch record only holds the
running mean of the loss and the learning rate at the epoch's first step, which a schedule that
decays within the epoch leaves behind). Here so that the writer and the reader share one format.

Columns: `step` (from 1 over the whole run), `epoch` (the epoch the step belongs to, counted from 0
as EpochRecord counts), `loss` (the step's training loss; nan/inf written as such) and `lr` (the
learning rate the step used).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

FIELDS = ("step", "epoch", "loss", "lr")
STEPS_DIR = "steps"  # inside the results directory's metrics/, beside the per-epoch `<run_slug>.csv`


def path_in(metrics_dir: Path, run_slug: str) -> Path:
    """Where a run's step log lives, given the results directory's metrics/ folder."""
    return Path(metrics_dir) / STEPS_DIR / f"{run_slug}.csv"


def rows_text(rows: list[tuple[int, int, float, float]], header: bool) -> str:
    """CSV text of (step, epoch, loss, lr) rows, floats in full precision."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(FIELDS)
    writer.writerows((step, epoch, repr(float(loss)), repr(float(lr))) for step, epoch, loss, lr in rows)
    return buf.getvalue()


def read(path: Path) -> list[tuple[int, int, float, float]]:
    """The (step, epoch, loss, lr) rows of a step log ([] when it is missing); a row cut short by an
    interrupted write is skipped, and the rows come back in step order with each step once (the last
    one written wins)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
        return []
    by_step: dict[int, tuple[int, int, float, float]] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) != len(FIELDS) or row[0] == FIELDS[0]:
            continue
        try:
            step, epoch, loss, lr = int(row[0]), int(row[1]), float(row[2]), float(row[3])
        except ValueError:
            continue
        if step >= 1 and epoch >= 0 and math.isfinite(lr):
            by_step[step] = (step, epoch, loss, lr)
    return [by_step[s] for s in sorted(by_step)]
