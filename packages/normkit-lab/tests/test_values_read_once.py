"""One reading of every value normkit takes (issue 41): a YAML file, `--tune`, `--model-param` and the
command line agree on what a number is, and a key given twice, in any spelling, is refused."""

from __future__ import annotations

import pytest

from normkit_lab import safe_yaml
from normkit_lab.errors import ConfigError
from normkit_lab.study import config


def _resolve(tmp_path, text, **cli):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return config.resolve(cli, path)


@pytest.mark.parametrize("text", ["norms: bn\nbatch_size: 64\nbatch-size: 8\n",
                                  "norms: bn\nbatch-size: 8\nbatch_size: 64\n"])
def test_keys_that_differ_only_by_dash_or_underscore_are_one_key_given_twice(tmp_path, text):
    with pytest.raises(ConfigError, match="batch_size twice .*'batch_size' and 'batch-size'|"
                                          "batch_size twice .*'batch-size' and 'batch_size'") as info:
        _resolve(tmp_path, text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "key", "value"), [
    ("batch_size: 010", "batch_size", 10),  # YAML 1.1: octal 8
    ("lr: 1e-3", "lr", 0.001),  # YAML 1.1: the text "1e-3", then refused
    ("lr: 1E-2", "lr", 0.01),
    ("lr: .5", "lr", 0.5),
    ("epochs: +3", "epochs", 3),
])
def test_numbers_in_a_config_file_read_as_on_the_command_line(tmp_path, text, key, value):
    cfg = _resolve(tmp_path, f"norms: bn\n{text}\n")
    assert getattr(cfg.train, key) == value and type(getattr(cfg.train, key)) is type(value)


@pytest.mark.parametrize("text", ["epochs: 1:30", "epochs: 1_0", "batch_size: 0b11"])
def test_yaml_1_1_number_forms_the_command_line_refuses_are_refused(tmp_path, text):
    with pytest.raises(ConfigError, match="must be a whole number") as info:
        _resolve(tmp_path, f"norms: bn\n{text}\n")
    assert "\n" not in str(info.value)


def test_tune_values_read_as_the_config_file_reads_them():
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "tune": ["lr=1e-3,.1", "warmup_epochs=010,2"]})
    assert cfg.tune == {"lr": [0.001, 0.1], "warmup_epochs": [10, 2]}


@pytest.mark.parametrize("tune", [["lr=0.1,0.3", "lr=0.03"], ["batch_size=4,8", "batch-size=16"]])
def test_a_repeated_tune_key_is_refused_not_last_wins(tune):
    with pytest.raises(ConfigError, match="gives (lr|batch_size) twice") as info:
        config.build_config({"dataset": "digits", "norms": "bn", "tune": tune})
    assert "\n" not in str(info.value)


def test_a_repeated_model_param_is_refused_not_last_wins():
    with pytest.raises(ConfigError, match="--model-param gives width twice"):
        config.parse_key_values(["width=8", "width=16"], "--model-param")


@pytest.mark.parametrize(("tune", "words"), [(["lr=abc"], "tune value of lr must be a number, not 'abc'"),
                                             (["epochs=2.5"], "epochs must be a whole number, not 2.5")])
def test_a_wrong_value_type_is_said_in_words_not_as_a_type_annotation(tune, words):
    with pytest.raises(ConfigError) as info:
        config.build_config({"dataset": "digits", "norms": "bn", "tune": tune})
    assert words in str(info.value) and "|" not in str(info.value) and "float" not in str(info.value)


def test_saved_config_quotes_text_that_would_read_back_as_a_number():
    values = {"a": "1e-3", "b": "010", "c": 0.001, "d": "1:30", "e": 1e-5}
    assert safe_yaml.loads(safe_yaml.dumps(values), "x") == values


@pytest.mark.parametrize(("budget", "words"), [
    ("steps=1e14", "budget steps=1e14 is too large: at most 100,000,000 steps"),
    ("steps=100000000000000", "budget steps=100000000000000 is too large: at most 100,000,000 steps"),
    ("epochs=20000", "too large: at most 10,000 epochs"),
    ("steps=1e3", "must be a whole number >= 1 written with digits"),
    ("steps=0", "must be a whole number >= 1"),
])
def test_a_budget_names_its_real_problem(budget, words):
    with pytest.raises(ConfigError) as info:
        config.parse_budget(budget)
    assert words in str(info.value)


@pytest.mark.parametrize("epochs", [0, 20_000])
def test_epochs_out_of_range_are_refused_with_a_command(epochs):
    with pytest.raises(ConfigError, match=r"epochs .* is not in \[1, 10,000\]; the command gets it as \{epochs\}"):
        config.build_config({"norms": "bn", "command": "python t.py", "epochs": epochs})


def test_keys_that_end_the_default_design_say_which_cells_stop_running():
    """Issue 41: `--budget steps=N` on the default silently dropped its batch-16 cell (6 runs, not 12)."""
    note = config.design_note({"dataset": "digits", "norms": "bn", "budget": "steps=100"})
    assert note == ("--budget replaces the default design of digits (batch_size=2,16 at steps=500 each), so every "
                    "run trains at batch_size=2; to keep its cells, add --sweep batch_size=2,16")
    assert "so every run trains at batch_size=32" in config.design_note({"dataset": "digits", "norms": "bn",
                                                                         "batch_size": 32})
    assert config.design_note({"dataset": "digits", "norms": "bn"}) is None  # the design stands
    assert config.design_note({"dataset": "digits", "norms": "bn", "budget": "steps=9",
                               "sweep": ["batch_size=4,8"]}) is None  # own cells
    assert config.design_note({"norms": "bn", "epochs": 2, "dataset": "synthetic"}) is None  # no design there


def test_an_empty_workloads_list_says_so_not_that_none_are_registered():
    """Issue 41: `normkit suite --workloads ""` said "no workloads are registered"."""
    from normkit_lab.suite.run import SuitePlan

    with pytest.raises(ConfigError, match="--workloads names no workload; give names separated by commas"):
        SuitePlan.make("bn,ln", seeds=3, workloads=[])


def test_a_results_directory_written_before_still_reads_as_written(tmp_path):
    """config.yaml of an older comparison may hold a plain `1e-3` meaning the text (a program's own tune value,
    passed as written); reading it as YAML 1.2 would make it 0.001, so the store's hash and its runs' tuned
    values would no longer match. A results directory's own files are read by the rules they were written
    under, and what normkit writes now reads the same under both."""
    import json

    import yaml

    from normkit_lab.records import config_hash, config_identity
    from normkit_lab.store.results import ResultsDir

    cfg = config.build_config({"norms": "bn,ln", "command": "python t.py {lr}", "tune": ["lr=1e-3,0.01"]})
    assert cfg.tune == {"lr": ["1e-3", 0.01]}  # as written: the program gets the text 1e-3
    old_text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)  # how config.yaml was written before
    assert "- 1e-3\n" in old_text
    store = tmp_path / "old"
    store.mkdir()
    (store / "config.yaml").write_text(old_text)
    raw = yaml.safe_load(old_text)
    (store / "store.json").write_text(json.dumps({"format": 1, "config_hash": config_hash(raw),
                                                  "config": config_identity(raw)}))
    ResultsDir.open(store)  # not "config.yaml was edited after the store was created"
    assert config.load_yaml(store / "config.yaml", saved=True)["tune"] == {"lr": ["1e-3", 0.01]}
    assert config.build_config(config.load_yaml(store / "config.yaml", saved=True)).tune == cfg.tune
    assert "'1e-3'" in config.save_yaml(cfg)  # written now: quoted, the same under both rule sets
