"""Progress of a comparison: rich bars on a terminal, plain lines in logs and CI.

`Progress` is the interface `run_compare` reports to; the base class shows nothing (for library
use). `choose_progress` picks rich bars (an overall bar and one for the current run) on an
interactive terminal and plain lines when output is redirected or `CI` is set.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import IO, Any

from normkit_lab.training import EpochRecord, RunResult


class Progress:
    """Receives the events of a comparison; shows nothing."""

    def start(self, total: int, done: int, epochs: int) -> None:
        """`total` runs planned, `done` of them already finished (resume), `epochs` per run."""

    def run_start(self, norm: str, seed: int) -> None: ...

    def epoch_end(self, norm: str, seed: int, record: EpochRecord) -> None: ...

    def run_end(self, result: RunResult) -> None: ...

    def close(self) -> None: ...


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


class PlainProgress(Progress):
    """One line per epoch and per finished run, flushed at once (readable in CI logs)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.total = self.done = self.epochs = 0

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def start(self, total: int, done: int, epochs: int) -> None:
        self.total, self.done, self.epochs = total, done, epochs
        resumed = f", {done} already finished" if done else ""
        self._say(f"compare: {total} run{'' if total == 1 else 's'}{resumed}")

    def epoch_end(self, norm: str, seed: int, record: EpochRecord) -> None:
        where = f"[{self.done + 1}/{self.total}] {norm} seed {seed}"
        self._say(f"{where} epoch {record.epoch + 1}/{self.epochs}: train loss {record.train_loss:.4f}, "
                  f"val acc {_acc(record.val_acc)}, "
                  f"{record.epoch_time_s:.1f}s")

    def run_end(self, result: RunResult) -> None:
        self.done += 1
        final = _acc(result.epochs[-1].val_acc) if result.epochs else "-"
        if result.status == "failed":
            self._say(f"[{self.done}/{self.total}] {result.norm} seed {result.seed}: {result.error}")
            return
        self._say(f"[{self.done}/{self.total}] {result.norm} seed {result.seed}: {result.status}, "
                  f"final val acc {final}")


class RichProgress(Progress):
    """An overall bar (runs) and a bar for the running (norm, seed) (epochs)."""

    def __init__(self, console: Any = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichBars

        self.bars = RichBars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                             console=console, transient=False)
        self.overall: Any = None
        self.current: Any = None
        self.epochs = 0

    def start(self, total: int, done: int, epochs: int) -> None:
        self.epochs = epochs
        self.bars.start()
        self.overall = self.bars.add_task("all runs", total=total, completed=done, status="")

    def run_start(self, norm: str, seed: int) -> None:
        self.current = self.bars.add_task(f"{norm} seed {seed}", total=self.epochs, status="")

    def epoch_end(self, norm: str, seed: int, record: EpochRecord) -> None:
        self.bars.update(self.current, completed=record.epoch + 1, status=f"val acc {_acc(record.val_acc)}")

    def run_end(self, result: RunResult) -> None:
        final = _acc(result.epochs[-1].val_acc) if result.epochs else "-"
        self.bars.update(self.current, completed=self.epochs if result.status == "ok" else None,
                         status=f"{result.status}, {final}")
        self.bars.advance(self.overall)

    def close(self) -> None:
        self.bars.stop()


def interactive(stream: IO[str] | None = None) -> bool:
    """True on a terminal outside CI (where bars redraw in place)."""
    stream = stream or sys.stdout
    return stream.isatty() and not os.environ.get("CI")


def choose_progress(stream: IO[str] | None = None) -> Progress:
    """Rich bars on an interactive terminal (when rich is installed), plain lines elsewhere."""
    if interactive(stream) and importlib.util.find_spec("rich") is not None:
        return RichProgress()
    return PlainProgress(stream)
