"""Per-(cell, norm) summary from runs.jsonl rows: the primary metric, pairing, verdicts, fallbacks."""

from __future__ import annotations

from typing import Any

import pytest
from scipy import stats as sps

from normkit_lab.analysis.summary import runs_from_results, runs_from_rows, summarize
from normkit_lab.errors import ConfigError
from normkit_lab.metrics import METRICS, margin_of, select_of
from normkit_lab.records import EpochRecord, RunResult

TEST_ACC = METRICS["test_acc"]


def rows(norm: str, seed: int, test: list[float], val: list[float] | None = None, status: str = "ok",
         cell: dict[str, Any] | None = None, phase: str = "compare", error: str | None = None,
         with_test: bool = True) -> list[dict[str, Any]]:
    """runs.jsonl rows of one run carrying the new keys (test_acc/test_loss, cell, tuned, phase)."""
    val = val or test
    out = []
    for i, (t, v) in enumerate(zip(test, val, strict=True)):
        row = {"norm": norm, "seed": seed, "status": status, "params": 1000 + len(norm), "epoch": i,
               "train_loss": 1.0 / (i + 1), "train_acc": v, "val_loss": 1.0 - v, "val_acc": v, "val_top5": None,
               "epoch_time_s": 1.0, "throughput": 100.0, "peak_mem_mb": 10.0 + i, "lr": 0.1,
               "cell": cell or {}, "tuned": {"lr": 0.1}, "phase": phase, "host": "h"}
        if with_test:
            row |= {"test_acc": t, "test_loss": 1.0 - t}
        out.append(row)
    if status == "failed":
        out = out or [{"norm": norm, "seed": seed, "status": status, "params": None, "epoch": None,
                       "cell": cell or {}, "tuned": {}, "phase": phase}]
        out[-1]["error"] = error
    return out


BN = [0.80, 0.82, 0.84, 0.81]
GAIN = [0.85, 0.86, 0.88, 0.855]


def two_norms(**kw: Any) -> list[dict[str, Any]]:
    out = []
    for seed, (b, g) in enumerate(zip(BN, GAIN, strict=True)):
        out += rows("bn", seed, [0.5, b], **kw) + rows("gn", seed, [0.6, g], **kw)
    return out


def test_test_accuracy_at_the_final_epoch_paired_by_seed():
    s = summarize(runs_from_rows(two_norms()), ["bn", "gn"], "bn", TEST_ACC)
    bn, gn = s.rows
    assert s.source == "test_acc" and s.notes == [] and s.select == "final" and s.margin == 0.5
    assert bn.primary.mean == pytest.approx(100 * sum(BN) / 4) and bn.vs_baseline is None and bn.verdict is None
    ref = sps.ttest_rel([100 * g for g in GAIN], [100 * b for b in BN])
    assert gn.vs_baseline.p_value == pytest.approx(ref.pvalue)
    assert gn.verdict.p_holm == pytest.approx(ref.pvalue) and gn.verdict.verdict == "better"


def test_summary_json_contract():
    s = summarize(runs_from_rows(two_norms()), ["bn", "gn"], "bn", TEST_ACC)
    base, gn = s.as_rows()
    for key in ("verdict", "p_holm", "mde", "seeds_needed", "failed", "metric", "norm", "runs", "ok", "diverged",
                "acc_mean", "acc_sem", "diff_mean", "diff_ci95_low", "diff_ci95_high", "diff_p_value", "cell"):
        assert key in gn
    assert base["verdict"] == "baseline" and base["p_holm"] is None and base["diff_note"] == "baseline"
    assert gn["metric"] == "test_acc" and gn["verdict"] == "better" and gn["acc_mean"] == gn["metric_mean"]
    assert gn["mde"] > 0 and gn["seeds_needed"] >= 3 and gn["failed"] == 0 and gn["tuned"] == {"lr": 0.1}


def test_best_val_reports_test_at_the_best_validation_epoch_never_the_best_test():
    r = rows("bn", 0, test=[0.90, 0.70, 0.80], val=[0.5, 0.9, 0.6])
    s = summarize(runs_from_rows(r), ["bn"], "bn", TEST_ACC, select="best-val")
    assert s.rows[0].values == {0: pytest.approx(70.0)}
    final = summarize(runs_from_rows(r), ["bn"], "bn", TEST_ACC, select="final")
    assert final.rows[0].values == {0: pytest.approx(80.0)}


def test_old_results_without_test_fall_back_to_val_with_a_note():
    s = summarize(runs_from_rows(two_norms(with_test=False)), ["bn", "gn"], "bn", TEST_ACC)
    assert s.source == "val_acc" and s.label == "validation accuracy"
    assert "no test_acc" in s.notes[0] and "val_acc is reported instead" in s.notes[0]
    assert s.rows[1].verdict.verdict == "better"


def test_lower_is_better_metric_flips_the_verdict():
    s = summarize(runs_from_rows(two_norms()), ["bn", "gn"], "bn", METRICS["test_loss"])
    gn = s.rows[1]
    assert gn.vs_baseline.mean < 0  # gn has the lower loss ...
    assert gn.verdict.verdict == "better"  # ... which is better
    assert s.margin == METRICS["test_loss"].default_margin


def test_diverged_and_failed_runs_are_counted_not_averaged():
    r = two_norms() + rows("gn", 4, [0.3], status="diverged") + rows("bn", 4, [], status="failed",
                                                                     error="CUDA out of memory")
    bn, gn = summarize(runs_from_rows(r), ["bn", "gn"], "bn", TEST_ACC).rows
    assert (bn.runs, bn.failed, bn.primary.n) == (5, 1, 4) and bn.errors == ["seed 4: CUDA out of memory"]
    assert (gn.runs, gn.diverged, gn.primary.n, gn.vs_baseline.n) == (5, 1, 4, 4)


def test_failed_error_may_sit_in_extras():
    failed = {"norm": "bn", "seed": 0, "status": "failed", "params": None, "epoch": None,
              "extras": {"error": "ValueError: bad shape"}}
    (bn,) = summarize(runs_from_rows([failed]), ["bn"], "bn", TEST_ACC).rows
    assert bn.failed == 1 and bn.errors == ["seed 0: ValueError: bad shape"]


def test_fewer_than_three_pairs_give_no_verdict():
    r = rows("bn", 0, [0.8]) + rows("gn", 0, [0.9]) + rows("bn", 1, [0.7]) + rows("gn", 1, [0.85])
    gn = summarize(runs_from_rows(r), ["bn", "gn"], "bn", TEST_ACC).rows[1]
    assert gn.verdict.verdict == "no verdict (n<3)" and gn.vs_baseline.n == 2


def test_cells_pair_within_a_cell_and_holm_spans_every_cell():
    r = two_norms(cell={"lr": 0.1}) + two_norms(cell={"lr": 0.01})
    s = summarize(runs_from_rows(r), ["bn", "gn"], "bn", TEST_ACC)
    assert [(x.norm, x.cell) for x in s.rows] == [("bn", {"lr": 0.1}), ("gn", {"lr": 0.1}),
                                                  ("bn", {"lr": 0.01}), ("gn", {"lr": 0.01})]
    p = s.rows[1].vs_baseline.p_value
    assert s.rows[1].verdict.p_holm == pytest.approx(2 * p)  # two comparisons with equal p: Holm x2
    assert s.rows[1].primary.n == 4


def test_tuning_runs_do_not_count():
    r = two_norms() + rows("gn", 9, [0.1], phase="tune")
    gn = summarize(runs_from_rows(r), ["bn", "gn"], "bn", TEST_ACC).rows[1]
    assert gn.runs == 4 and 9 not in gn.values


def test_norm_without_runs_still_has_a_row():
    _, ln = summarize(runs_from_rows(rows("bn", 0, [0.8])), ["bn", "ln"], "bn", TEST_ACC).rows
    assert ln.runs == 0 and ln.primary.mean is None and ln.vs_baseline.note == "no paired seeds"
    assert ln.params is None and ln.verdict.verdict == "no verdict (n<3)"


def test_run_results_read_like_rows():
    def run(norm: str, seed: int, acc: float) -> RunResult:
        record = EpochRecord(epoch=0, train_loss=0.5, train_acc=0.5, val_loss=0.5, val_acc=acc, val_top5=None,
                             epoch_time_s=1.0, throughput=100.0, peak_mem_mb=10.0, lr=0.1)
        return RunResult(norm=norm, seed=seed, status="ok", epochs=[record], params=1000, extras={})

    runs = runs_from_results([run("bn", 0, 0.8), run("bn", 1, 0.7)])
    assert [(r.norm, r.seed, r.cell, r.phase) for r in runs] == [("bn", 0, {}, "compare"), ("bn", 1, {}, "compare")]
    assert runs[0].epochs[0]["val_acc"] == 0.8


def test_margin_and_select_from_the_config():
    assert margin_of({}, TEST_ACC) == 0.5 and margin_of({"margin": None}, TEST_ACC) == 0.5
    assert margin_of({"margin": 1}, TEST_ACC) == 1.0
    assert select_of({}) == "final" and select_of({"select": "best-val"}) == "best-val"
    for bad in (0, -1, float("nan"), "x", True):
        with pytest.raises(ConfigError, match="margin must be a number > 0"):
            margin_of({"margin": bad}, TEST_ACC)
    with pytest.raises(ConfigError, match="select must be one of final, best-val"):
        select_of({"select": "best-test"})
