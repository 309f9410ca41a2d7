"""Progress of a comparison: rich bars on a terminal, plain lines in logs and CI.

`Progress` is the interface `run_compare` reports to; the base class shows nothing (for library
use) but keeps the counts every display shares, including the overall ETA: the time per epoch
measured in this session (several runs at once included) times the epochs still to train.
`choose_progress` picks rich bars (an overall bar and one per run in progress) on an interactive
terminal and plain lines when output is redirected or `CI` is set.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from normkit_lab.records import EpochRecord, RunId, RunResult


class Progress:
    """Receives the events of a comparison (runs may overlap); shows nothing."""

    def __init__(self) -> None:
        self.total = self.done = 0
        self._epochs_of: Callable[[RunId], int] = lambda run_id: 0
        self._epochs_done: dict[RunId, int] = {}  # epochs finished by each run in progress
        self._trained = 0  # epochs trained in this session
        self._left = 0  # epochs still to train over every unfinished run
        self._started = time.monotonic()

    def start(self, total: int, done: int, epochs: int | Callable[[RunId], int], left: int | None = None) -> None:
        """`total` runs planned, `done` of them already finished (resume), `epochs` per run (a number, or
        the run's own count: cells of a sweep or a steps budget differ), `left` the epochs of the runs
        still to train (default: the runs left times a number `epochs`)."""
        self.total, self.done = total, done
        self._epochs_of = epochs if callable(epochs) else (lambda run_id: epochs)
        self._left = left if left is not None else (total - done) * (epochs if isinstance(epochs, int) else 0)
        self._started = time.monotonic()

    def epochs(self, run_id: RunId) -> int:
        """The epochs `run_id` trains (its passes over the data)."""
        return self._epochs_of(run_id)

    def run_start(self, run_id: RunId) -> None:
        self._epochs_done[run_id] = 0

    def epoch_end(self, run_id: RunId, record: EpochRecord) -> None:
        self._epochs_done[run_id] = record.epoch + 1
        self._trained += 1
        self._left -= 1

    def run_end(self, result: RunResult) -> None:
        run_id = RunId.of_run(result)
        self._left -= max(self.epochs(run_id) - self._epochs_done.pop(run_id, 0), 0)
        self.done += 1

    def run_skipped(self, run_id: RunId) -> None:
        """A run another process finished (several writers on one store): counted as done."""
        self._left -= max(self.epochs(run_id) - self._epochs_done.pop(run_id, 0), 0)
        self.done += 1

    def close(self) -> None: ...

    def eta_seconds(self) -> float | None:
        """Seconds until every planned run has finished, from this session's pace; None before an epoch."""
        if self._trained == 0:
            return None
        return max(self._left, 0) * (time.monotonic() - self._started) / self._trained


def format_eta(seconds: float | None) -> str:
    """`ETA 1:05` (minutes:seconds, or h:mm:ss), `ETA -` when unknown."""
    if seconds is None:
        return "ETA -"
    s = round(seconds)
    h, m = divmod(s // 60, 60)
    return f"ETA {h}:{m:02d}:{s % 60:02d}" if h else f"ETA {m}:{s % 60:02d}"


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _reported(record: Any) -> str:
    """A reported epoch's metrics (a --command or train= run), shortened: `val_acc 0.912, test_acc 0.905`."""
    text = ", ".join(f"{k} {v:.4g}" for k, v in list(record.metrics.items())[:4])
    return text or "no metrics"


class PlainProgress(Progress):
    """One line per epoch and per finished run, flushed at once (readable in CI logs)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        self.stream = stream or sys.stdout

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def start(self, total: int, done: int, epochs: int | Callable[[RunId], int], left: int | None = None) -> None:
        super().start(total, done, epochs, left)
        resumed = f", {done} already finished" if done else ""
        self._say(f"compare: {total} run{'' if total == 1 else 's'}{resumed}")

    def epoch_end(self, run_id: RunId, record: EpochRecord) -> None:
        super().epoch_end(run_id, record)
        where = f"[{self.done + 1}/{self.total}] {run_id.label()}"
        if hasattr(record, "metrics"):
            self._say(f"{where} epoch {record.epoch + 1}: {_reported(record)}")
            return
        self._say(f"{where} epoch {record.epoch + 1}/{self.epochs(run_id)}: train loss {record.train_loss:.4f}, "
                  f"val acc {_acc(record.val_acc)}, {record.epoch_time_s:.1f}s")

    def run_end(self, result: RunResult) -> None:
        super().run_end(result)
        where = f"[{self.done}/{self.total}] {RunId.of_run(result).label()}"
        if result.status == "failed":
            self._say(f"{where}: {result.error}")
            return
        if result.trainer != "builtin":
            final = _reported(result.epochs[-1]) if result.epochs else "-"
            self._say(f"{where}: {result.status}, final {final}, {format_eta(self.eta_seconds())}")
            return
        final = _acc(result.epochs[-1].val_acc) if result.epochs else "-"
        self._say(f"{where}: {result.status}, final val acc {final}, {format_eta(self.eta_seconds())}")

    def run_skipped(self, run_id: RunId) -> None:
        super().run_skipped(run_id)
        self._say(f"[{self.done}/{self.total}] {run_id.label()}: finished by another process")


class RichProgress(Progress):
    """An overall bar (epochs of every planned run, with the ETA), a bar per run in progress, and a
    line per finished run printed above the bars."""

    def __init__(self, console: Any = None) -> None:
        super().__init__()
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichBars

        self.bars = RichBars(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                             TimeElapsedColumn(), console=console, transient=False)
        self.overall: Any = None
        self.current: dict[RunId, Any] = {}

    def _overall_status(self) -> str:
        return f"{self.done}/{self.total} runs, {format_eta(self.eta_seconds())}"

    def start(self, total: int, done: int, epochs: int | Callable[[RunId], int], left: int | None = None) -> None:
        super().start(total, done, epochs, left)
        self.bars.start()
        self.overall = self.bars.add_task("all runs", total=max(self._left, 1), completed=0,
                                          status=self._overall_status())

    def run_start(self, run_id: RunId) -> None:
        super().run_start(run_id)
        if run_id in self.current:  # started again after its worker died: one bar per run
            self.bars.remove_task(self.current[run_id])
        self.current[run_id] = self.bars.add_task(run_id.label(), total=self.epochs(run_id), status="")

    def epoch_end(self, run_id: RunId, record: EpochRecord) -> None:
        super().epoch_end(run_id, record)
        if run_id in self.current:
            self.bars.update(self.current[run_id], completed=record.epoch + 1,
                             status=(_reported(record) if hasattr(record, "metrics")
                                     else f"val acc {_acc(record.val_acc)}"))
        self.bars.update(self.overall, advance=1, status=self._overall_status())

    def run_end(self, result: RunResult) -> None:
        run_id = RunId.of_run(result)
        seen = self._epochs_done.get(run_id, 0)
        super().run_end(result)
        own = result.trainer != "builtin"
        if own:
            final = _reported(result.epochs[-1]) if result.epochs else "-"
        else:
            final = _acc(result.epochs[-1].val_acc) if result.epochs else "-"
        task = self.current.pop(run_id, None)
        if task is not None:  # finished runs leave the display (the table follows); one line says how it ended
            self.bars.remove_task(task)
        final = f"{'' if own else 'val acc '}{final}"
        ending = result.error if result.status == "failed" else f"{result.status}, final {final}"
        self.bars.console.print(f"{run_id.label()}: {ending}", highlight=False, soft_wrap=True)
        self.bars.update(self.overall, advance=max(self.epochs(run_id) - seen, 0), status=self._overall_status())

    def run_skipped(self, run_id: RunId) -> None:
        seen = self._epochs_done.get(run_id, 0)
        super().run_skipped(run_id)
        self.bars.update(self.overall, advance=max(self.epochs(run_id) - seen, 0), status=self._overall_status())

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
