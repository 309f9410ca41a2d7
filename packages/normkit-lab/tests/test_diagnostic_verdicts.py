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


def test_the_interval_beside_a_diagnostic_verdict_is_adjusted_for_its_family():
    """The tables printed the unadjusted 95% interval beside the Holm verdict: qq_r2 depth 2 (no evidence after
    Holm) can exclude 0 at 95%. The adjusted interval is the t interval at the Holm level the measure was last
    tested at (alpha / 2 for the first of two, alpha for the second) and excludes 0 exactly when a verdict says
    higher or lower."""
    s = summarize(runs_from_rows(run_rows()), ["bn", "bnn"], "bn", METRICS["test_acc"])
    by = {d.measure: d for d in s.diagnostics}
    for d in s.diagnostics:
        assert (d.adj_low > 0 or d.adj_high < 0) == (d.verdict in (HIGHER, LOWER)), d
        assert d.adj_low <= d.diff <= d.adj_high
    first, second = sorted((by["qq_r2 depth 1"], by["qq_r2 depth 2"]), key=lambda d: d.p)
    for d, level in ((first, 0.025), (second, 0.05 if first.verdict != NO_EVIDENCE else 0.025)):
        depth = int(d.measure.split()[-1]) - 1
        ci = sps.ttest_rel([q[depth] for q in QQ["bnn"]], [q[depth] for q in QQ["bn"]]).confidence_interval(1 - level)
        assert (d.adj_low, d.adj_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    zeta = sps.ttest_rel(ZETA["bnn"], ZETA["bn"]).confidence_interval(0.95)  # a family of one: the 95% interval
    assert (by["zeta"].adj_low, by["zeta"].adj_high) == (pytest.approx(zeta.low), pytest.approx(zeta.high))
    row = s.as_rows()[1]["diagnostic_verdicts"][0]
    assert row["adj_low"] == by["qq_r2 depth 1"].adj_low and row["ci95_low"] == by["qq_r2 depth 1"].low


def test_an_unadjusted_interval_that_excludes_zero_is_not_shown_beside_no_evidence():
    """Two depths with raw p 0.031 and 0.027: both 95% intervals exclude 0, Holm (0.053) shows neither, and the
    interval shown (adjusted: alpha / 2 for both, the first step not rejected) includes 0 for both."""
    from normkit_lab.analysis.diagnostic_verdicts import diagnostic_verdicts

    gaps = {1: [0.02, 0.015, 0.03, 0.001, 0.012], 2: [0.025, 0.01, 0.03, 0.002, 0.02]}
    per_seed = {(0, "bn"): {s: {f"qq_r2 depth {k}": ("qq_r2", 0.9) for k in gaps} for s in range(5)},
                (0, "bnn"): {s: {f"qq_r2 depth {k}": ("qq_r2", 0.9 + g[s]) for k, g in gaps.items()}
                             for s in range(5)}}
    found = diagnostic_verdicts(per_seed, [{}], ["bn", "bnn"], "bn")
    assert [d.verdict for d in found] == [NO_EVIDENCE, NO_EVIDENCE]
    for d, g in zip(found, gaps.values(), strict=True):
        assert d.low > 0  # the unadjusted 95% interval excludes 0 ...
        assert d.adj_low < 0 < d.adj_high  # ... the one shown beside the verdict does not
        ci = sps.ttest_1samp(g, 0.0).confidence_interval(1 - 0.025)
        assert (d.adj_low, d.adj_high) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))
