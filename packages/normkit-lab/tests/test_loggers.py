"""Per-run loggers: the CSV per epoch and after a resume, TensorBoard events read back (steps, epochs,
purge after a resume or a restart), the --log kind checks and make_loggers' layout."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import torch

from normkit_lab import step_log
from normkit_lab.errors import ConfigError
from normkit_lab.records import EpochRecord
from normkit_lab.runs import loggers
from normkit_lab.runs.loggers import (
    LOG_KINDS,
    TENSORBOARD_MISSING,
    CSVLogger,
    TensorBoardLogger,
    check_log_kinds,
    make_loggers,
)
from normkit_lab.store.results import epoch_fields

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def record(epoch: int, val_acc: float = 0.5, test_acc: float | None = None) -> EpochRecord:
    return EpochRecord(epoch=epoch, train_loss=1.0 / (epoch + 1), train_acc=0.25, val_loss=0.75, val_acc=val_acc,
                       val_top5=None, epoch_time_s=2.0, throughput=1000.0, peak_mem_mb=12.0, lr=0.1,
                       test_acc=test_acc)


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in `log_dir` as (step, value) pairs, as TensorBoard shows them (purges applied)."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def age_event_files(log_dir: Path, seconds: int = 10) -> None:
    """Date the existing event files `seconds` earlier. TensorBoard reads a directory's files in name order,
    and a name starts with the writer's start time in whole seconds: attempts that in real use run in
    different processes, minutes apart, run here in one process within the same second."""
    for path in log_dir.iterdir():
        m = re.fullmatch(r"(events\.out\.tfevents\.)(\d+)(\..*)", path.name)
        assert m, path.name
        path.rename(path.with_name(f"{m[1]}{int(m[2]) - seconds:010d}{m[3]}"))


def train(logger: TensorBoardLogger | CSVLogger, steps: range, epoch_every: int, first_epoch: int,
          offset: float = 0.0) -> None:
    """Feed `logger` as the training loop does: loss = step + offset, lr = step / 100, an epoch every
    `epoch_every` steps (epoch numbers from `first_epoch`, val_acc = epoch / 10)."""
    epoch = first_epoch
    for step in steps:
        logger.on_step(step, torch.tensor(step + offset), step / 100)
        if step % epoch_every == 0:
            logger.on_epoch(record(epoch, val_acc=epoch / 10))
            epoch += 1


# --- CSV -------------------------------------------------------------------------------------------------


def test_csv_written_per_epoch(tmp_path):
    path = tmp_path / "run.csv"
    logger = CSVLogger(path)
    assert not path.exists()  # nothing written until the run's checkpoint (if any) was checked
    logger.on_resume([], 0)  # a fresh start
    header, rows = read_csv(path)
    assert header == list(epoch_fields()) and rows == []  # exists, header only, from the start

    logger.on_step(1, torch.tensor(0.5), 0.1)
    logger.on_epoch(record(0, val_acc=0.5, test_acc=0.25))
    header, rows = read_csv(path)
    assert header == list(epoch_fields())
    assert len(rows) == 1
    assert rows[0]["epoch"] == "0" and float(rows[0]["val_acc"]) == 0.5 and float(rows[0]["test_acc"]) == 0.25
    assert rows[0]["val_top5"] == "" and rows[0]["val_bpb"] == ""  # None as an empty cell

    logger.on_epoch(record(1, val_acc=0.625))
    logger.close()
    _, rows = read_csv(path)
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert float(rows[1]["train_loss"]) == 0.5 and float(rows[1]["val_acc"]) == 0.625
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.csv", "steps"]  # no temporary file left behind
    assert [p.name for p in (tmp_path / "steps").iterdir()] == ["run.csv"]


def test_csv_after_resume_holds_exactly_the_checkpoint_epochs(tmp_path):
    path = tmp_path / "run.csv"
    first = CSVLogger(path)
    for e in range(3):  # an interrupted attempt got to epoch 2; its checkpoint has epochs 0 and 1
        first.on_epoch(record(e, val_acc=0.1 * e))

    second = CSVLogger(path)
    second.on_resume([record(0, val_acc=0.0), record(1, val_acc=0.1)], step=20)
    _, rows = read_csv(path)
    assert [r["epoch"] for r in rows] == ["0", "1"]

    second.on_epoch(record(2, val_acc=0.9))
    second.close()
    _, rows = read_csv(path)
    assert [(r["epoch"], float(r["val_acc"])) for r in rows] == [("0", 0.0), ("1", 0.1), ("2", 0.9)]


def test_csv_fresh_restart_drops_an_earlier_attempts_rows(tmp_path):
    path = tmp_path / "run.csv"
    CSVLogger(path).on_epoch(record(0))
    restarted = CSVLogger(path)
    assert len(read_csv(path)[1]) == 1  # kept until the run knows it has no (valid) checkpoint
    restarted.on_resume([], 0)  # the run starts again from scratch
    assert read_csv(path)[1] == []


def test_step_log_holds_every_step_with_its_epoch_loss_and_lr(tmp_path):
    """The per-step log curves.png draws: each step's own loss and learning rate, not the epoch's first."""
    logger = CSVLogger(tmp_path / "run.csv")
    logger.on_resume([], 0)
    assert not logger.steps_path.exists()
    train(logger, range(1, 7), epoch_every=3, first_epoch=0)
    assert step_log.read(logger.steps_path) == [(s, (s - 1) // 3, float(s), s / 100) for s in range(1, 7)]
    logger.on_step(7, torch.tensor(float("nan")), 0.07)  # diverged in epoch 2: its step is kept on close
    logger.close()
    assert step_log.read(logger.steps_path)[-1][:2] == (7, 2)
    assert logger.steps_path.read_text().splitlines()[0] == "step,epoch,loss,lr"
    assert logger.steps_path == tmp_path / "steps" / "run.csv"


def test_step_log_after_resume_holds_exactly_the_checkpoint_steps(tmp_path):
    first = CSVLogger(tmp_path / "run.csv")
    first.on_resume([], 0)
    train(first, range(1, 11), epoch_every=5, first_epoch=0)  # crashed after step 10, checkpoint at step 5
    with open(first.steps_path, "a", encoding="utf-8") as f:
        f.write("11,2,0.")  # a row cut short by the crash
    second = CSVLogger(tmp_path / "run.csv")
    second.on_resume([record(0)], step=5)
    assert [row[0] for row in step_log.read(second.steps_path)] == [1, 2, 3, 4, 5]
    train(second, range(6, 9), epoch_every=8, first_epoch=1, offset=100)
    assert step_log.read(second.steps_path)[5:] == [(s, 1, 100.0 + s, s / 100) for s in range(6, 9)]
    CSVLogger(tmp_path / "run.csv").on_resume([], 0)  # started again from scratch
    assert step_log.read(second.steps_path) == [] and not second.steps_path.exists()


def test_reported_metrics_go_to_the_csv_and_tensorboard(tmp_path):
    """Your own code's metrics, at its own epoch numbers; an epoch reported again replaces what follows."""
    csv_logger, tb = CSVLogger(tmp_path / "run.csv"), TensorBoardLogger(tmp_path / "tb")
    for lg in (csv_logger, tb):
        lg.on_resume([], 0)
        for epoch in (1, 2, 3):
            lg.on_reported(epoch, {"val_f1": epoch / 10, "test_f1": epoch / 20})
        lg.on_reported(2, {"val_f1": 0.9, "test_f1": 0.8})  # the program restarted from its epoch 2
        lg.close()
    header, rows = read_csv(csv_logger.path)
    assert header == ["epoch", "val_f1", "test_f1"]
    assert [(r["epoch"], float(r["val_f1"])) for r in rows] == [("1", 0.1), ("2", 0.9)]
    assert not csv_logger.steps_path.exists()
    got = scalars(tmp_path / "tb")
    assert got["epoch/val_f1"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.9))]
    assert got["epoch/epoch"] == [(1, 1.0), (2, 2.0)]

    at_steps = TensorBoardLogger(tmp_path / "tb2")
    at_steps.on_reported(0, {"loss": 2.0}, step=100)
    at_steps.on_reported(1, {"loss": 1.0}, step=200)
    at_steps.close()
    assert scalars(tmp_path / "tb2")["epoch/loss"] == [(100, 2.0), (200, 1.0)]


# --- TensorBoard -----------------------------------------------------------------------------------------


def test_tensorboard_events_read_back(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    train(logger, range(1, 7), epoch_every=3, first_epoch=0)
    logger.close()
    logger.close()  # idempotent

    got = scalars(tmp_path)
    assert [s for s, _ in got["train/loss_step"]] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v in got["train/loss_step"]] == pytest.approx([1, 2, 3, 4, 5, 6])
    assert got["train/lr"] == [(s, pytest.approx(s / 100)) for s in range(1, 7)]
    # epoch metrics at the step that ended the epoch; None fields (val_top5, test_*, *_bpb) are not logged
    assert got["epoch/epoch"] == [(3, 0.0), (6, 1.0)]
    assert got["epoch/val_acc"] == [(3, 0.0), (6, pytest.approx(0.1))]
    assert got["epoch/train_loss"] == [(3, 1.0), (6, 0.5)]
    numeric = {"epoch", "train_loss", "train_acc", "val_loss", "val_acc", "epoch_time_s", "throughput",
               "peak_mem_mb", "lr"}
    assert set(got) == {"train/loss_step", "train/lr"} | {f"epoch/{f}" for f in numeric}


def test_tensorboard_flushes_at_epoch_end(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    train(logger, range(1, 3), epoch_every=2, first_epoch=0)
    got = scalars(tmp_path)  # still open: readable once the epoch ended
    assert [s for s, _ in got["train/loss_step"]] == [1, 2] and got["epoch/epoch"] == [(2, 0.0)]
    logger.close()


def test_tensorboard_resume_purges_what_an_interrupted_attempt_wrote_after_the_checkpoint(tmp_path):
    first = TensorBoardLogger(tmp_path)
    train(first, range(1, 11), epoch_every=5, first_epoch=0)  # epochs 0 (step 5) and 1 (step 10)
    first.close()  # crashed after step 10; the checkpoint is from the end of epoch 0, step 5
    age_event_files(tmp_path)

    second = TensorBoardLogger(tmp_path)
    second.on_resume([record(0, val_acc=0.0)], step=5)
    train(second, range(6, 9), epoch_every=8, first_epoch=1, offset=100)  # new values, epoch 1 ends at step 8
    second.close()

    got = scalars(tmp_path)
    assert got["train/loss_step"] == [(s, s) for s in range(1, 6)] + [(s, 100 + s) for s in range(6, 9)]
    assert [s for s, _ in got["train/lr"]] == list(range(1, 9))
    assert got["epoch/epoch"] == [(5, 0.0), (8, 1.0)]  # epoch 0 kept from the first attempt, its epoch 1 gone


def test_tensorboard_fresh_restart_hides_an_earlier_attempt(tmp_path):
    first = TensorBoardLogger(tmp_path)
    train(first, range(1, 5), epoch_every=2, first_epoch=0)
    first.close()  # crashed before any checkpoint: the run starts again from scratch
    age_event_files(tmp_path)

    second = TensorBoardLogger(tmp_path)
    train(second, range(1, 3), epoch_every=2, first_epoch=0, offset=100)
    second.close()

    got = scalars(tmp_path)
    assert got["train/loss_step"] == [(1, 101.0), (2, 102.0)]
    assert got["epoch/epoch"] == [(2, 0.0)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tensorboard_cuda_losses_are_batched_and_all_logged(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    n = loggers.LOSS_SYNC_EVERY + 7
    for step in range(1, n + 1):
        logger.on_step(step, torch.tensor(float(step), device="cuda"), 0.1)
    assert len(logger._pending) == 7  # read back once per LOSS_SYNC_EVERY steps, the rest still on the device
    logger.on_epoch(record(0))
    assert logger._pending == []
    logger.close()
    assert scalars(tmp_path)["train/loss_step"] == [(s, float(s)) for s in range(1, n + 1)]


# --- kinds and layout ------------------------------------------------------------------------------------


def test_unknown_kind_is_one_line_listing_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError) as err:
        check_log_kinds(["tensorboard", "wandb"])
    msg = str(err.value)
    assert "\n" not in msg and "'wandb'" in msg and all(k in msg for k in LOG_KINDS)
    with pytest.raises(ConfigError):
        make_loggers(["nope"], tmp_path, "run")
    assert not list(tmp_path.iterdir())  # checked before anything is created
    assert check_log_kinds([]) == ()
    assert check_log_kinds(["tensorboard", "tensorboard"]) == ("tensorboard",)
    assert check_log_kinds("tensorboard") == ("tensorboard",)


def test_tensorboard_not_installed(monkeypatch, tmp_path):
    real = loggers.find_spec
    monkeypatch.setattr(loggers, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        check_log_kinds(["tensorboard"])
    assert str(err.value) == TENSORBOARD_MISSING
    assert "pip install 'tensorboard>=2.14'" in TENSORBOARD_MISSING  # normkit-lab is on no index: name the package
    with pytest.raises(ConfigError, match="needs the tensorboard package"):
        make_loggers(["tensorboard"], tmp_path, "run")
    assert check_log_kinds([]) == ()  # not asked for: not needed
    assert [type(lg) for lg in make_loggers([], tmp_path, "run")] == [CSVLogger]


def test_make_loggers_layout(tmp_path):
    store = tmp_path / "store"
    only_csv = make_loggers([], store, "compare-bn-s0-abc")
    assert [type(lg) for lg in only_csv] == [CSVLogger]
    assert only_csv[0].path == store / "metrics" / "compare-bn-s0-abc.csv" and only_csv[0].path.parent.is_dir()
    assert only_csv[0].steps_path == store / "metrics" / "steps" / "compare-bn-s0-abc.csv"
    assert not (store / "tensorboard").exists()

    both = make_loggers(["tensorboard"], store, "compare-gn-s1-def")
    assert [type(lg) for lg in both] == [CSVLogger, TensorBoardLogger]
    assert both[0].path == store / "metrics" / "compare-gn-s1-def.csv"
    assert both[1].log_dir == store / "tensorboard" / "compare-gn-s1-def" and both[1].log_dir.is_dir()
    for lg in both:
        lg.on_step(1, torch.tensor(0.5), 0.1)
        lg.on_epoch(record(0))
        lg.close()
    assert scalars(both[1].log_dir)["epoch/epoch"] == [(1, 0.0)]

    for bad in ("", ".", "..", "../escape", "a/b"):
        with pytest.raises(ConfigError, match="plain file name"):
            make_loggers([], store, bad)


def test_step_log_reads_losses_back_in_batches_and_keeps_every_step(tmp_path):
    logger = CSVLogger(tmp_path / "run.csv")
    logger.on_resume([], 0)
    n = loggers.LOSS_SYNC_EVERY
    train(logger, range(1, 2 * n + 8), epoch_every=2 * n, first_epoch=0)  # an epoch of 2n steps, then 7 more
    assert len(logger._pending) == 7  # at most LOSS_SYNC_EVERY tensors held; the rest are numbers already
    logger.close()
    got = step_log.read(logger.steps_path)
    assert [row[0] for row in got] == list(range(1, 2 * n + 8))
    assert {row[1] for row in got[: 2 * n]} == {0} and {row[1] for row in got[2 * n:]} == {1}
    assert [row[2] for row in got] == [float(s) for s in range(1, 2 * n + 8)]
