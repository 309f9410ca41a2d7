"""Per-norm summary: final accuracy over finished seeds, pairs only where both norms finished."""

from __future__ import annotations

import pytest
from scipy import stats as sps

from normkit_lab.summary import summarize, summary_rows
from normkit_lab.training import EpochRecord, RunResult


def run(norm: str, seed: int, accs: list[float], status: str = "ok", seconds: float = 1.0) -> RunResult:
    epochs = [EpochRecord(epoch=i, train_loss=0.5, train_acc=0.5, val_loss=0.5, val_acc=a, val_top5=None,
                          epoch_time_s=seconds, throughput=100 / seconds, peak_mem_mb=10.0 + i, lr=0.1)
              for i, a in enumerate(accs)]
    return RunResult(norm=norm, seed=seed, status=status, epochs=epochs, params=1000 + len(norm), extras={})


def test_summary_pairs_by_seed_over_seeds_both_finished():
    runs = [
        run("bn", 0, [0.5, 0.80]), run("bn", 1, [0.5, 0.82]), run("bn", 2, [0.5, 0.84]),
        run("gn", 0, [0.6, 0.85]), run("gn", 1, [0.6, 0.86]), run("gn", 2, [0.6], status="diverged"),
    ]
    bn, gn = summarize(runs, ["bn", "gn"], "bn")
    assert bn.vs_baseline is None and bn.final_acc.n == 3 and bn.final_acc.mean == pytest.approx(82.0)
    assert gn.final_acc.n == 2 and gn.diverged == 1 and gn.runs == 3
    assert gn.best_acc.mean == pytest.approx(85.5)
    ref = sps.ttest_rel([85.0, 86.0], [80.0, 82.0])
    assert gn.vs_baseline.n == 2 and gn.vs_baseline.mean == pytest.approx(4.5)
    assert gn.vs_baseline.p_value == pytest.approx(ref.pvalue)
    assert gn.peak_mem_mb == 11.0 and gn.params == 1002 and gn.time_per_epoch_s == 1.0


def test_one_seed_reports_n_too_small():
    bn, ln = summarize([run("bn", 0, [0.8]), run("ln", 0, [0.9])], ["bn", "ln"], "bn")
    assert bn.final_acc.sem is None
    assert ln.vs_baseline.note == "n too small" and ln.vs_baseline.low is None
    row = summary_rows([bn, ln], "bn")[1]
    assert row["diff_note"] == "n too small" and row["diff_ci95_low"] is None
    assert row["diff_mean"] == pytest.approx(10.0)


def test_norm_without_runs_still_has_a_row():
    _, ln = summarize([run("bn", 0, [0.8])], ["bn", "ln"], "bn")
    assert ln.runs == 0 and ln.final_acc.mean is None and ln.vs_baseline.note == "no paired seeds"
    assert ln.params is None and ln.time_per_epoch_s is None
