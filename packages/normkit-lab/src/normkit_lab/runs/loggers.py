"""Per-run metric loggers: where one run's numbers go while it trains.

The results directory (runs.jsonl, summary.csv) only learns a run's epochs once the run has
finished, in one write, so an interrupted comparison keeps exactly its finished runs. That is the
right record for comparing, but it shows nothing while a run trains. These loggers write the run
as it goes:

    metrics/<run_slug>.csv        CSVLogger, always: one row per finished epoch (EpochRecord fields,
                                  or for your own code the metrics it reported)
    metrics/steps/<run_slug>.csv  CSVLogger, always, normkit's own loop: loss and lr per optimizer
                                  step (`normkit_lab.step_log`; curves.png draws them)
    tensorboard/<run_slug>/       TensorBoardLogger, with `--log tensorboard`: loss and lr per
                                  optimizer step, every numeric epoch metric per epoch, and for
                                  your own code every metric it reported

Both stay correct when a run resumes from a checkpoint: the CSV is rewritten to exactly the
checkpoint's epochs, and TensorBoard is told (purge_step) to hide the events an interrupted
attempt wrote after the checkpoint. The training loop calls them through `RunLogger`, on the
writing process only (rank 0 under DDP).

This module imports tensorboard only when a TensorBoardLogger is built, so the package works
without it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from normkit_lab import step_log
from normkit_lab.errors import ConfigError, short_repr
from normkit_lab.store.atomic import atomic_write_text
from normkit_lab.store.results import METRICS_DIR, epoch_fields
from normkit_lab.store.safe_paths import make_dirs, refuse_links

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from normkit_lab.records import EpochRecord

LOG_KINDS = ("tensorboard",)  # optional loggers (`--log KIND`); the CSV logger is always on
TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_MISSING = "--log tensorboard needs the tensorboard package: pip install 'tensorboard>=2.14'"
LOSS_SYNC_EVERY = 50  # on an accelerator, read per-step losses back to the host once per this many steps


class RunLogger(Protocol):
    """Receives one run's metrics as it trains (only the writing process: rank 0 under DDP)."""

    def on_resume(self, records: list[EpochRecord], step: int) -> None:
        """Called once before training, after the run's checkpoint was checked: `records` are the epochs
        already finished, `step` the number of optimizer steps already taken ([] and 0 for a fresh run)."""
        ...

    def on_step(self, step: int, loss: Tensor, lr: float) -> None:
        """After every optimizer step; `step` counts from 1 over the whole run; `loss` is a detached 0-d
        tensor (possibly on CUDA: a logger that does not need its value must not call .item())."""
        ...

    def on_epoch(self, record: EpochRecord) -> None:
        """After each finished epoch of normkit's own loop (`record.as_dict()`; values may be None), at the
        last step seen. Your own code's epochs come through `on_reported`."""
        ...

    def on_reported(self, epoch: int, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Your own code's metrics for one of its epochs (command and function runs), as it reported them:
        `epoch` as the program numbers it, `step` its global step when it says (else the epoch is the
        x-axis). An epoch reported again (a program that restarted) replaces that epoch and every later one."""
        ...

    def close(self) -> None:
        """At the end of the run, also when it diverged or failed."""
        ...


class CSVLogger:
    """One run's per-epoch metrics as CSV: a header of EpochRecord's fields, one row per finished epoch
    (for your own code: a header of the metrics it reported, one row per reported epoch), and the
    per-step log beside it (`normkit_lab.step_log`: step, epoch, loss, lr).

    None is written as an empty cell, floats in full precision (non-finite ones as nan/inf). The whole
    (small) file is rewritten atomically at every change, so a reader never sees half a row, and after
    `on_resume` it holds exactly the checkpoint's epochs: rows an interrupted attempt wrote after the
    checkpoint are gone. The file is first written at `on_resume` (with the checkpoint's epochs, or none
    when the run starts from scratch, header only), after the checkpoint was checked: a run refused for a
    damaged checkpoint leaves its metrics as they were, and a run that restarts from scratch never shows
    an earlier attempt's rows.

    The step log gets each epoch's steps appended when the epoch ends, and a diverged or failed run's
    last steps on close(); `on_resume` rewrites it to the checkpoint's steps. Losses are read back to
    the host in one transfer every LOSS_SYNC_EVERY steps (on an accelerator no more synchronization
    than the training loop's own checks). A run that reports its own metrics has no step log.
    """

    def __init__(self, path: Path, steps_path: Path | None = None) -> None:
        self.path = Path(path)
        self.steps_path = Path(steps_path) if steps_path is not None else step_log.path_in(
            self.path.parent, self.path.name.removesuffix(".csv"))
        self._fields: list[str] = list(epoch_fields())
        self._rows: list[dict[str, Any]] = []
        self._reported = False
        self._pending: list[tuple[int, Tensor, float]] = []  # steps whose loss is not read back yet
        self._steps: list[tuple[int, float, float]] = []  # this epoch's (step, loss, lr), not written yet
        self._epoch = 0  # the epoch the pending steps belong to

    def on_resume(self, records: list[EpochRecord], step: int) -> None:
        self._rows = [r.as_dict() for r in records]
        self._epoch = records[-1].epoch + 1 if records else 0
        self._pending, self._steps = [], []
        self._write()
        kept = [row for row in step_log.read(self.steps_path) if row[0] <= step]
        if kept:
            atomic_write_text(self.steps_path, step_log.rows_text(kept, header=True))
        else:  # a fresh start: no earlier attempt's steps (the file is made with the first epoch's)
            self.steps_path.unlink(missing_ok=True)

    def on_step(self, step: int, loss: Tensor, lr: float) -> None:
        self._pending.append((int(step), loss.detach(), float(lr)))
        if len(self._pending) >= LOSS_SYNC_EVERY:
            self._read_back()

    def on_epoch(self, record: EpochRecord) -> None:
        self._rows.append(record.as_dict())
        self._write()
        self._epoch = record.epoch
        self._flush_steps()
        self._epoch = record.epoch + 1

    def on_reported(self, epoch: int, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self._reported:
            self._reported, self._rows, self._fields = True, [], ["epoch"]
        self._rows = [row for row in self._rows if row["epoch"] < epoch]
        self._rows.append({"epoch": int(epoch), **({} if step is None else {"step": int(step)}), **metrics})
        self._fields += [k for k in self._rows[-1] if k not in self._fields]
        self._write()

    def close(self) -> None:
        self._flush_steps()  # a diverged or failed run's steps of its unfinished epoch

    def _write(self) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=self._fields, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(self._rows)
        atomic_write_text(self.path, buf.getvalue())

    def _read_back(self) -> None:
        if not self._pending:
            return
        import torch

        pending, self._pending = self._pending, []
        losses = torch.stack([loss.reshape(()).float() for _, loss, _ in pending]).tolist()  # one transfer
        self._steps += [(step, loss, lr) for (step, _, lr), loss in zip(pending, losses, strict=True)]

    def _flush_steps(self) -> None:
        self._read_back()
        if not self._steps:
            return
        rows = [(step, self._epoch, loss, lr) for step, loss, lr in self._steps]
        self._steps = []
        self.steps_path.parent.mkdir(exist_ok=True)
        new = not self.steps_path.exists()
        with open(self.steps_path, "a", encoding="utf-8", newline="") as f:
            f.write(step_log.rows_text(rows, header=new))


class TensorBoardLogger:
    """One run's metrics as TensorBoard events in `log_dir` (needs the tensorboard package).

    Everything is logged against one x-axis, the global optimizer step (from 1 over the whole run):
    `train/loss_step` and `train/lr` at every step, and at each epoch's end every numeric EpochRecord
    field as `epoch/<field>` at the step that ended the epoch (`epoch/epoch` gives the epoch number
    there). Your own code's reported metrics go to `epoch/<name>` at the step it reported, else at
    its epoch number; an epoch reported again hides what was logged from there on (a purge, as for
    a resume). One axis lines the epoch curves up with the step curves, and it is what makes resuming
    work: TensorBoard's purge is by step, for all tags at once.

    Resume: the writer is opened with `purge_step = step + 1`, which writes a SessionLog START event;
    TensorBoard (and EventAccumulator) then hides every event with a step >= purge_step read from this
    directory before it, i.e. whatever an interrupted attempt logged after the checkpoint, and keeps the
    checkpoint's steps and epochs from that attempt's files (they are not written again). A fresh run
    opens with `purge_step = 0`, hiding all of an earlier attempt that restarted from scratch.

    Per-step losses on CPU are read and written at once; on an accelerator they are kept as tensors and
    read back in one transfer every LOSS_SYNC_EVERY steps and at each epoch's end, so logging adds no
    synchronization per step. Events are flushed to disk at each epoch's end and on close().
    """

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # optional dependency: imported when used

        self.log_dir = Path(log_dir)
        self._writer_cls = SummaryWriter
        self._writer: SummaryWriter | None = None
        self._purge_step = 0
        self._step = 0  # the last optimizer step seen: where epoch metrics are logged
        self._pending: list[tuple[int, Tensor, float]] = []
        self._closed = False
        self._last_reported: int | None = None  # the x of the last reported epoch

    def on_resume(self, records: list[EpochRecord], step: int) -> None:
        if self._writer is not None:  # called late: reopen so the purge still applies
            self._flush_losses()
            self._writer.close()
            self._writer = None
        self._step = int(step)
        self._purge_step = int(step) + 1

    def on_step(self, step: int, loss: Tensor, lr: float) -> None:
        self._step = int(step)
        self._pending.append((int(step), loss.detach(), float(lr)))
        if loss.device.type == "cpu" or len(self._pending) >= LOSS_SYNC_EVERY:
            self._flush_losses()

    def on_epoch(self, record: EpochRecord) -> None:
        self._flush_losses()
        writer = self._open()
        for name, value in record.as_dict().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(f"epoch/{name}", float(value), global_step=self._step)
        writer.flush()

    def on_reported(self, epoch: int, metrics: Mapping[str, float], step: int | None = None) -> None:
        x = int(epoch if step is None else step)
        if self._last_reported is not None and x <= self._last_reported and self._writer is not None:
            self._writer.close()  # reported again: reopen so TensorBoard hides the replaced points
            self._writer, self._purge_step = None, x
        self._last_reported = x
        writer = self._open()
        writer.add_scalar("epoch/epoch", float(epoch), global_step=x)
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(f"epoch/{name}", float(value), global_step=x)
        writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush_losses()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open(self) -> SummaryWriter:
        if self._writer is None:
            self._writer = self._writer_cls(str(self.log_dir), purge_step=self._purge_step)
        return self._writer

    def _flush_losses(self) -> None:
        if not self._pending:
            return
        import torch

        pending, self._pending = self._pending, []
        losses = torch.stack([loss.reshape(()).float() for _, loss, _ in pending]).tolist()  # one transfer
        writer = self._open()
        for (step, _, lr), loss in zip(pending, losses, strict=True):
            writer.add_scalar("train/loss_step", loss, global_step=step)
            writer.add_scalar("train/lr", lr, global_step=step)


def check_log_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """The requested optional loggers, deduplicated in order; ConfigError (one line) for an unknown kind or
    a missing package. Cheap (no import of tensorboard): the CLI calls it before any training."""
    if isinstance(kinds, str):
        kinds = (kinds,)
    wanted: list[str] = []
    for kind in kinds:
        if kind not in LOG_KINDS:
            raise ConfigError(f"unknown --log kind {short_repr(kind)}; valid kinds: {', '.join(LOG_KINDS)}")
        if kind not in wanted:
            wanted.append(kind)
    if "tensorboard" in wanted and find_spec("tensorboard") is None:
        raise ConfigError(TENSORBOARD_MISSING)
    return tuple(wanted)


def make_loggers(kinds: Sequence[str], store_path: Path, run_slug: str) -> list[RunLogger]:
    """One run's loggers: always a CSVLogger at `store_path/metrics/<run_slug>.csv` (its step log in
    `metrics/steps/`), plus a TensorBoardLogger
    at `store_path/tensorboard/<run_slug>/` when "tensorboard" is in `kinds`. Creates the directories,
    refusing a symbolic link at any level below `store_path`."""
    wanted = check_log_kinds(kinds)
    if not run_slug or run_slug in (".", "..") or Path(run_slug).name != run_slug or "\\" in run_slug:
        raise ConfigError(f"run slug {short_repr(run_slug)} is not a plain file name")
    store_path = Path(store_path)
    metrics_dir = make_dirs(store_path, store_path / METRICS_DIR)
    steps_path = step_log.path_in(metrics_dir, run_slug)
    make_dirs(store_path, steps_path.parent)
    loggers: list[RunLogger] = [CSVLogger(refuse_links(store_path, metrics_dir / f"{run_slug}.csv"),
                                          refuse_links(store_path, steps_path))]
    if "tensorboard" in wanted:
        log_dir = make_dirs(store_path, store_path / TENSORBOARD_DIR / run_slug)
        loggers.append(TensorBoardLogger(log_dir))
    return loggers
