"""The data flow of a fair comparison: splits and selection never read test, one weight-decay
policy for every arm, tuning on disjoint seeds, sweeps, a fully resolved config, the Python API."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml

from normkit.layer import NormLayer
from normkit_lab import compare_norms
from normkit_lab.datasets import load_dataset
from normkit_lab.datasets.tensors import ImageTensors
from normkit_lab.errors import ConfigError
from normkit_lab.records import EpochRecord, RunId, RunResult, selected_epoch
from normkit_lab.runs import checks, training
from normkit_lab.spec import TrainConfig
from normkit_lab.store.results import TUNING_FILE, ResultsDir
from normkit_lab.study import compare, config
from normkit_lab.study.plan import choose, compare_plan, run_count, tune_plan

TINY = {"dataset": "fake", "dataset_params": {"size": 40, "image_size": 8, "num_classes": 2},
        "model_params": {"width": 4}, "epochs": 1, "batch_size": 8}


def _record(epoch: int, val_acc: float, test_acc: float) -> EpochRecord:
    return EpochRecord(epoch, 0.5, 0.5, 0.5, val_acc, None, 0.1, 10.0, 1.0, 0.1, test_loss=0.5, test_acc=test_acc)


def test_selection_reads_validation_only():
    epochs = [_record(0, 0.6, 0.9), _record(1, 0.8, 0.1), _record(2, 0.7, 0.95)]
    assert selected_epoch(epochs, "best-val").epoch == 1
    assert selected_epoch(epochs, "final").epoch == 2
    perturbed = [dataclasses.replace(r, test_acc=1.0 - r.test_acc, test_loss=9.0) for r in epochs]
    assert selected_epoch(perturbed, "best-val").epoch == 1


def test_a_run_does_not_change_when_its_test_data_does(monkeypatch):
    cfg = TrainConfig(**{**TINY, "epochs": 2})
    first = training.train_run(cfg, "bn", seed=0)
    data = checks.run_dataset(cfg)
    noisy = ImageTensors(torch.randint(0, 255, data.test.images.shape, dtype=torch.uint8),
                         1 - data.test.labels, data.test.mean, data.test.std, scale=1 / 255)
    monkeypatch.setattr(training, "run_dataset", lambda _cfg: dataclasses.replace(data, test=noisy))
    second = training.train_run(cfg, "bn", seed=0)
    strip = [dataclasses.replace(r, test_acc=None, test_loss=None, epoch_time_s=0, throughput=0, peak_mem_mb=0,
                                 cpu_time_s=0, load_avg=0)
             for run in (first, second) for r in run.epochs]
    assert strip[:2] == strip[2:]  # training and validation identical: test is only reported
    assert [r.test_loss for r in first.epochs] != [r.test_loss for r in second.epochs]
    for select in ("final", "best-val"):
        assert selected_epoch(first.epochs, select).epoch == selected_epoch(second.epochs, select).epoch


def test_val_is_fixed_and_disjoint_from_test_for_every_seed():
    a, b = load_dataset("fake", seed=0, size=40), load_dataset("fake", seed=0, size=40)
    assert torch.equal(a.val.images, b.val.images) and torch.equal(a.test.images, b.test.images)
    digits = load_dataset("digits")
    val = {digits.val.images[i].numpy().tobytes() for i in range(len(digits.val))}
    test = {digits.test.images[i].numpy().tobytes() for i in range(len(digits.test))}
    assert len(val & test) <= 3  # only digits' few duplicate images can coincide


@pytest.mark.parametrize("norm", ["bn", "bnn", "gn(groups=2)+pn", "ln"])
def test_every_arm_decays_every_parameter_alike(norm):
    cfg = TrainConfig(**TINY)
    model = checks.build_run_model(cfg, norm, checks.run_dataset(cfg))
    groups = training._optimizer(cfg, model).param_groups
    assert [g["weight_decay"] for g in groups] == [cfg.resolved_weight_decay]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_norm_weight_decay_is_one_value_for_every_norm_parameter_and_plugin_policy_is_opt_in():
    cfg = TrainConfig(**TINY, norm_weight_decay=0.0)
    model = checks.build_run_model(cfg, "gn(groups=2)+pn", checks.run_dataset(cfg))
    decay = {id(p): g["weight_decay"] for g in training._optimizer(cfg, model).param_groups for p in g["params"]}
    norm_params = {id(p) for m in model.modules() if isinstance(m, NormLayer) for p in m.parameters()}
    conv = [p for name, p in model.named_parameters() if p.dim() == 4]
    assert all(decay[id(p)] == 5e-4 for p in conv)
    assert norm_params and {decay[i] for i in norm_params} == {0.0}
    plugin = training._optimizer(dataclasses.replace(cfg, weight_decay_policy="plugin"), model).param_groups
    assert len({g["weight_decay"] for g in plugin}) >= 2
    with pytest.raises(ConfigError, match="weight_decay_policy must be one of uniform, plugin"):
        checks.check_config(TrainConfig(**TINY, weight_decay_policy="pn"), ["bn"])


def test_tune_seeds_must_not_overlap_the_comparison_seeds():
    with pytest.raises(ConfigError, match="tune_seeds 1 are also comparison seeds.*--tune-seeds 3,4"):
        config.build_config({"dataset": "digits", "norms": "bn", "seeds": "0-2", "tune": "lr=0.1,0.3",
                             "tune_seeds": "1,7"})
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": "3", "tune": ["lr=0.1,0.3"]})
    assert cfg.tune == {"lr": [0.1, 0.3]} and cfg.tune_seeds == [3, 4]
    with pytest.raises(ConfigError, match="'optimizer' is not numeric"):
        config.build_config({"dataset": "digits", "norms": "bn", "tune": "optimizer=sgd,adamw"})
    with pytest.raises(ConfigError, match="'lrr' is not a training key.*'lr'"):
        config.build_config({"dataset": "digits", "norms": "bn", "tune": "lrr=0.1"})


def test_tuning_picks_the_best_validation_value_then_runs_the_comparison_seeds_with_it(tmp_path):
    cfg = config.build_config({"norms": "bn,ln", "seeds": "2", "tune": "lr=1e-5,0.2", "tune_seeds": [5],
                               **TINY, "epochs": 2})
    assert run_count(cfg) == (4, 4)
    assert {r.seed for r in tune_plan(cfg)} == {5} and all(r.phase == "tune" for r in tune_plan(cfg))
    store = compare.create_store(cfg, tmp_path / "out")
    compare.run_compare(cfg, store)
    table = json.loads((store.path / TUNING_FILE).read_text())
    assert len(table) == 4 and sum(row["chosen"] for row in table) == 2
    for norm in ("bn", "ln"):
        rows = [row for row in table if row["norm"] == norm]
        best = max(rows, key=lambda row: row["val_acc"])
        assert best["chosen"]
    rows = store.rows()
    assert {row["phase"] for row in rows} == {"tune", "compare"}
    chosen = {row["norm"]: row["values"] for row in table if row["chosen"]}
    for row in rows:
        if row["phase"] == "compare":
            assert row["tuned"] == chosen[row["norm"]] and row["seed"] in (0, 1) and row["cell"] == {}
            assert row["lr"] <= row["tuned"]["lr"]  # the run trained at the chosen peak lr
    assert {RunId.of_row(r) for r in rows} == set(tune_plan(cfg)) | set(compare_plan(cfg, choose(cfg, store.runs())[0]))


def test_choose_prefers_runs_that_did_not_diverge():
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": "1", "tune": "lr=0.1,0.3",
                               "tune_seeds": [2], "batch_size": 2})
    runs = [RunResult("bn", 2, "ok", [_record(0, 0.7, 0.0)] * 5, 1, phase="tune", tuned={"lr": 0.1}),
            RunResult("bn", 2, "diverged", [_record(0, 0.9, 0.0)], 1, phase="tune", tuned={"lr": 0.3})]
    chosen, table = choose(cfg, runs)
    assert chosen == {((), "bn"): {"lr": 0.1}} and [row["chosen"] for row in table] == [True, False]


def test_spec_lists_and_sweeps_expand_into_a_grid():
    cfg = config.build_config({"dataset": "digits", "norms": "bn,bnn(noise=[0,0.4])", "seeds": "2",
                               "sweep": ["batch_size=4,16", "lr=0.05,0.1"]})
    assert cfg.norms == ["bn", "bnn(noise=0.0)", "bnn(noise=0.4)"]
    plan = compare_plan(cfg)
    assert len(plan) == 4 * 2 * 3 and run_count(cfg) == (0, 24)
    assert {dict(r.cell)["batch_size"] for r in plan} == {4, 16} and plan[0].cell == (("batch_size", 4),
                                                                                        ("lr", 0.05))
    assert plan[0].train_config(cfg.train).batch_size == 4
    with pytest.raises(ConfigError, match="'device' is not a training key"):
        config.build_config({"dataset": "digits", "norms": "bn", "sweep": "device=cpu,cuda"})
    with pytest.raises(ConfigError, match="both tuned and swept"):
        config.build_config({"dataset": "digits", "norms": "bn", "sweep": "lr=0.1,0.2", "tune": "lr=0.1,0.2"})


def test_resume_is_keyed_by_the_whole_run_identity(tmp_path):
    cfg = config.build_config({"norms": "bn", "seeds": "1", "sweep": "batch_size=4,8", **TINY})
    store = compare.create_store(cfg, tmp_path / "out")
    first = compare_plan(cfg)[0]
    store.append_run(RunResult("bn", 0, "ok", [_record(0, 0.5, 0.5)], 1, cell=dict(first.cell)), {})
    assert ResultsDir.open(store.path).finished() == {first}
    assert RunId.of("bn", 0, cell={"batch_size": 8}) not in store.finished()


def test_config_yaml_is_fully_resolved(tmp_path):
    cfg = config.build_config({"norms": "bn,gn(groups=2)+pn", "seeds": "2", **TINY})
    compare.check(cfg)
    saved = yaml.safe_load(config.save_yaml(cfg))
    for key in ("lr", "weight_decay", "norm_weight_decay", "weight_decay_policy", "baseline", "cpu_threads",
                "margin", "select", "tune", "tune_seeds", "sweep"):
        assert saved[key] is not None, key
    assert (saved["lr"], saved["norm_weight_decay"], saved["margin"], saved["baseline"]) == (0.1, 5e-4, 0.5, "bn")


def test_compare_norms_returns_the_results_as_plain_data(tmp_path):
    result = compare_norms("bn,ln", seeds=2, out=tmp_path / "api", **TINY)
    assert result.path == tmp_path / "api" and result.config["norms"] == ["bn", "ln"]
    assert [row["norm"] for row in result.summary] == ["bn", "ln"]
    assert len(result.runs) == 4 and all(row["test_acc"] is not None for row in result.runs)
    assert [v["norm"] for v in result.verdicts] == ["bn", "ln"] and result.tuning == []
