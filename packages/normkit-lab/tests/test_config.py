"""Comparison config: seeds and norms syntax, YAML loading, CLI > YAML > defaults, round trip."""

from __future__ import annotations

import pytest

from normkit import NormkitError
from normkit_lab import spec
from normkit_lab.errors import ConfigError
from normkit_lab.study import config
from normkit_lab.study.plan import compare_plan


@pytest.mark.parametrize(("text", "seeds"), [
    ("3", [0, 1, 2]), (2, [0, 1]), ("0,1,5", [0, 1, 5]), ("7,", [7]), ("2-4", [2, 3, 4]), ([4, 9], [4, 9]),
])
def test_parse_seeds(text, seeds):
    assert config.parse_seeds(text) == seeds


@pytest.mark.parametrize("bad", ["0", 0, "a,b", "1,1", "4-2", [], [1, -1], True, 1.5, "-3"])
def test_parse_seeds_rejects(bad):
    with pytest.raises(ConfigError, match="seed"):
        config.parse_seeds(bad)


def test_parse_norms_canonical_and_unique():
    assert config.parse_norms("BN, gn(groups=4)+pn") == ["bn", "gn(groups=4)+pn"]
    assert config.parse_norms(["bn", "ln"]) == ["bn", "ln"]
    with pytest.raises(ConfigError, match="listed twice"):
        config.parse_norms("bn,batchnorm")
    with pytest.raises(NormkitError, match="did you mean"):
        config.parse_norms("bn,gnn2")


def _yaml(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_precedence_cli_over_yaml_over_defaults(tmp_path):
    path = _yaml(tmp_path, "norms: [bn, ln]\nepochs: 3\nbatch-size: 16\n")
    cfg = config.resolve({"epochs": 2}, path)
    assert cfg.train.epochs == 2  # CLI
    assert cfg.train.batch_size == 16  # YAML, '-' read as '_'
    assert cfg.train.model == "small-cnn" and cfg.seeds == list(spec.DEFAULT_SEEDS)  # defaults
    assert cfg.norms == ["bn", "ln"] and cfg.baseline_norm == "bn"
    assert config.resolve({"dataset": "digits", "norms": "ln,bn"}, path).norms == ["ln", "bn"]


def test_plan_is_seed_major_and_pairs_by_seed():
    cfg = config.build_config({"dataset": "digits", "norms": "bn,ln", "seeds": "2", "batch_size": 16})  # one cell
    assert [(r.norm, r.seed) for r in compare_plan(cfg)] == [("bn", 0), ("ln", 0), ("bn", 1), ("ln", 1)]


@pytest.mark.parametrize(("text", "match"), [
    ("norms: [bn]\nepoch: 3\n", "unknown key 'epoch'.*did you mean 'epochs'"),
    ("norms: [bn]\nepochs: three\n", "epochs must be a whole number"),
    ("norms: [bn]\nlr: [1]\n", "lr must be"),
    ("norms: [bn\n", "not valid YAML: .* at line 2"),
    ("- bn\n- ln\n", "must be a mapping"),
    ("epochs: 2\n", "no norms to compare"),
    ("norms: [bn, ln]\nbaseline: gn\n", "baseline 'gn' is not one of the compared norms"),
    ("norms: 3\n", "norms must be a comma list"),
])
def test_bad_yaml_is_one_clear_error(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match) as info:
        config.resolve({}, _yaml(tmp_path, text))
    assert "\n" not in str(info.value)


def test_unreadable_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        config.resolve({"dataset": "digits", "norms": "bn"}, tmp_path / "missing.yaml")


def test_saved_yaml_round_trips(tmp_path):
    cfg = config.build_config({"dataset": "digits", "norms": "bn,gn+pn", "seeds": "0,4", "epochs": 2,
                               "batch_size": 128, "lr": 0.05,
                               "baseline": "gn+pn", "model_params": {"width": 8}})
    again = config.resolve({}, _yaml(tmp_path, config.save_yaml(cfg)))
    assert again.to_dict() == cfg.to_dict() and again.norms == cfg.norms


def test_float_fields_take_ints():
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "lr": 1, "weight_decay": 0})
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


def test_key_values():
    assert config.parse_key_values(["width=8", "depth=2", "name=abc", "on=true"], "--model-param") == {
        "width": 8, "depth": 2, "name": "abc", "on": True}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        config.parse_key_values(["width"], "--model-param")


def test_a_model_brings_its_training_defaults_and_typed_values_win(tmp_path):
    gpt = config.resolve({"norms": "ln", "model": "gpt-tiny"}).train  # gpt-tiny's CPU recipe
    assert (gpt.dataset, gpt.optimizer, gpt.lr, gpt.weight_decay, gpt.batch_size) == ("pysrc", "adamw", 3e-3, 0.1, 16)
    assert (gpt.budget, gpt.warmup_epochs, gpt.dataset_params["seq_len"]) == ("steps=4000", 0, 32)
    gpt2 = config.resolve({"norms": "ln", "model": "gpt"}).train
    assert (gpt2.lr, gpt2.batch_size, gpt2.epochs, gpt2.dataset_params) == (3e-3, 32, 5, {})
    typed = config.resolve({"norms": "ln", "model": "gpt-tiny", "lr": 0.01, "batch-size": 8}).train
    assert (typed.lr, typed.batch_size, typed.optimizer) == (0.01, 8, "adamw")
    path = tmp_path / "exp.yaml"
    path.write_text("model: gpt-tiny\noptimizer: sgd\n")
    assert config.resolve({"dataset": "digits", "norms": "ln"},
                          path).train.optimizer == "sgd"  # the file beats model defaults
    default = config.resolve({"dataset": "digits", "norms": "bn"})  # the digits dataset brings the default design
    cnn = default.train
    assert (cnn.optimizer, cnn.batch_size, cnn.budget, cnn.lr, cnn.dataset) == ("sgd", 2, "steps=500", 0.02, "digits")
    assert default.sweep == {"batch_size": [2, 16]}
    other = config.resolve({"norms": "bn", "dataset": "fake"}).train  # global defaults elsewhere
    assert (other.batch_size, other.epochs, other.lr) == (128, 5, None)
    mine = config.resolve({"dataset": "digits", "norms": "bn",
                           "batch-size": 16}).train  # typed values beat the dataset's
    assert (mine.batch_size, mine.epochs) == (16, 1)


def test_a_recipes_length_stays_under_a_sweep_or_a_batch_and_gives_way_to_the_users_length():
    """gpt-tiny registers a length (4,000 steps) and no cells: `--sweep optimizer=adamw,muon` used to drop
    it for the global 5 epochs, which on its streamed corpus is 5 passes over 25 MB per run."""
    swept = config.resolve({"norms": "rms", "model": "gpt-tiny", "sweep": ["optimizer=adamw,muon"]})
    assert (swept.train.budget, swept.sweep) == ("steps=4000", {"optimizer": ["adamw", "muon"]})
    assert config.resolve({"norms": "rms", "model": "gpt-tiny", "batch-size": 8}).train.budget == "steps=4000"
    mine = config.resolve({"norms": "rms", "model": "gpt-tiny", "epochs": 2}).train
    assert (mine.budget, mine.epochs) == (None, 2)
    assert config.resolve({"norms": "rms", "model": "gpt-tiny", "budget": "steps=10"}).train.budget == "steps=10"
    designed = config.resolve({"norms": "bn", "sweep": ["lr=0.1"]})  # digits' cells and length go together
    assert (designed.train.budget, designed.sweep) == (None, {"lr": [0.1]})


def test_an_unknown_model_gets_no_defaults_and_is_named_by_the_check():
    assert spec.registered_train_defaults("model", "gpt-tiniest") == {}
    assert spec.registered_train_defaults("model", 3) == {}
