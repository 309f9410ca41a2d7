"""Suite workloads: the built-in ones, their forms (quick, paper, held-out variants), registration by a
plugin through the `normkit_register_workloads` hook, and one-line errors for a wrong workload."""

from __future__ import annotations

from typing import Any

import pytest

import normkit
from normkit.testing import temporary_plugin
from normkit_lab.errors import ConfigError
from normkit_lab.suite import available, load_workload
from normkit_lab.suite.workloads import parse_workload

DEMO = {"question": "does it train a narrow net?", "config": {"model": "small-cnn", "model_params": {"width": 4},
                                                             "dataset": "digits",
                                                             "batch_size": 64, "epochs": 1},
        "tune": {"lr": [0.05, 0.1]}, "target": 50.0, "variants": {"wide": {"model_params": {"width": 8}}}}


class Workloads:
    """A third-party plugin registering workloads."""

    def __init__(self, **workloads: Any) -> None:
        self.workloads = workloads

    @normkit.hookimpl
    def normkit_register_workloads(self, register):
        for name, workload in self.workloads.items():
            register(name, workload, summary=workload.get("question", "") if isinstance(workload, dict) else "")


def test_builtin_workloads_differ_and_each_has_every_form() -> None:
    workloads = {w.name: w for w in available()}
    assert list(workloads)[:5] == ["small-batch", "cnn", "deep-resnet", "vit", "lm"]
    models = {w.full_config()["model"] for w in workloads.values()}
    assert models == {"small-cnn", "wrn", "vit-small", "gpt-tiny"}
    for w in workloads.values():
        assert w.variants and w.quick and w.paper and w.question.endswith("?")
        assert w.full_config("paper")["device"] == "cuda"
    assert workloads["lm"].metric.field == "test_bpb"  # the model's registered default, lower is better
    assert workloads["lm"].target_text() == "val_bpb <= 3.6 bits/byte"
    small, cnn = workloads["small-batch"].full_config(), workloads["cnn"].full_config()
    # small-batch and cnn differ only in the batch the norms normalize over: ghost batches of 2, or all 16
    assert (small["norm_batch"], cnn["norm_batch"]) == (2, None) and small["dataset"] == "digit-blends"
    assert {k: v for k, v in small.items() if k != "norm_batch"} == {k: v for k, v in cnn.items() if k != "norm_batch"}


def test_variants_merge_model_params_and_quick_replaces_the_budget() -> None:
    deep = load_workload("deep-resnet")
    config, tune, target = deep.resolved("cpu", "depth16")
    assert config["model_params"] == {"depth": 16, "width": 1} and tune == deep.tune and target == deep.target
    config, tune, target = deep.resolved("quick")
    assert config["model_params"]["depth"] == 10 and tune == {"lr": [0.1, 0.3]} and target == 50.0
    with pytest.raises(ConfigError, match="has no variant 'nope'; its variants: depth16"):
        deep.resolved("cpu", "nope")


def test_a_plugin_registers_a_workload_and_the_suite_lists_it() -> None:
    with temporary_plugin(Workloads(demo=DEMO), "demo-plugin"):
        demo = load_workload("demo")
        assert demo.plugin == "demo-plugin" and demo.name in [w.name for w in available()]
        assert demo.recipe() == "small-cnn(width=4) on digits, sgd, batch 64, 1 epoch"
        assert demo.budget_text() == "2 trials (lr=0.05,0.1)" and demo.target_text() == "val_acc >= 50 %"
    with pytest.raises(normkit.SpecError, match="unknown workload 'demo'"):
        load_workload("demo")


@pytest.mark.parametrize(("change", "message"), [
    ({"target": None}, "target must be a number"),
    ({"tune": {"lr": []}}, "must map training keys to lists of candidates"),
    ({"config": {"seeds": 5}}, "sets 'seeds', which the suite sets alike for every workload"),
    ({"config": {"epochz": 1}}, "unknown key 'epochz'"),
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"question": ""}, "question must be a sentence"),
    ({"variants": {"v": {"tune": "lr"}}}, "variant 'v' tune must be a mapping"),
    ({"config": {"batch_size": "big"}}, "config: batch_size must be a whole number"),
    ({"config": {"metric": "test_accuracy"}}, "config: unknown metric 'test_accuracy'"),
])
def test_a_wrong_workload_fails_in_one_line_naming_it(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_workload("demo", "demo-plugin", {**DEMO, **change})
    assert "workload 'demo' (plugin 'demo-plugin')" in str(caught.value) and "\n" not in str(caught.value)


def test_a_workload_must_be_a_mapping_and_names_are_unique() -> None:
    with pytest.raises(normkit.PluginError, match="the workload must be a mapping"):
        with temporary_plugin(Workloads(bad=["not", "a", "mapping"]), "bad-plugin"):
            pass
    with pytest.raises(normkit.PluginError, match="'cnn' is registered twice"):
        with temporary_plugin(Workloads(cnn=DEMO), "clash-plugin"):
            pass
