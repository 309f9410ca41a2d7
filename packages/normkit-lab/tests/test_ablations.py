"""Stage ablations: plugins declare what can be switched off, `--ablate` trains those arms beside the
compared norms, and a Holm family of their own says which stage carries a norm's difference."""

from __future__ import annotations

import json

import pytest
import torch

import normkit
from normkit.errors import PluginError
from normkit.registry import Registry
from normkit.stages import BuildContext
from normkit_lab.ablations import Ablation, ablation_arms, ablations_of
from normkit_lab.analysis.summary import Run, summarize
from normkit_lab.metrics import metric_named
from normkit_lab.records import config_hash
from normkit_lab.study.config import resolve
from normkit_lab.study.plan import compare_plan, run_count


def _stage(ctx: BuildContext, *, strength: float = 1.0, noise: float = 0.1) -> torch.nn.Module:
    return torch.nn.Identity()


def _register(**kwargs) -> Registry:
    registry = Registry()
    registry.registrars("mine")["normkit_register_stages"]("squash", _stage, **kwargs)
    return registry


def test_a_plugin_declares_its_ablatable_stages_through_the_register_protocol():
    entry = _register(ablations={"noise": {"noise": 0}, "squash": None}).lookup("squash")
    assert entry.meta["ablations"] == {"noise": {"noise": 0.0}, "squash": None}  # typed by the parameter
    assert entry.as_dict()["ablations"] == {"noise": {"noise": 0.0}, "squash": None}
    assert "ablations" not in _register().lookup("squash").as_dict()


@pytest.mark.parametrize(("ablations", "message"), [
    ({"noise": {"nosie": 0}}, "sets 'nosie', which is not a parameter.*did you mean 'noise'"),
    ({"noise": {}}, "must be parameter values or None"),
    ({"": None}, "labels are non-empty strings"),
    (["noise"], "maps a label to parameter values"),
])
def test_bad_declarations_fail_naming_the_plugin(ablations, message):
    with pytest.raises(PluginError, match=f"plugin 'mine': stage 'squash'.*{message}"):
        _register(ablations=ablations)


def test_a_norm_declares_values_only_and_a_composition_none():
    register = Registry().registrars("mine")["normkit_register_norms"]
    with pytest.raises(PluginError, match="must be parameter values, not None"):
        register("plain", factory=lambda c, *, p=1: torch.nn.Identity(), ablations={"all": None})
    with pytest.raises(PluginError, match="a composition's ablations are those of its parts"):
        register("both", compose="bn+nn", ablations={"noise": {"noise": 0}})


def test_the_built_in_plugins_declare_noise_transform_proxy_and_compression():
    assert [(a.stage, a.arm) for a in ablations_of("bnn")] == [
        ("noise", "bn+nn(noise=0.0)"), ("power transform", "bn+nn(lambda_min=1.0,lambda_max=1.0)")]
    assert ablations_of("gn+pn") == [Ablation("gn+pn", "proxy step", "pn", "gn(groups=8)")]  # pn's groups kept
    assert [a.arm for a in ablations_of("ln+ib-l(lam=4)")] == ["ln"]
    assert [a.stage for a in ablations_of("bnn(noise=0)")] == ["power transform"]  # noise is off already
    assert ablations_of("bn") == []
    assert ablation_arms(["bn", "bnn", "gn+pn", "gn(groups=8)"]) == [
        "bn+nn(noise=0.0)", "bn+nn(lambda_min=1.0,lambda_max=1.0)"]  # an arm already compared runs once


def test_the_ablations_switch_the_stage_off():
    """Noise off and lambda held at 1 (Yeo-Johnson's identity) leave bn; either alone changes bnn."""
    x = torch.randn(8, 6, 3, 3).exp()  # skewed, so the transform does something

    def out(spec: str) -> torch.Tensor:
        layer = normkit.build(spec, 6).train()
        torch.manual_seed(0)
        return layer(x)

    neither = "bn+nn(noise=0.0,lambda_min=1.0,lambda_max=1.0)"
    assert torch.allclose(out(neither), out("bn"), atol=1e-5)
    for arm in (a.arm for a in ablations_of("bnn")):
        assert not torch.allclose(out(arm), out("bnn"), atol=1e-3), arm


def test_ablate_adds_the_arms_to_the_plan_and_keeps_the_config_hash():
    plain = resolve({"dataset": "digits", "norms": "bn,bnn,gn+pn"})
    ablated = resolve({"dataset": "digits", "norms": "bn,bnn,gn+pn", "ablate": True})
    assert ablated.arms == ["bn", "bnn", "gn+pn", "bn+nn(noise=0.0)", "bn+nn(lambda_min=1.0,lambda_max=1.0)",
                            "gn(groups=8)"]
    cells = len(ablated.sweep["batch_size"])  # the default design: batches of 2 and 16
    assert run_count(ablated) == (0, 6 * 5 * cells) and {r.norm for r in compare_plan(ablated)} == set(ablated.arms)
    assert ablated.to_dict()["ablate"] is True and ablated.norms == plain.norms
    assert config_hash(ablated.to_dict()) == config_hash(plain.to_dict())  # a plan key: the runs' identity says it


def _runs(values: dict[str, list[float]]) -> list[Run]:
    return [Run(norm, seed, "ok", 1, epochs=[{"epoch": 0, "val_acc": 0.5, "test_acc": v / 100}])
            for norm, row in values.items() for seed, v in enumerate(row)]


def test_the_stage_that_carries_the_difference_is_named_in_a_family_of_its_own():
    # bnn is ~2.3 worse than bn; without its noise it is back at bn, without its transform still worse
    values = {"bn": [95.0, 96.0, 95.5, 94.8, 95.9], "bnn": [92.6, 93.9, 93.1, 92.4, 93.5],
              "bn+nn(noise=0.0)": [94.9, 96.1, 95.3, 94.9, 95.7],
              "bn+nn(lambda_min=1.0,lambda_max=1.0)": [92.9, 93.8, 93.4, 92.2, 93.6]}
    metric = metric_named("test_acc")
    with_arms = summarize(_runs(values), ["bn", "bnn"], "bn", metric)
    without = summarize(_runs({k: values[k] for k in ("bn", "bnn")}), ["bn", "bnn"], "bn", metric)
    assert with_arms.rows[1].verdict == without.rows[1].verdict  # the headline's Holm family is untouched
    noise, transform = with_arms.ablations
    assert (noise.ablation.stage, noise.role, noise.without_test.verdict) == ("noise", "hurts", "equivalent")
    assert transform.role in ("no effect (within margin)", "inconclusive")
    assert noise.effect_test.p_holm >= noise.effect_test.p  # Holm over the ablations' 4 tests
    from normkit_lab.analysis.ablations import attribution

    assert "noise carries the difference" in attribution(noise, with_arms.rows[1].verdict, "bn", "%")
    assert "power transform is not shown to carry it" in attribution(transform, with_arms.rows[1].verdict, "bn", "%")
    row = with_arms.as_rows()[1]
    assert [a["stage"] for a in row["ablations"]] == ["noise", "power transform"]
    json.dumps(row)  # summary.json can hold it


def test_a_compared_norm_that_is_an_arm_gives_the_attribution_without_ablate_and_no_empty_contrast():
    # ln+ib-l without its compression is ln: comparing the two is already that stage's ablation, and
    # the arm's gap to the baseline (ln - ln) is 0 by construction, so it is not a test
    values = {"ln": [2.37, 2.36, 2.38, 2.37, 2.36], "ln+ib-l": [2.40, 2.41, 2.39, 2.42, 2.38]}
    summary = summarize(_runs(values), ["ln", "ln+ib-l"], "ln", metric_named("test_acc"))
    (compression,) = summary.ablations
    assert (compression.ablation.stage, compression.ablation.arm) == ("compression", "ln")
    assert compression.without is None and compression.without_test is None
    assert compression.effect_test.p_holm == pytest.approx(compression.effect_test.p)  # a family of one


@pytest.mark.parametrize("field", ["test_acc", "test_loss"])
def test_the_ablation_intervals_are_adjusted_for_their_family(field):
    """The ablation table printed the unadjusted 95% interval of the change beside a Holm verdict. Shown now: the
    t interval at the Holm level each test was last tested at, in the metric's own direction (arm - norm; arm -
    baseline for the gap left), excluding 0 exactly when the stage is shown to help or hurt."""
    from scipy import stats as sps

    from normkit_lab.analysis.ablations import attribution

    values = {"bn": [95.0, 96.0, 95.5, 94.8, 95.9], "bnn": [92.6, 93.9, 93.1, 92.4, 93.5],
              "bn+nn(noise=0.0)": [94.9, 96.1, 95.3, 94.9, 95.7],
              "bn+nn(lambda_min=1.0,lambda_max=1.0)": [92.9, 93.8, 93.4, 92.2, 93.6]}
    runs = [Run(norm, seed, "ok", 1, epochs=[{"epoch": 0, "val_acc": 0.5, "val_loss": 1.0, field: v / 100}])
            for norm, row in values.items() for seed, v in enumerate(row)]
    summary = summarize(runs, ["bn", "bnn"], "bn", metric_named(field))
    scale = 100.0 if field == "test_acc" else 1.0
    for t in summary.ablations:
        low, high = t.change_adjusted
        assert (low > 0 or high < 0) == (t.role in ("helps", "hurts")), t
        change = [(a - n) / 100 * scale for a, n in zip(values[t.ablation.arm], values["bnn"], strict=True)]
        ci = sps.ttest_1samp(change, 0.0).confidence_interval(1 - t.effect_test.level)
        assert (low, high) == (pytest.approx(ci.low), pytest.approx(ci.high))
        assert t.effect_test.level < 0.05  # a family of 4: the interval is wider than the 95% one
        assert low < -t.effect.high or high > -t.effect.low
        gap = [(a - b) / 100 * scale for a, b in zip(values[t.ablation.arm], values["bn"], strict=True)]
        ci = sps.ttest_1samp(gap, 0.0).confidence_interval(1 - t.without_test.level)
        assert t.without_adjusted == (pytest.approx(ci.low), pytest.approx(ci.high))
        assert f"[{low:+.2f}, {high:+.2f}] (Holm-adjusted)" in attribution(t, summary.rows[1].verdict, "bn", "%")
        row = t.as_dict()
        assert (row["effect_adj_low"], row["effect_adj_high"]) == (pytest.approx(-high), pytest.approx(-low))
