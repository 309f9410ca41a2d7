"""run_compare with a stand-in train_run: order, divergence, interruption and resume, callbacks."""

from __future__ import annotations

import os
import signal
import time

import pytest

from normkit_lab.records import EpochRecord, RunId, RunResult
from normkit_lab.runs import builtin
from normkit_lab.store.results import SUMMARY_JSON
from normkit_lab.study import compare, config
from normkit_lab.study.plan import compare_plan
from normkit_lab.study.progress import PlainProgress


class FakeTrainer:
    """Records calls; `diverge` runs end "diverged"; the `interrupt_at`-th call gets a real Ctrl-C (SIGINT:
    a KeyboardInterrupt merely raised by a run's code is that run's failure, see test_run_failures.py)."""

    def __init__(self, diverge=(), interrupt_at: int | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.callbacks: list[tuple] = []
        self.diverge = set(diverge)
        self.interrupt_at = interrupt_at

    def __call__(self, cfg, norm, seed, *, on_epoch=None, callbacks=(), **kwargs):
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # the handler raises KeyboardInterrupt here
        self.calls.append((norm, seed))
        self.callbacks.append(tuple(callbacks))
        acc = 0.8 + 0.01 * seed + (0.05 if norm != "bn" else 0.0)
        records = [EpochRecord(e, 0.5, 0.5, 0.5, acc, None, 0.1, 100.0, 5.0, 0.1) for e in range(cfg.epochs)]
        status = "diverged" if (norm, seed) in self.diverge else "ok"
        if status == "diverged":
            records = records[:1]
        for r in records:
            if on_epoch:
                on_epoch(r)
        return RunResult(norm, seed, status, records, 10, {})


@pytest.fixture
def cfg():
    return config.build_config({"dataset": "digits", "norms": "bn,ln", "seeds": "3", "epochs": 2, "batch_size": 128})


def test_every_norm_runs_every_seed_and_divergence_does_not_stop(cfg, tmp_path, monkeypatch, capsys):
    trainer = FakeTrainer(diverge={("ln", 1)})
    monkeypatch.setattr(builtin, "train_run", trainer)
    store = compare.create_store(cfg, tmp_path / "out")
    results = compare.run_compare(cfg, store, progress=PlainProgress())
    assert trainer.calls == [(r.norm, r.seed) for r in compare_plan(cfg)]
    assert trainer.calls == [("bn", 0), ("ln", 0), ("bn", 1), ("ln", 1), ("bn", 2), ("ln", 2)]
    _, ln = results.summary().rows
    assert ln.diverged == 1 and ln.primary.n == 2 and ln.vs_baseline.n == 2
    assert ln.vs_baseline.mean == pytest.approx(5.0)
    out = capsys.readouterr().out
    assert "[4/6] ln seed 1: diverged" in out and "[1/6] bn seed 0 epoch 2/2" in out
    assert (store.path / SUMMARY_JSON).is_file()


def test_interrupt_keeps_finished_runs_and_resume_runs_only_the_rest(cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(builtin, "train_run", FakeTrainer(interrupt_at=3))
    store = compare.create_store(cfg, tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        compare.run_compare(cfg, store)
    assert store.finished() == {RunId.of("bn", 0), RunId.of("ln", 0), RunId.of("bn", 1)}

    again = FakeTrainer()
    monkeypatch.setattr(builtin, "train_run", again)
    cfg2, store2 = compare.open_store(store.path)
    assert cfg2.to_dict() == cfg.to_dict() and store2.path == store.path
    results = compare.run_compare(cfg2, store2)
    assert again.calls == [("ln", 1), ("bn", 2), ("ln", 2)]
    assert len(results.runs) == 6


def test_resume_takes_runtime_overrides_only_from_the_caller(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "out")
    cfg2, _ = compare.open_store(store.path, {"device": "cpu"})
    assert cfg2.train.device == "cpu" and cfg2.train.epochs == 2


def test_diagnostics_callbacks_are_made_fresh_for_every_run(cfg, tmp_path, monkeypatch):
    trainer = FakeTrainer()
    monkeypatch.setattr(builtin, "train_run", trainer)
    cfg.diagnostics = True
    compare.run_compare(cfg, compare.create_store(cfg, tmp_path / "out"))
    made = [cbs[0] for cbs in trainer.callbacks]
    assert len(made) == 6 and len(set(map(id, made))) == 6
    assert all(type(cb).__name__ == "DiagnosticsCallback" for cb in made)


class BrokenNorm(FakeTrainer):
    """A norm whose build raises (a plugin bug): `broken` norms fail, the others train."""

    def __init__(self, broken, exc: Exception) -> None:
        super().__init__()
        self.broken, self.exc = set(broken), exc

    def __call__(self, cfg, norm, seed, **kwargs):
        if norm in self.broken:
            self.calls.append((norm, seed))
            raise self.exc
        return super().__call__(cfg, norm, seed, **kwargs)


@pytest.mark.parametrize("exc", [RuntimeError("mat1 and mat2 shapes\ncannot be multiplied"), ValueError(""),
                                 ZeroDivisionError("division by zero"), MemoryError()])
def test_a_failing_norm_is_recorded_and_the_others_run_on(cfg, tmp_path, monkeypatch, capsys, exc):
    monkeypatch.setattr(builtin, "train_run", BrokenNorm({"ln"}, exc))
    store = compare.create_store(cfg, tmp_path / "out")
    results = compare.run_compare(cfg, store, progress=PlainProgress())
    failed = [r for r in results.runs if r.status == "failed"]
    assert sorted((r.norm, r.seed) for r in failed) == [("ln", 0), ("ln", 1), ("ln", 2)]
    assert all(r.error.startswith(f"ln failed: {type(exc).__name__}") and "\n" not in r.error for r in failed)
    bn, ln = results.summary().rows
    assert (bn.primary.n, bn.failed, ln.failed, ln.primary.n) == (3, 0, 3, 0)
    rows = [r for r in store.rows() if r["norm"] == "ln"]
    assert len(rows) == 3 and all(r["epoch"] is None and r["status"] == "failed" for r in rows)
    assert "[2/6] ln seed 0: ln failed:" in capsys.readouterr().out


def test_resume_retries_failed_runs_only(cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(builtin, "train_run", BrokenNorm({"ln"}, RuntimeError("bug")))
    store = compare.create_store(cfg, tmp_path / "out")
    compare.run_compare(cfg, store)
    fixed = FakeTrainer()
    monkeypatch.setattr(builtin, "train_run", fixed)
    results = compare.run_compare(*compare.open_store(store.path))
    assert fixed.calls == [("ln", 0), ("ln", 1), ("ln", 2)]
    assert {r.status for r in results.runs} == {"ok"} and len(results.runs) == 6
    assert [s.failed for s in results.summary().rows] == [0, 0]


def test_ctrl_c_is_not_a_failed_run(cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(builtin, "train_run", FakeTrainer(interrupt_at=1))  # a real SIGINT while ln trains
    store = compare.create_store(cfg, tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        compare.run_compare(cfg, store)
    assert store.finished() == {RunId.of("bn", 0)} and len(store.rows()) == 2


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(5)])
def test_a_keyboardinterrupt_or_systemexit_raised_by_a_norm_is_its_failure(cfg, tmp_path, monkeypatch, exc):
    monkeypatch.setattr(builtin, "train_run", BrokenNorm({"ln"}, exc))
    store = compare.create_store(cfg, tmp_path / "out")
    compare.run_compare(cfg, store)
    statuses = {(r.norm, r.seed): r.status for r in store.runs()}
    assert statuses[("ln", 0)] == "failed" and statuses[("bn", 0)] == "ok" and len(statuses) == 6
