"""--all-pairs: every pair of norms paired by seed, Holm over all pairs (statsmodels), and the ranking."""

from __future__ import annotations

import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from normkit_lab.analysis.summary import runs_from_rows, summarize
from normkit_lab.metrics import METRICS

VALUES = {"bn": [0.80, 0.82, 0.84, 0.81, 0.83], "gn": [0.85, 0.86, 0.885, 0.855, 0.87],
          "ln": [0.79, 0.805, 0.83, 0.8, 0.815]}


def run_rows() -> list[dict]:
    return [{"norm": norm, "seed": seed, "status": "ok", "params": 10, "epoch": 0, "val_acc": v, "test_acc": v,
             "cell": {}, "tuned": {}, "phase": "compare"}
            for norm, values in VALUES.items() for seed, v in enumerate(values)]


def test_all_pairs_holm_and_ranking():
    s = summarize(runs_from_rows(run_rows()), ["bn", "gn", "ln"], "bn", METRICS["test_acc"], pairs=True)
    assert [(p.norm, p.other) for p in s.pairs] == [("gn", "bn"), ("ln", "bn"), ("ln", "gn")]
    raw = [sps.ttest_rel([100 * x for x in VALUES[p.norm]], [100 * x for x in VALUES[p.other]]).pvalue
           for p in s.pairs]
    holm = multipletests(raw, method="holm")[1]
    assert [p.verdict.p_holm for p in s.pairs] == [pytest.approx(h) for h in holm]
    assert [r.norm for r in s.ranks] == ["gn", "bn", "ln"] and [r.rank for r in s.ranks] == [1, 2, 3]
    gn = next(r for r in s.ranks if r.norm == "gn")
    assert gn.wins == 2 and gn.losses == 0
    rows = {r["norm"]: r for r in s.as_rows()}
    assert rows["gn"]["rank"] == 1 and [p["vs"] for p in rows["ln"]["pairs"]] == ["bn", "gn"]


def test_without_all_pairs_nothing_is_ranked():
    s = summarize(runs_from_rows(run_rows()), ["bn", "gn", "ln"], "bn", METRICS["test_acc"])
    assert s.pairs == [] and s.ranks == [] and s.as_rows()[0]["rank"] is None
