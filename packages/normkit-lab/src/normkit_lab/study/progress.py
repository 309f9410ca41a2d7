"""Progress of a comparison: rich bars on a terminal, plain lines in logs and CI.

`Progress` is the interface `run_compare` reports to; the base class shows nothing (for library
use) but keeps the counts every display shares, including the overall ETA: the time per epoch
measured in this session (several runs at once included) times the epochs still to train.
The user's own code reports its own epochs: they are shown with the program's own numbers and
counted as reported; how many a run trains is known only when the command is given `{epochs}`,
else learned from the runs that finish (no ETA before one has).
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

from normkit_lab.records import SAME_RUN, EpochRecord, RunId, RunResult

Epochs = Callable[[RunId], "int | None"]  # a run's epochs; None: the user's program's own, not known yet


def reported(record: Any) -> bool:
    """True for an epoch the user's code reported (numbered its own way), False for normkit's own loop's."""
    return hasattr(record, "metrics")


class Progress:
    """Receives the events of a comparison (runs may overlap); shows nothing."""

    def __init__(self) -> None:
        self.total = self.done = 0
        self._epochs_of: Epochs = lambda run_id: 0
        self._units_of: Epochs = self._epochs_of  # the ETA's unit: epochs, or steps
        self._by_steps = False
        self._units_done: dict[RunId, int] = {}  # units finished by each run in progress
        self._trained = 0  # units trained in this session
        self._left: int | None = 0  # units still to train over every unfinished run; None: not known
        self._learned: list[int] = []  # epochs reported by each run that finished ok (when not known ahead)
        self._started = time.monotonic()

    def start(self, total: int, done: int, epochs: int | Epochs, left: int | None = None,
              steps: Callable[[RunId], int] | None = None) -> None:
        """`total` runs planned, `done` of them already finished (resume), `epochs` per run (a number, or
        the run's own count: cells of a sweep or a steps budget differ; None for a program whose count is
        not known ahead). The ETA counts epochs, or with `steps` (each run's optimizer steps) steps, which
        weigh a batch-16 epoch and a batch-2 epoch by what they cost; `left` is the units of the runs
        still to train (default: the runs left times a number `epochs`; None: not known ahead)."""
        self.total, self.done = total, done
        self._epochs_of = epochs if callable(epochs) else (lambda run_id: epochs)
        self._units_of, self._by_steps = (steps, True) if steps is not None else (self._epochs_of, False)
        self._left = left if left is not None or callable(epochs) else (total - done) * epochs
        self._started = time.monotonic()

    def epochs(self, run_id: RunId) -> int | None:
        """The epochs `run_id` trains (its passes over the data); None when its program's count is not known."""
        return self._epochs_of(run_id)

    def run_start(self, run_id: RunId) -> None:
        self._units_done[run_id] = 0

    def epoch_end(self, run_id: RunId, record: EpochRecord) -> int:
        """Count a finished epoch; returns the units it trained. A reported epoch counts one, whatever its
        number (a program may count from 0 or 1, or report every other epoch)."""
        done = self._units_done.get(run_id, 0)
        steps = getattr(record, "steps", None) if self._by_steps else None
        now = done + 1 if reported(record) else steps if isinstance(steps, int) else record.epoch + 1
        trained = max(now - done, 0)
        self._units_done[run_id] = now
        self._trained += trained
        if self._left is not None:
            self._left -= trained
        return trained

    def run_end(self, result: RunResult) -> int:
        """Count a finished run; returns the units it no longer needs (a run that stopped early)."""
        self.done += 1
        if self._left is None and result.status == "ok" and result.epochs:
            self._learned.append(len(result.epochs))  # the program's own count, earlier attempts included
        return self._drop(RunId.of_run(result))

    def run_skipped(self, run_id: RunId) -> int:
        """A run another process finished (several writers on one store): counted as done."""
        self.done += 1
        return self._drop(run_id)

    def _drop(self, run_id: RunId) -> int:
        done = self._units_done.pop(run_id, 0)
        if self._left is None:
            return 0
        unused = max((self._units_of(run_id) or 0) - done, 0)
        self._left -= unused
        return unused

    def close(self) -> None: ...

    def units_left(self) -> float | None:
        """Units still to train: known ahead, or for a program's own epochs, the mean its finished runs
        reported times the runs left, less what the runs in progress reported; None before a run finished."""
        if self._left is not None:
            return max(self._left, 0)
        if not self._learned:
            return None
        per_run = sum(self._learned) / len(self._learned)
        waiting = self.total - self.done - len(self._units_done)
        return max(waiting, 0) * per_run + sum(max(per_run - done, 0) for done in self._units_done.values())

    def eta_seconds(self) -> float | None:
        """Seconds until every planned run has finished, from this session's pace; None before an epoch,
        and for a program whose epochs are not known ahead, before one of its runs finished."""
        left = self.units_left()
        if self._trained == 0 or left is None:
            return None
        return left * (time.monotonic() - self._started) / self._trained


def format_eta(seconds: float | None) -> str:
    """`ETA 1:05` (minutes:seconds, or h:mm:ss), `ETA -` when unknown."""
    if seconds is None:
        return "ETA -"
    s = round(seconds)
    h, m = divmod(s // 60, 60)
    return f"ETA {h}:{m:02d}:{s % 60:02d}" if h else f"ETA {m}:{s % 60:02d}"


def _same_run(result: RunResult) -> str:
    """` (the run trained in norm_batch=2)` for a run recorded as another cell's (study/twins.py), else ``."""
    note = result.extras.get(SAME_RUN)
    if not note:
        return ""
    return f" (the run trained in {', '.join(f'{k}={v}' for k, v in note['trained_in'].items())}, recorded here too)"


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

    def start(self, total: int, done: int, epochs: int | Epochs, left: int | None = None,
              steps: Callable[[RunId], int] | None = None) -> None:
        super().start(total, done, epochs, left, steps)
        resumed = f", {done} already finished" if done else ""
        self._say(f"compare: {total} run{'' if total == 1 else 's'}{resumed}")

    def epoch_end(self, run_id: RunId, record: EpochRecord) -> int:
        trained = super().epoch_end(run_id, record)
        where = f"[{self.done + 1}/{self.total}] {run_id.label()}"
        if reported(record):  # the program's own epoch number, as it reported it
            self._say(f"{where} epoch {record.epoch}: {_reported(record)}")
            return trained
        self._say(f"{where} epoch {record.epoch + 1}/{self.epochs(run_id)}: train loss {record.train_loss:.4f}, "
                  f"val acc {_acc(record.val_acc)}, {record.epoch_time_s:.1f}s")
        return trained

    def run_end(self, result: RunResult) -> int:
        unused = super().run_end(result)
        where = f"[{self.done}/{self.total}] {RunId.of_run(result).label()}"
        if result.status == "failed":
            self._say(f"{where}: {result.error}")
        elif result.trainer != "builtin":
            final = _reported(result.epochs[-1]) if result.epochs else "-"
            self._say(f"{where}: {result.status}, final {final}, {format_eta(self.eta_seconds())}")
        else:
            final = _acc(result.epochs[-1].val_acc) if result.epochs else "-"
            self._say(f"{where}: {result.status}, final val acc {final}{_same_run(result)}, "
                      f"{format_eta(self.eta_seconds())}")
        return unused

    def run_skipped(self, run_id: RunId) -> int:
        unused = super().run_skipped(run_id)
        self._say(f"[{self.done}/{self.total}] {run_id.label()}: finished by another process")
        return unused


class RichProgress(Progress):
    """An overall bar (the epochs or steps of every planned run, with the ETA), a bar per run in progress, and a
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

    def start(self, total: int, done: int, epochs: int | Epochs, left: int | None = None,
              steps: Callable[[RunId], int] | None = None) -> None:
        super().start(total, done, epochs, left, steps)
        self.bars.start()
        self.overall = self.bars.add_task("all runs", total=None if self._left is None else max(self._left, 1),
                                          completed=0, status=self._overall_status())

    def run_start(self, run_id: RunId) -> None:
        super().run_start(run_id)
        if run_id in self.current:  # started again after its worker died: one bar per run
            self.bars.remove_task(self.current[run_id])
        self.current[run_id] = self.bars.add_task(run_id.label(), total=self.epochs(run_id), status="")

    def epoch_end(self, run_id: RunId, record: EpochRecord) -> int:
        trained = super().epoch_end(run_id, record)
        if run_id in self.current:
            own = reported(record)  # a program's epochs: as many as it reported, its own number shown
            self.bars.update(self.current[run_id], completed=self._units_done[run_id] if own else record.epoch + 1,
                             status=(f"epoch {record.epoch}: {_reported(record)}" if own
                                     else f"val acc {_acc(record.val_acc)}"))
        self.bars.update(self.overall, advance=trained, status=self._overall_status())
        return trained

    def run_end(self, result: RunResult) -> int:
        run_id = RunId.of_run(result)
        unused = super().run_end(result)
        own = result.trainer != "builtin"
        if own:
            final = _reported(result.epochs[-1]) if result.epochs else "-"
        else:
            final = _acc(result.epochs[-1].val_acc) if result.epochs else "-"
        task = self.current.pop(run_id, None)
        if task is not None:  # finished runs leave the display (the table follows); one line says how it ended
            self.bars.remove_task(task)
        final = f"{'' if own else 'val acc '}{final}"
        ending = result.error if result.status == "failed" else f"{result.status}, final {final}{_same_run(result)}"
        self.bars.console.print(f"{run_id.label()}: {ending}", highlight=False, soft_wrap=True)
        self.bars.update(self.overall, advance=unused, status=self._overall_status())
        return unused

    def run_skipped(self, run_id: RunId) -> int:
        unused = super().run_skipped(run_id)
        self.bars.update(self.overall, advance=unused, status=self._overall_status())
        return unused

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
