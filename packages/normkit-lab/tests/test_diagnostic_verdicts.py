"""Verdicts for representation measures: per-seed pairing, scipy p and interval, Holm within family."""

from __future__ import annotations

import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from normkit_lab.analysis.diagnostic_verdicts import HIGHER, LOWER, NO_EVIDENCE, measures_of
from normkit_lab.analysis.summary import runs_from_rows, summarize
from normkit_lab.metrics import METRICS

QQ = {"bn": [[0.970, 0.980], [0.972, 0.985], [0.969, 0.979], [0.975, 0.983]],
      "bnn": [[0.985, 0.981], [0.986, 0.990], [0.984, 0.975], [0.988, 0.986]]}
ZETA = {"bn": [0.43, 0.44, 0.42, 0.45], "bnn": [0.40, 0.415, 0.39, 0.42]}


def extras(norm: str, seed: int) -> dict:
    lam = [{"epoch": 1, "layers": [{"layer": "n1", "mean": 1.0 + 0.01 * seed}]}] if norm == "bnn" else []
    return {"diagnostics": {
        "final": [{"depth": d + 1, "layer": f"n{d + 1}", "qq_r2": QQ[norm][seed][d]} for d in range(2)],
        "noise_robustness": {"table": [{"k": 1, "l": 2, "zeta": ZETA[norm][seed]}]}, "lambda": lam}}


def run_rows() -> list[dict]:
    return [{"norm": norm, "seed": seed, "status": "ok", "params": 10, "epoch": 0, "val_acc": 0.9, "test_acc": 0.9,
             "cell": {}, "tuned": {}, "phase": "compare", "extras": extras(norm, seed)}
            for seed in range(4) for norm in ("bn", "bnn")]


def test_measures_of_a_run():
    m = measures_of(extras("bnn", 1)["diagnostics"])
    assert m == {"qq_r2 depth 1": ("qq_r2", 0.986), "qq_r2 depth 2": ("qq_r2", 0.990), "zeta": ("zeta", 0.415),
                 "lambda": ("lambda", pytest.approx(1.01))}
    assert measures_of(None) == {}


def test_paired_by_seed_with_holm_within_the_family():
    s = summarize(runs_from_rows(run_rows()), ["bn", "bnn"], "bn", METRICS["test_acc"])
    by = {d.measure: d for d in s.diagnostics}
    assert set(by) == {"qq_r2 depth 1", "qq_r2 depth 2", "zeta"}  # bn has no lambda: nothing to pair it with
    raw = {}
    for depth in (0, 1):
        ref = sps.ttest_rel([q[depth] for q in QQ["bnn"]], [q[depth] for q in QQ["bn"]])
        d = by[f"qq_r2 depth {depth + 1}"]
        assert d.p == pytest.approx(ref.pvalue)
        ci = ref.confidence_interval(0.95)
        assert (d.low, d.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
        raw[depth] = ref.pvalue
    holm = multipletests([raw[0], raw[1]], method="holm")[1]
    assert by["qq_r2 depth 1"].p_holm == pytest.approx(holm[0]) and by["qq_r2 depth 2"].p_holm == pytest.approx(holm[1])
    assert by["qq_r2 depth 1"].verdict == HIGHER and by["qq_r2 depth 2"].verdict == NO_EVIDENCE
    zeta = sps.ttest_rel(ZETA["bnn"], ZETA["bn"]).pvalue
    assert by["zeta"].p_holm == pytest.approx(zeta) and by["zeta"].verdict == LOWER  # a family of one
    row = s.as_rows()[1]
    assert [d["measure"] for d in row["diagnostic_verdicts"]] == ["qq_r2 depth 1", "qq_r2 depth 2", "zeta"]
    assert s.as_rows()[0]["diagnostic_verdicts"] == []


def test_the_forest_plot_gets_one_panel_per_family_of_diagnostic_verdicts():
    pytest.importorskip("matplotlib")
    import io

    from matplotlib import image

    from normkit_lab.analysis import plots
    rows = run_rows()
    with_diagnostics = summarize(runs_from_rows(rows), ["bn", "bnn"], "bn", METRICS["test_acc"])
    without = summarize(runs_from_rows([{**r, "extras": {}} for r in rows]), ["bn", "bnn"], "bn", METRICS["test_acc"])
    assert without.diagnostics == []
    tall = image.imread(io.BytesIO(plots.forest(with_diagnostics)))
    short = image.imread(io.BytesIO(plots.forest(without)))
    # qq_r2 (2 depths) and zeta panels below the accuracy panel: the figure is more than twice as tall
    assert tall.shape[0] > 2 * short.shape[0] and tall.shape[1] == short.shape[1]
