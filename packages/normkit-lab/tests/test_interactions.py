"""Interaction tests of a sweep: the per-seed difference of gaps, recomputed with scipy, Holm, verdicts."""

from __future__ import annotations

import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from normkit_lab.analysis.interactions import cell_pairs
from normkit_lab.analysis.summary import runs_from_rows, summarize
from normkit_lab.metrics import METRICS

TEST_ACC = METRICS["test_acc"]


def rows(norm: str, seed: int, test: list[float], cell: dict) -> list[dict]:
    """The runs.jsonl rows of a one-epoch run."""
    return [{"norm": norm, "seed": seed, "status": "ok", "params": 1000, "epoch": 0, "val_acc": test[0],
             "test_acc": test[0], "cell": cell, "tuned": {}, "phase": "compare"}]

BN = {2: [0.80, 0.82, 0.84, 0.81, 0.83], 16: [0.90, 0.91, 0.92, 0.905, 0.915]}
# gn gains about 2 points at batch 2, about 0 at 16: its gap depends on batch size
GN = {2: [0.82, 0.845, 0.86, 0.83, 0.85], 16: [0.901, 0.909, 0.921, 0.906, 0.914]}
# ln's gap is about +1 point in both cells
LN = {2: [0.81, 0.831, 0.849, 0.82, 0.84], 16: [0.91, 0.919, 0.93, 0.916, 0.925]}


def sweep_rows() -> list[dict]:
    out = []
    for batch in (2, 16):
        for norm, table in (("bn", BN), ("gn", GN), ("ln", LN)):
            for seed, value in enumerate(table[batch]):
                out += rows(norm, seed, [value], cell={"batch_size": batch})
    return out


def test_difference_of_differences_matches_scipy_and_holm():
    s = summarize(runs_from_rows(sweep_rows()), ["bn", "gn", "ln"], "bn", TEST_ACC, margin=0.5)
    gn, ln = s.interactions
    refs = []
    for inter, table in ((gn, GN), (ln, LN)):
        d = [100 * ((table[16][i] - BN[16][i]) - (table[2][i] - BN[2][i])) for i in range(5)]
        ref = sps.ttest_1samp(d, 0.0)
        ci = ref.confidence_interval(1 - inter.test.level)  # Holm-adjusted: the level it was last tested at
        assert inter.test.level in (pytest.approx(0.025), pytest.approx(0.05))
        assert inter.key == "batch_size" and (inter.cell_a, inter.cell_b) == ({"batch_size": 2}, {"batch_size": 16})
        assert inter.mean == pytest.approx(sum(d) / 5) and inter.test.p == pytest.approx(ref.pvalue)
        assert (inter.test.low, inter.test.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
        refs.append(ref.pvalue)
    holm = multipletests(refs, method="holm")[1]
    assert [gn.test.p_holm, ln.test.p_holm] == [pytest.approx(p) for p in holm]
    assert gn.verdict == "depends on batch_size" and gn.mean < 0
    assert ln.verdict in ("no evidence that it depends on batch_size", "same gap across batch_size (within margin)")
    row = {r["norm"]: r for r in s.as_rows() if r["cell"] == {"batch_size": 16}}["gn"]
    assert row["interactions"][0]["verdict"] == "depends on batch_size"
    assert row["interactions"][0]["from"] == 2 and row["interactions"][0]["to"] == 16


def test_equal_gaps_are_shown_equivalent_with_a_wide_margin():
    s = summarize(runs_from_rows(sweep_rows()), ["bn", "ln"], "bn", TEST_ACC, margin=3.0)
    (ln,) = s.interactions
    assert ln.verdict == "same gap across batch_size (within margin)"


def test_pairs_differ_in_one_key_only_and_a_plain_run_has_none():
    cells = [{"b": 2, "w": 8}, {"b": 16, "w": 8}, {"b": 2, "w": 32}, {"b": 16, "w": 32}]
    assert cell_pairs(cells) == [("b", 0, 1), ("w", 0, 2), ("w", 1, 3), ("b", 2, 3)]
    plain = [r for r in sweep_rows() if r["cell"] == {"batch_size": 2}]
    for r in plain:
        r["cell"] = {}
    assert summarize(runs_from_rows(plain), ["bn", "gn"], "bn", TEST_ACC).interactions == []
