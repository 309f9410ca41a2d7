"""Results directory: fresh names, atomic files, runs.jsonl rows and their round trip, torn writes."""

from __future__ import annotations

import json
import math

import pytest

from normkit_lab.errors import ConfigError
from normkit_lab.records import EpochRecord, RunId, RunResult
from normkit_lab.store.results import (
    RUNS_FILE,
    ResultsDir,
    atomic_write_text,
    csv_text,
    json_text,
    new_results_dir,
    run_rows,
)

ENV = {"host": "h", "torch_version": "2.x", "device": "cpu"}


def record(epoch: int, val_acc: float) -> EpochRecord:
    return EpochRecord(epoch=epoch, train_loss=1.0 / (epoch + 1), train_acc=0.5, val_loss=0.9,
                       val_acc=val_acc, val_top5=None, epoch_time_s=0.5, throughput=1000.0, peak_mem_mb=12.0,
                       lr=0.1)


def run(norm: str, seed: int, accs: list[float], status: str = "ok", extras: dict | None = None) -> RunResult:
    return RunResult(norm=norm, seed=seed, status=status, epochs=[record(i, a) for i, a in enumerate(accs)],
                     params=100, extras=extras or {})


def test_new_results_dir_never_reuses_a_name(tmp_path):
    first = new_results_dir(tmp_path / "exp")
    second = new_results_dir(tmp_path / "exp")
    third = new_results_dir(tmp_path / "exp")
    assert [first.name, second.name, third.name] == ["exp", "exp-1", "exp-2"]


def test_uncreatable_dir_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot create results directory .*; choose another --out"):
        new_results_dir(tmp_path / "file" / "exp")


def test_default_dir_is_timestamped_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = new_results_dir(None)
    assert path.parent.name == "runs" and path.name.endswith("-compare") and path.is_dir()


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "a.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_rows_round_trip_with_extras_and_a_run_diverged_before_any_epoch(tmp_path):
    store = ResultsDir.create(tmp_path / "r", "norms: [bn]\n", {"python": "3"})
    runs = [run("bn", 0, [0.5, 0.7], extras={"diag": {"x": 1}}),
            run("bnn", 0, [], status="diverged", extras={"diverged_at": {"epoch": 0, "step": 3}})]
    for r in runs:
        store.append_run(r, ENV)
    rows = store.rows()
    assert len(rows) == 3
    assert rows[0]["host"] == "h" and rows[0]["epoch"] == 0 and "extras" not in rows[0]
    assert rows[2]["epoch"] is None and rows[2]["status"] == "diverged"
    assert store.runs() == runs
    assert store.finished() == {RunId.of("bn", 0), RunId.of("bnn", 0)}


def test_run_rows_one_per_epoch():
    rows = run_rows(run("ln", 3, [0.1, 0.2, 0.3]), ENV)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert {r["seed"] for r in rows} == {3} and all(r["device"] == "cpu" for r in rows)


def test_torn_last_line_is_ignored_then_cut_before_the_next_append(tmp_path):
    store = ResultsDir.create(tmp_path / "r", "norms: [bn]\n", {})
    store.append_run(run("bn", 0, [0.5]), ENV)
    with (store.path / RUNS_FILE).open("a") as f:
        f.write('{"norm": "bn", "seed": 1, "sta')  # a crash in the middle of a write
    assert store.finished() == {RunId.of("bn", 0)}
    store.append_run(run("bn", 1, [0.6]), ENV)
    assert store.finished() == {RunId.of("bn", 0), RunId.of("bn", 1)}
    assert all(json.loads(line) for line in (store.path / RUNS_FILE).read_text().splitlines())


def test_damaged_middle_line_is_an_error(tmp_path):
    store = ResultsDir.create(tmp_path / "r", "norms: [bn]\n", {})
    (store.path / RUNS_FILE).write_text("not json\n")
    with pytest.raises(ConfigError, match=r"runs.jsonl:1 is not a JSON row"):
        store.rows()


def test_open_needs_a_results_directory(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        ResultsDir.open(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"has no config\.yaml"):
        ResultsDir.open(tmp_path)


def test_json_and_csv_write_non_finite_as_empty():
    assert json.loads(json_text({"a": math.nan, "b": [math.inf, 1.0]})) == {"a": None, "b": [None, 1.0]}
    assert csv_text([{"norm": "bn", "p": math.nan}]) == "norm,p\nbn,\n"
    assert csv_text([]) == ""
