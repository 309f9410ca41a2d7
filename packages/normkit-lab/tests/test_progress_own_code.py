"""Progress of the user's own code: its epochs are shown with its own numbers and counted as reported, and
the ETA counts the epochs it trains (told with {epochs}, or learned from its finished runs), never --epochs."""

from __future__ import annotations

import io

import pytest

from normkit_lab.records import RunResult
from normkit_lab.reporting import ReportedEpoch
from normkit_lab.study import compare
from normkit_lab.study.config import build_config
from normkit_lab.study.plan import compare_plan
from normkit_lab.study.progress import PlainProgress, Progress, RichProgress


def _command(command: str) -> tuple:
    cfg = build_config({"norms": "bn,gn", "seeds": 1, "command": command, "epochs": 1})
    return cfg, compare.run_epochs(cfg), compare_plan(cfg)


def _ok(run_id, epochs: list[int]) -> RunResult:
    return RunResult(run_id.norm, run_id.seed, "ok", [ReportedEpoch(e, {"test_acc": 0.9}) for e in epochs], None,
                     trainer="command")


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr("normkit_lab.study.progress.time.monotonic", lambda: now[0])
    return now


def test_without_epochs_in_the_command_the_eta_waits_for_a_finished_run_and_uses_its_count(clock):
    _, of, (a, b) = _command("python train.py --norm {norm}")  # trains its own epochs; --epochs 1 is not them
    assert of(a) is None
    progress = Progress()
    progress.start(total=2, done=0, epochs=of, left=None)
    progress.run_start(a)
    for epoch in range(4):
        clock[0] += 1.0
        progress.epoch_end(a, ReportedEpoch(epoch, {"test_acc": 0.9}))
        assert progress.eta_seconds() is None  # its count is not known yet: no ETA rather than a wrong one
    progress.run_end(_ok(a, [0, 1, 2, 3]))
    assert progress.eta_seconds() == pytest.approx(4.0)  # b reports 4 epochs too, at 1 s each
    progress.run_start(b)
    clock[0] += 1.0
    progress.epoch_end(b, ReportedEpoch(0, {"test_acc": 0.9}))
    assert progress.eta_seconds() == pytest.approx(3.0)


def test_with_epochs_in_the_command_its_reported_epochs_count_one_each_whatever_their_numbers(clock):
    cfg, of, (a, _) = _command("python train.py --norm {norm} --epochs {epochs}")
    assert of(a) == cfg.train.epochs == 1
    progress = Progress()
    progress.start(total=1, done=0, epochs=of, left=2)  # as if told 2 epochs
    progress.run_start(a)
    clock[0] = 1.0
    assert progress.epoch_end(a, ReportedEpoch(1, {"test_acc": 0.9})) == 1  # numbered from 1: one epoch, not 2
    assert progress.eta_seconds() == pytest.approx(1.0)


def test_plain_lines_and_bars_show_the_programs_own_epoch_numbers():
    _, of, (a, _) = _command("python train.py --norm {norm}")
    out = io.StringIO()
    plain = PlainProgress(out)
    plain.start(total=2, done=0, epochs=of, left=None)
    plain.run_start(a)
    plain.epoch_end(a, ReportedEpoch(0, {"test_acc": 0.9}))
    plain.epoch_end(a, ReportedEpoch(1, {"test_acc": 0.91}))
    lines = out.getvalue().splitlines()
    assert lines[1].endswith("] bn seed 0 epoch 0: test_acc 0.9")
    assert lines[2].endswith("] bn seed 0 epoch 1: test_acc 0.91")
    plain.run_end(_ok(a, [0, 1]))
    assert "ETA -" not in out.getvalue().splitlines()[-1]  # known from the finished run

    from rich.console import Console

    bars = RichProgress(Console(file=io.StringIO(), width=120))
    bars.start(total=2, done=0, epochs=of, left=None)
    bars.run_start(a)
    bars.epoch_end(a, ReportedEpoch(0, {"test_acc": 0.9}))
    task = next(t for t in bars.bars.tasks if t.id == bars.current[a])
    assert task.total is None and task.completed == 1 and task.fields["status"].startswith("epoch 0: ")
    bars.close()
