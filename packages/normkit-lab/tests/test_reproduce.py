"""normkit reproduce: preset parsing and checks, planning, dry runs, plugin discovery and outcome reading.

The outcome tests feed the lab's own summary code runs with known values, so each expected outcome
follows from the numbers (a large consistent gap is significant, a tiny spread inside the margin is
equivalent, three seeds of noise are inconclusive).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

import normkit
from normkit.testing import temporary_plugin
from normkit_lab.analysis.summary import Run
from normkit_lab.errors import ConfigError, DatasetMissing
from normkit_lab.reproduce import available, load_preset, runner
from normkit_lab.reproduce.outcomes import (
    BELOW_MARGIN,
    INCONCLUSIVE,
    NOT_ATTRIBUTED,
    NOT_REPRODUCED,
    REPRODUCED,
    judge_compare,
    judge_random_net,
)
from normkit_lab.reproduce.preset import parse_hypothesis, parse_preset

EXPECTED = {"proxynorm-random-net-collapse", "proxynorm-pn-rescues-ln", "proxynorm-bn-pn-equivalent",
            "proxynorm-small-batch", "normalnorm-gaussianity-robustness", "normalnorm-noise-ablation",
            "gpt-postnorm", "normfree-optimizer"}

GOOD = {
    "title": "t", "claim": "c", "citation": {"paper": "p", "where": "Table 1"},
    "hypotheses": [{"name": "h", "test": "difference", "norm": "gn", "baseline": "bn", "metric": "test_acc",
                    "direction": "better", "margin": 0.5}],
    "scales": {"cpu": {"config": {"dataset": "digits", "norms": "bn,gn", "epochs": 1, "seeds": 3,
                                  "model_params": {"depth": 1}},
                       "expected_runtime_s": 5}},
}


def test_every_installed_preset_parses_and_plans_at_every_scale() -> None:
    presets = {p.name: p for p in available()}
    assert EXPECTED <= set(presets)
    for preset in presets.values():
        assert preset.hypotheses and preset.cite and preset.claim
        for scale in preset.scales:
            plan = runner.plan(preset, scale)
            assert plan.runs > 0 and plan.lines[0].startswith(preset.name)
            assert any(h.name in line for h in preset.hypotheses for line in plan.lines)


def test_presets_come_from_their_plugins() -> None:
    plugins = {p.name: p.plugin for p in available()}
    assert {n for n, p in plugins.items() if p == "proxynorm"} >= {n for n in EXPECTED if n.startswith("proxynorm")}
    assert {n for n, p in plugins.items() if p == "normalnorm"} >= {n for n in EXPECTED if n.startswith("normalnorm")}


def test_seeds_override_scales_the_plan_and_expected_time() -> None:
    preset = load_preset("proxynorm-bn-pn-equivalent")
    full, small = runner.plan(preset), runner.plan(preset, seeds=3)
    assert (full.seeds, small.seeds) == (10, 3) and small.runs == 6
    assert small.expected_s == pytest.approx(full.expected_s * 3 / 10)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("claim"), "claim must be a non-empty text"),
    (lambda d: d.update(kind="train"), "kind must be one of compare, random-net"),
    (lambda d: d.update(hypotheses=[]), "hypotheses must be a non-empty list"),
    (lambda d: d["hypotheses"][0].update(test="bigger"), "test must be one of"),
    (lambda d: d["hypotheses"][0].update(direction="higher"), "needs direction better or worse"),
    (lambda d: d["hypotheses"][0].update(norm="ln"), "'ln' is not an arm of scale cpu"),
    (lambda d: d["hypotheses"][0].update(norm="nosuchnorm"), "unknown norm or stage 'nosuchnorm'"),
    (lambda d: d["hypotheses"][0].update(baseline="gn"), "norm and baseline are both 'gn'"),
    (lambda d: d["hypotheses"][0].update(margin=-1), "margin must be a number > 0"),
    (lambda d: d["hypotheses"][0].update(test="equivalence", direction="equivalent", margin=None),
     "an equivalence hypothesis needs its margin"),
    (lambda d: d["hypotheses"][0].pop("margin"), "a difference hypothesis needs its margin"),
    (lambda d: d["hypotheses"][0].update(test="diagnostic", direction="lower", measure="zeta", margin=None),
     "a diagnostic hypothesis needs its margin"),
    (lambda d: d.update(label="diagnostic"), "label must be one of reproduction, extension, prediction"),
    (lambda d: d["hypotheses"][0].update(label="guess"), "label must be one of reproduction, extension"),
    (lambda d: d["hypotheses"][0].update(test="diagnostic", direction="lower", measure="zeta", since="start"),
     "since must be init"),
    (lambda d: d["hypotheses"][0].update(test="diagnostic", direction="lower", measure="lambda", since="init"),
     "since: init reads qq_r2"),
    (lambda d: d["hypotheses"][0].update(since="init"), "since: applies to diagnostic hypotheses only"),
    (lambda d: d["hypotheses"][0].update(test="interaction", direction="grows", key="batch_size", to=2),
     "needs two different swept values"),
    (lambda d: d["hypotheses"][0].update(test="interaction", direction="grows", key="batch_size", to=2,
                                          **{"from": 16}), "must sweep batch_size over both 16 and 2"),
    (lambda d: d["hypotheses"][0].update(test="diagnostic", direction="lower", measure="accuracy"),
     "measure must be zeta, qq_r2"),
    (lambda d: d["hypotheses"][0].update(cell={"batch_size": 2}), "sweeps nothing"),
    (lambda d: d["hypotheses"].append(dict(d["hypotheses"][0])), "two hypotheses share a name"),
    (lambda d: d["hypotheses"][0].update(metrics="test_acc"), "unknown key 'metrics'"),
    (lambda d: d.update(scales={"paper": d["scales"]["cpu"]}), "scales needs a cpu scale"),
    (lambda d: d["scales"]["cpu"].pop("expected_runtime_s"), "give the expected runtime"),
    (lambda d: d["scales"].update(gpu={}), "unknown key 'gpu'"),
    (lambda d: d.update(citation="a paper"), "citation must be a mapping"),
])
def test_bad_presets_are_one_line_errors(change, message) -> None:
    raw = copy.deepcopy(GOOD)
    change(raw)
    with pytest.raises(ConfigError) as info:
        parse_preset("bad", raw, "bad.yaml")
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith("preset 'bad' (bad.yaml)")


def test_hypotheses_take_the_preset_label_unless_they_carry_their_own() -> None:
    raw = copy.deepcopy(GOOD)
    raw["label"] = "extension"
    raw["hypotheses"].append({**raw["hypotheses"][0], "name": "mine", "label": "prediction"})
    preset = parse_preset("p", raw, "p.yaml")
    assert [h.label for h in preset.hypotheses] == ["extension", "prediction"]
    assert preset.labels == "extension+prediction"
    assert parse_preset("p", GOOD, "p.yaml").labels == "reproduction"


def test_random_net_hypotheses_need_depth_and_margin() -> None:
    base = {"name": "h", "test": "diagnostic", "measure": "dataset_share", "norm": "ln+pn", "baseline": "ln",
            "direction": "lower"}
    with pytest.raises(ConfigError, match="needs depth"):
        parse_hypothesis({**base, "margin": 0.1}, "w", "random-net")
    with pytest.raises(ConfigError, match="needs its margin"):
        parse_hypothesis({**base, "depth": 3}, "w", "random-net")
    with pytest.raises(ConfigError, match="needs trained runs"):
        parse_hypothesis({**base, "test": "difference", "direction": "better", "metric": "test_acc",
                          "margin": 0.5}, "w", "random-net")


# -- outcomes, read from the lab's verdicts -----------------------------------------------------


def _runs(values: dict[str, list[float]], cell: dict | None = None) -> list[Run]:
    """One finished run per (norm, seed) whose test accuracy is the given fraction."""
    return [Run(norm=norm, seed=seed, status="ok", params=1, cell=dict(cell or {}),
                epochs=[{"epoch": 0, "test_acc": v, "val_acc": v}])
            for norm, vs in values.items() for seed, v in enumerate(vs)]


def _hyp(**kw):
    raw = {"name": "h", "test": "difference", "norm": "gn", "baseline": "bn", "metric": "test_acc",
           "direction": "better", "margin": 0.5, **kw}
    return parse_hypothesis(raw, "w", "compare")


BASE = [0.90, 0.91, 0.92, 0.93, 0.94]


def test_difference_outcomes() -> None:
    up = _runs({"bn": BASE, "gn": [v + 0.03 + 0.001 * i for i, v in enumerate(BASE)]})
    down = _runs({"bn": BASE, "gn": [v - 0.03 - 0.001 * i for i, v in enumerate(BASE)]})
    noisy = _runs({"bn": BASE[:3], "gn": [0.95, 0.88, 0.94]})
    assert judge_compare([_hyp()], up, ["bn", "gn"])[0].status == REPRODUCED
    out = judge_compare([_hyp()], down, ["bn", "gn"])[0]
    assert out.status == NOT_REPRODUCED and "worse" in out.observed
    out = judge_compare([_hyp()], noisy, ["bn", "gn"])[0]
    assert out.status == INCONCLUSIVE and out.mde is not None and "MDE" in out.line()


def test_a_significant_difference_smaller_than_the_margin_is_below_margin() -> None:
    """+0.3 points on every seed (tiny spread) is significant, but the margin is 0.5: not `reproduced`."""
    small = _runs({"bn": BASE, "gn": [v + 0.003 + 0.0002 * i for i, v in enumerate(BASE)]})
    out = judge_compare([_hyp()], small, ["bn", "gn"])[0]
    assert out.status == BELOW_MARGIN and "smaller than the margin 0.5%" in out.line()
    assert judge_compare([_hyp(margin=0.2)], small, ["bn", "gn"])[0].status == REPRODUCED


def test_a_prediction_is_supported_not_reproduced() -> None:
    up = _runs({"bn": BASE, "gn": [v + 0.03 + 0.001 * i for i, v in enumerate(BASE)]})
    down = _runs({"bn": BASE, "gn": [v - 0.03 - 0.001 * i for i, v in enumerate(BASE)]})
    yes = judge_compare([_hyp(label="prediction")], up, ["bn", "gn"])[0]
    no = judge_compare([_hyp(label="extension")], down, ["bn", "gn"])[0]
    assert (yes.status, yes.word, no.word) == (REPRODUCED, "supported", "not supported")
    assert yes.line().startswith("h: supported (") and yes.as_dict()["outcome"] == "supported"


def test_a_difference_shown_smaller_than_its_margin_is_not_reproduced() -> None:
    tiny = _runs({"bn": BASE, "gn": [v + 0.0001 * (-1) ** i for i, v in enumerate(BASE)]})
    out = judge_compare([_hyp()], tiny, ["bn", "gn"])[0]
    assert out.status == NOT_REPRODUCED and "equivalent" in out.observed


def test_equivalence_outcomes() -> None:
    h = _hyp(test="equivalence", direction="equivalent")
    tiny = _runs({"bn": BASE, "gn": [v + 0.0005 * (-1) ** i for i, v in enumerate(BASE)]})
    far = _runs({"bn": BASE, "gn": [v + 0.05 + 0.001 * i for i, v in enumerate(BASE)]})
    assert judge_compare([h], tiny, ["bn", "gn"])[0].status == REPRODUCED
    assert judge_compare([h], far, ["bn", "gn"])[0].status == NOT_REPRODUCED
    noisy = _runs({"bn": BASE[:3], "gn": [0.95, 0.88, 0.94]})
    out = judge_compare([h], noisy, ["bn", "gn"])[0]
    assert out.status == INCONCLUSIVE and "show equivalence" in out.line()


def test_interaction_outcomes_read_in_the_hypothesis_direction() -> None:
    small = _runs({"bn": BASE, "gn": [v + 0.05 + 0.002 * i for i, v in enumerate(BASE)]}, {"batch_size": 2})
    large = _runs({"bn": BASE, "gn": [v + 0.001 * (-1) ** i for i, v in enumerate(BASE)]}, {"batch_size": 16})
    runs = small + large  # cells in sweep order 2, 16: the test runs 2 -> 16, the hypothesis 16 -> 2
    grows = _hyp(test="interaction", direction="grows", key="batch_size", to=2, **{"from": 16})
    shrinks = _hyp(test="interaction", direction="shrinks", key="batch_size", to=2, **{"from": 16})
    assert judge_compare([grows], runs, ["bn", "gn"])[0].status == REPRODUCED
    out = judge_compare([shrinks], runs, ["bn", "gn"])[0]
    assert out.status == NOT_REPRODUCED and "from batch_size=16 to 2: +" in out.observed


def _diag_run(norm, seed, zeta, qq=None, init_qq=None, init_zeta=None):
    diagnostics = {"noise_robustness": {"table": [{"zeta": zeta}]}}
    if qq is not None:
        diagnostics["final"] = [{"depth": 1, "qq_r2": qq}]
    if init_qq is not None:
        diagnostics["init"] = [{"depth": 1, "qq_r2": init_qq}]
    if init_zeta is not None:
        diagnostics["init_noise_robustness"] = {"table": [{"zeta": init_zeta}]}
    return Run(norm=norm, seed=seed, status="ok", params=1, epochs=[{"epoch": 0, "test_acc": 0.9}],
               diagnostics=diagnostics)


def test_diagnostic_outcomes_from_measures() -> None:
    runs = ([_diag_run("bn", s, 0.5 + 0.01 * s) for s in range(5)]
            + [_diag_run("gn", s, 0.3 + 0.012 * s) for s in range(5)])
    lower = _hyp(test="diagnostic", direction="lower", measure="zeta", margin=0.05)
    higher = _hyp(test="diagnostic", direction="higher", measure="zeta", margin=0.05)
    out = judge_compare([lower], runs, ["bn", "gn"])[0]
    assert out.status == REPRODUCED and "zeta: -0.196 [-0.200, -0.192]" in out.observed
    assert judge_compare([higher], runs, ["bn", "gn"])[0].status == NOT_REPRODUCED
    assert judge_compare([_hyp(test="diagnostic", direction="lower", measure="zeta", margin=0.5)], runs,
                         ["bn", "gn"])[0].status == BELOW_MARGIN
    missing = judge_compare([_hyp(test="diagnostic", direction="higher", measure="qq_r2")], runs, ["bn", "gn"])[0]
    assert missing.status == INCONCLUSIVE and "diagnostics: true" in missing.observed


def test_a_diagnostic_since_init_reads_the_change_paired_by_seed() -> None:
    """gn is 0.02 more Gaussian than bn after training, but was 0.02 more Gaussian at initialization too:
    after training the hypothesis holds; as a change from initialization it is shown smaller than the
    margin (no change), so it is not reproduced."""
    runs = ([_diag_run("bn", s, 0.5, qq=0.95 + 0.001 * s, init_qq=0.90 + 0.003 * s) for s in range(5)]
            + [_diag_run("gn", s, 0.5, qq=0.97 + 0.001 * s + 0.0001 * (-1) ** s,
                         init_qq=0.92 + 0.003 * s) for s in range(5)])
    after = _hyp(test="diagnostic", direction="higher", measure="qq_r2", margin=0.005)
    since = _hyp(name="since", test="diagnostic", direction="higher", measure="qq_r2", margin=0.005, since="init")
    a, b = judge_compare([after, since], runs, ["bn", "gn"])
    assert a.status == REPRODUCED and "qq_r2 depth 1: +0.020" in a.observed
    assert b.status == NOT_REPRODUCED and "(change from initialization): qq_r2 depth 1: +0.000" in b.observed


def _since_init_runs(change: float, spread: float = 0.0001) -> list[Run]:
    """gn 0.02 more Gaussian than bn after training; at initialization it was 0.02 - `change` ahead."""
    return ([_diag_run("bn", s, 0.5, qq=0.95 + 0.001 * s, init_qq=0.90 + 0.003 * s) for s in range(5)]
            + [_diag_run("gn", s, 0.5, qq=0.97 + 0.001 * s + spread * (-1) ** s,
                         init_qq=0.92 - change + 0.003 * s) for s in range(5)])


def test_a_claim_is_reproduced_only_when_its_controls_support_attributing_it() -> None:
    """The Gaussianity case: the effect after training is shown, but its control (the change from
    initialization) is not supported, so the claim line must not say `reproduced`; with a control
    that holds it does, and with an undecided control it stays open, with the control's numbers."""
    claim = _hyp(test="diagnostic", direction="higher", measure="qq_r2", margin=0.005, controls="since")
    since = _hyp(name="since", label="extension", test="diagnostic", direction="higher", measure="qq_r2",
                 margin=0.005, since="init")
    a, b = judge_compare([claim, since], _since_init_runs(change=0.0), ["bn", "gn"])
    assert (b.status, b.word) == (NOT_REPRODUCED, "not supported")
    assert a.status == NOT_ATTRIBUTED and a.line().startswith("h: not attributed (gn - bn: qq_r2 depth 1: +0.020")
    assert "controls: since not supported, so the design does not attribute" in a.line()
    assert a.as_dict()["controls"] == ["since"] and a.as_dict()["outcome"] == "not attributed"
    a, b = judge_compare([claim, since], _since_init_runs(change=0.02), ["bn", "gn"])
    assert (a.status, b.status) == (REPRODUCED, REPRODUCED) and a.line().endswith("; controls: since supported)")
    noisy = _since_init_runs(change=0.004, spread=0.004)
    a, b = judge_compare([claim, since], noisy, ["bn", "gn"])
    assert b.status == INCONCLUSIVE and a.status == INCONCLUSIVE
    assert "cannot yet attribute" in a.line() and "control since: MDE" in a.line()
    assert judge_compare([claim], _since_init_runs(change=0.0), ["bn", "gn"])[0].status == REPRODUCED


def test_controls_must_name_another_hypothesis_without_controls_of_its_own() -> None:
    def preset(*hypotheses):
        raw = copy.deepcopy(GOOD)
        raw["hypotheses"] = [{**GOOD["hypotheses"][0], **h} for h in hypotheses]
        return parse_preset("p", raw, "p.yaml")

    assert preset({"controls": ["c"]}, {"name": "c"}).hypotheses[0].controls == ("c",)
    with pytest.raises(ConfigError, match="control 'cc' is not a hypothesis of this preset.*did you mean 'c'"):
        preset({"controls": "cc"}, {"name": "c"})
    with pytest.raises(ConfigError, match="cannot be its own control"):
        preset({"controls": "h"})
    with pytest.raises(ConfigError, match="control 'c' has controls of its own"):
        preset({"controls": "c"}, {"name": "c", "controls": "d"}, {"name": "d"})
    with pytest.raises(ConfigError, match="controls must name"):
        preset({"controls": [1]})


def test_the_installed_presets_name_the_controls_of_their_stated_causes() -> None:
    """Each control arm a preset carries for a claim's cause is declared, so its claim line follows it."""
    controls = {p.name: {h.name: h.controls for h in p.hypotheses if h.controls} for p in available()}
    assert controls["normalnorm-gaussianity-robustness"] == {
        "bnn-more-gaussian": ("gaussianity-not-only-from-init",), "bnn-more-robust": ("robustness-not-only-from-init",)}
    assert controls["gpt-postnorm"] == {"lnn-behind-ln": ("noise-causes-lnn-gap",)}


def test_equivalence_is_claimed_only_when_the_design_detects_the_margin() -> None:
    """Five pairs spread ±0.45 points around 0: the 90% interval (±0.43) lies inside the 0.5 margin, so
    TOST passes, but the smallest difference five such pairs detect (alpha 0.05, power 0.8) is larger
    than 0.5 points, so neither an equivalence nor 'shown smaller than the margin' is claimed."""
    offsets = [0.0045, -0.0045, 0.0045, -0.0045, 0.0]
    runs = _runs({"bn": BASE, "gn": [v + o for v, o in zip(BASE, offsets, strict=True)]})
    equivalence = judge_compare([_hyp(test="equivalence", direction="equivalent")], runs, ["bn", "gn"])[0]
    assert "verdict equivalent" in equivalence.observed and equivalence.status == INCONCLUSIVE
    assert "more than the margin 0.5%: this design cannot detect a difference of the margin's size" in \
        equivalence.line()
    assert equivalence.mde > 0.5 and equivalence.seeds_needed > 5
    difference = judge_compare([_hyp()], runs, ["bn", "gn"])[0]
    assert difference.status == INCONCLUSIVE and "cannot detect a difference of the margin's size" in difference.line()
    tiny = _runs({"bn": BASE, "gn": [v + 0.0005 * (-1) ** i for i, v in enumerate(BASE)]})
    shown = judge_compare([_hyp(test="equivalence", direction="equivalent")], tiny, ["bn", "gn"])[0]
    assert shown.status == REPRODUCED and "a difference of the margin's size would have been found" in shown.line()


def test_random_net_outcomes_pair_nets_by_seed() -> None:
    def nets(shares):
        return [[{"dataset": s}] for s in shares]

    runs = {"ln": nets([0.8, 0.82, 0.79, 0.85, 0.81]), "ln+pn": nets([0.01, 0.02, 0.01, 0.0, 0.02]),
            "bn": nets([0.0] * 5)}
    raw = {"name": "h", "test": "diagnostic", "measure": "dataset_share", "depth": 1, "margin": 0.1}
    hs = [parse_hypothesis({**raw, "name": "a", "norm": "ln+pn", "baseline": "ln", "direction": "lower"}, "w",
                           "random-net"),
          parse_hypothesis({**raw, "name": "b", "norm": "ln", "baseline": "bn", "direction": "lower"}, "w",
                           "random-net"),
          parse_hypothesis({**raw, "name": "c", "norm": "ln", "baseline": "bn", "direction": "higher",
                            "margin": 0.9}, "w", "random-net")]
    a, b, c = judge_random_net(hs, runs)
    assert a.status == REPRODUCED and "ln+pn 0.012, ln 0.814" in a.observed
    assert "difference -0.802 [-0.851, -0.753]" in a.observed  # the adjusted interval in the share's units
    assert b.status == NOT_REPRODUCED
    assert c.status == BELOW_MARGIN  # +0.81 is significant, but the margin asked for 0.9


# -- plugins ship their own presets -------------------------------------------------------------


class ThirdParty:
    def __init__(self, path: Path) -> None:
        self.path = path

    @normkit.hookimpl
    def normkit_register_presets(self, register):
        register("thirdparty-demo", self.path)


def test_a_third_party_plugin_registers_a_preset(tmp_path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    with temporary_plugin(ThirdParty(path), "thirdparty"):
        preset = load_preset("thirdparty-demo")
        assert preset.plugin.startswith("thirdparty") and "thirdparty-demo" in {p.name for p in available()}
    with pytest.raises(normkit.SpecError, match="unknown preset 'thirdparty-demo'"):
        load_preset("thirdparty-demo")


def test_a_preset_path_must_be_a_file_path() -> None:
    class Bad:
        @normkit.hookimpl
        def normkit_register_presets(self, register):
            register("bad", 42)

    with pytest.raises(normkit.PluginError, match="path must be a file path"):
        with temporary_plugin(Bad(), "bad"):
            pass


# -- dry runs -----------------------------------------------------------------------------------


def test_dry_run_checks_data_and_models_without_training(tmp_path) -> None:
    lines = runner.dry_run(runner.plan(load_preset("proxynorm-bn-pn-equivalent")))
    assert "  config: valid" in lines and any("dataset: digits found" in x for x in lines)
    assert any("model: small-cnn builds with every norm" in x for x in lines)
    assert "norms: every one builds" in runner.dry_run(runner.plan(load_preset("proxynorm-random-net-collapse")))[2]


def test_paper_dry_run_names_a_missing_dataset(tmp_path) -> None:
    plan = runner.plan(load_preset("proxynorm-pn-rescues-ln"), "paper", overrides={"data_dir": str(tmp_path)})
    assert "preact-resnet18 on cifar10" in plan.lines[3] and "160 epochs" in plan.lines[3]
    with pytest.raises(DatasetMissing, match="dry run: dataset 'cifar10' not found in") as info:
        runner.dry_run(plan)
    assert "\n" not in str(info.value)


def test_a_budget_preset_plans_the_same_steps_in_every_cell() -> None:
    plan = runner.plan(load_preset("proxynorm-small-batch"))
    assert plan.config.train.budget == "steps=300" and "300 steps in every cell" in plan.lines[3]
    assert plan.config.sweep == {"norm_batch": [2, 16]} and plan.config.train.batch_size == 16


def test_unknown_scale_is_named() -> None:
    with pytest.raises(ConfigError, match="has no --scale paper; it has: cpu"):
        runner.plan(load_preset("proxynorm-small-batch"), "paper")



def test_a_hypothesis_line_shows_the_interval_its_verdict_was_decided_on() -> None:
    """The line of a difference hypothesis printed the unadjusted 95% interval beside its Holm verdict: with two
    compared norms it excluded 0 for ln while the Holm verdict was inconclusive. Shown now: the adjusted one."""
    from scipy import stats as sps

    gaps = [0.02, 0.015, 0.03, 0.001, 0.012]  # p 0.031 alone; Holm over 2 comparisons: 0.062, not shown
    runs = _runs({"bn": BASE, "ln": [v + g for v, g in zip(BASE, gaps, strict=True)],
                  "gn": [v + e for v, e in zip(BASE, [0.001, -0.002, 0.0005, 0.003, -0.001], strict=True)]})
    out = judge_compare([_hyp(norm="ln")], runs, ["bn", "ln", "gn"])[0]
    assert out.status == INCONCLUSIVE and "verdict inconclusive" in out.observed
    raw = sps.ttest_1samp([100 * g for g in gaps], 0.0)
    assert raw.confidence_interval(0.95).low > 0  # what the line used to show beside "inconclusive"
    adjusted = raw.confidence_interval(1 - 0.05 / 2)  # ln has the smaller p: the first Holm step, 0.05 / 2
    assert f"[{adjusted.low:+.3f}, {adjusted.high:+.3f}] adj., Holm p" in out.observed, out.observed
    assert adjusted.low < 0 < adjusted.high


@pytest.mark.parametrize(("direction", "words"), [("shrinks", "moves against derf's favour"),
                                                  ("grows", "moves in derf's favour")])
def test_an_interaction_hypothesis_says_which_way_the_norm_moves(direction: str, words: str) -> None:
    """'shrinks in derf's favour' read as derf gaining when it meant derf losing ground."""
    from normkit_lab.reproduce.preset import parse_hypothesis
    h = parse_hypothesis({"name": "h", "test": "interaction", "norm": "derf", "baseline": "rms",
                          "metric": "test_bpb", "key": "optimizer", "from": "adamw", "to": "muon",
                          "direction": direction, "margin": 0.05}, "preset x", "compare")
    assert h.describe() == (f"derf's gap to rms on test_bpb {words} from optimizer=adamw to optimizer=muon "
                            "(margin 0.05)")
