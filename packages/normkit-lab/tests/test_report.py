"""Loading and merging results directories; summary files, figures and report.html."""

from __future__ import annotations

import dataclasses

import pytest

from normkit_lab.analysis import plots
from normkit_lab.analysis.report import REPORT_HTML, load_results, merge_into, write_summary
from normkit_lab.errors import ConfigError
from normkit_lab.records import EpochRecord, RunResult
from normkit_lab.store.results import SUMMARY_CSV, SUMMARY_JSON, ResultsDir
from normkit_lab.study import config

PNG = b"\x89PNG\r\n\x1a\n"
ENV = {"host": "h", "torch_version": "2.x", "device": "cpu"}


def run(norm: str, seed: int, acc: float) -> RunResult:
    epochs = [EpochRecord(epoch=i, train_loss=0.5, train_acc=0.5, val_loss=0.5, val_acc=acc - 0.1 + 0.1 * i,
                          val_top5=None, epoch_time_s=1.0, throughput=100.0, peak_mem_mb=10.0, lr=0.1)
              for i in range(2)]
    return RunResult(norm=norm, seed=seed, status="ok", epochs=epochs, params=1000, extras={})


def make_dir(path, norms: str, seeds: str, runs: list[RunResult], **values) -> ResultsDir:
    cfg = config.build_config({"dataset": "digits", "norms": norms, "seeds": seeds, "epochs": 2, "batch_size": 128,
                               **values})
    store = ResultsDir.create(path, config.save_yaml(cfg), {"host": "h"})
    for r in runs:
        store.append_run(r, ENV)
    return store


def test_one_directory(tmp_path):
    make_dir(tmp_path / "a", "bn,ln", "2", [run("bn", 0, 0.8), run("ln", 0, 0.9), run("bn", 1, 0.8)])
    results = load_results([tmp_path / "a"])
    assert results.norms == ["bn", "ln"] and results.baseline == "bn" and len(results.runs) == 3
    assert load_results([tmp_path / "a"], baseline="ln").baseline == "ln"


def test_merge_seeds_and_norms_of_the_same_configuration(tmp_path):
    make_dir(tmp_path / "a", "bn,ln", "0,1", [run("bn", 0, 0.8), run("ln", 0, 0.9)], device="cpu")
    make_dir(tmp_path / "b", "bn,gn", "2,3", [run("bn", 2, 0.8), run("gn", 2, 0.7)], device="auto")
    results = load_results([tmp_path / "a", tmp_path / "b"])
    assert results.norms == ["bn", "ln", "gn"]
    assert {(r.norm, r.seed) for r in results.runs} == {("bn", 0), ("ln", 0), ("bn", 2), ("gn", 2)}
    merged = merge_into(results, tmp_path / "m")
    again = load_results([merged.path])
    assert again.norms == results.norms and again.runs == results.runs
    assert again.config["seeds"] == [0, 2]


def test_refuse_different_configurations(tmp_path):
    make_dir(tmp_path / "a", "bn", "1", [run("bn", 0, 0.8)])
    make_dir(tmp_path / "b", "bn", "1-1", [run("bn", 1, 0.8)], lr=0.05)
    with pytest.raises(ConfigError, match=r"configs differ \(lr: 0.02 vs 0.05\)"):
        load_results([tmp_path / "a", tmp_path / "b"])


def test_refuse_duplicate_runs_and_repeated_directories(tmp_path):
    make_dir(tmp_path / "a", "bn", "1", [run("bn", 0, 0.8)])
    make_dir(tmp_path / "b", "bn", "1", [run("bn", 0, 0.7)])
    with pytest.raises(ConfigError, match="bn seed 0 is in both"):
        load_results([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ConfigError, match="given twice"):
        load_results([tmp_path / "a", tmp_path / "a"])


def test_baseline_must_be_present(tmp_path):
    make_dir(tmp_path / "a", "bn", "1", [run("bn", 0, 0.8)])
    with pytest.raises(ConfigError, match="baseline 'gn' is not among"):
        load_results([tmp_path / "a"], baseline="gn")


def _two_norms(tmp_path) -> ResultsDir:
    return make_dir(tmp_path / "a", "bn,ln", "2",
                    [run("bn", 0, 0.8), run("ln", 0, 0.9), run("bn", 1, 0.82), run("ln", 1, 0.88)])


def test_summary_written(tmp_path):
    store = _two_norms(tmp_path)
    write_summary(store, load_results([store.path]))
    assert (store.path / SUMMARY_CSV).read_text().startswith("norm,cell,tuned,runs,ok,diverged,failed,metric")
    assert (store.path / SUMMARY_JSON).is_file()


def test_figures_and_report_written(tmp_path):
    pytest.importorskip("matplotlib")
    store = _two_norms(tmp_path)
    write_summary(store, load_results([store.path]))
    assert not list(store.path.glob("*.png"))
    assert "Figures are drawn when the comparison finishes" in (store.path / REPORT_HTML).read_text()
    write_summary(store, load_results([store.path]), figures=True)
    written = sorted(p.name for p in store.path.glob("*.png"))
    assert written == ["curves.png", "forest.png", "primary_metric.png"]
    assert all((store.path / p).read_bytes()[:8] == PNG for p in written)
    assert (store.path / REPORT_HTML).read_text().count("data:image/png;base64,") == 3


def test_no_plots_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    store = _two_norms(tmp_path)
    write_summary(store, load_results([store.path]), figures=True)
    assert not list(store.path.glob("*.png"))
    assert "pip install matplotlib" in (store.path / REPORT_HTML).read_text()


def _tuned(norm: str, seed: int, lr: float, phase: str = "compare") -> RunResult:
    return dataclasses.replace(run(norm, seed, 0.9), phase=phase, tuned={"lr": lr})


def test_tuned_comparisons_merge_when_each_norm_ran_alike(tmp_path):
    """Two directories that tuned on the same seeds hold the same tuning runs: they count once."""
    values = {"tune": "lr=0.01,0.05", "tune_seeds": "100,"}
    tuning = [_tuned(n, 100, lr, "tune") for n in ("bn", "gn") for lr in (0.01, 0.05)]
    a = make_dir(tmp_path / "a", "bn,gn", "0,1", tuning + [_tuned(n, s, 0.05) for n in ("bn", "gn") for s in (0, 1)],
                 **values)
    b = make_dir(tmp_path / "b", "bn,gn", "2,3", tuning + [_tuned(n, s, 0.05) for n in ("bn", "gn") for s in (2, 3)],
                 **values)
    merged = load_results([a.path, b.path])
    assert sorted((r.phase, r.norm, r.seed) for r in merged.runs if r.phase == "tune") == sorted(
        ("tune", n, 100) for n in ("bn", "gn") for _ in (0.01, 0.05))
    assert sorted(r.seed for r in merged.runs if r.phase == "compare" and r.norm == "gn") == [0, 1, 2, 3]
    other = make_dir(tmp_path / "c", "bn,gn", "4", [*tuning, _tuned("bn", 4, 0.05), _tuned("gn", 4, 0.01)], **values)
    with pytest.raises(ConfigError, match=r"gn ran with \{'lr': 0.05\} in one directory and \{'lr': 0.01\}"):
        load_results([a.path, other.path])
