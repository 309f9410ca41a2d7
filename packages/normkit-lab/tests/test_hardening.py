"""Bad input the lab refuses with one line before anything runs: YAML bombs and binary files,
non-finite and absurd values, sizes over the documented limits, dataset names vs paths,
tampered runs.jsonl rows and symlinks in a results directory; failed runs and their retry."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest

import normkit
from normkit import plugins
from normkit_lab import safe_yaml
from normkit_lab.datasets import load_dataset
from normkit_lab.errors import ConfigError, one_line
from normkit_lab.limits import MAX_SEED, MAX_SEEDS, MAX_YAML_NODES
from normkit_lab.models import model_params, preact_resnet
from normkit_lab.records import EpochRecord, RunId, RunResult, failed_run
from normkit_lab.runs.checks import check_config
from normkit_lab.spec import TrainConfig
from normkit_lab.store.results import RUNS_FILE, ResultsDir, check_row, rows_to_runs, run_rows
from normkit_lab.study import config

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8))


def assert_one_line(exc: BaseException, *needles: str) -> None:
    text = str(exc)
    assert "\n" not in text and len(text) < 600, text
    for needle in needles:
        assert needle in text, text


# -- YAML ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "needle"), [
    (BOMB, f"more than {MAX_YAML_NODES:,} YAML values"),
    ("a: &a [*a]\n", f"more than {MAX_YAML_NODES:,} YAML values"),  # a cycle
    ("norms: [bn\nepochs: 3\n", "is not valid YAML"),
    ("norms: {bn: [}\n", "is not valid YAML"),
    ("x" * 1_000_001, "larger than"),
    ("a: !!python/object:os.system x\n", "is not valid YAML"),
])
def test_bad_yaml_text_is_one_line(text, needle):
    with pytest.raises(ConfigError) as info:
        safe_yaml.loads(text, "config")
    assert_one_line(info.value, needle)


@pytest.mark.parametrize(("data", "needle"), [
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", "not UTF-8 text"),
    (b"norms: [bn]\nepochs: \xff\xfe\n", "line 2 is not UTF-8"),
    (b"norms: [bn]\x00\n", "NUL byte"),
    (BOMB.encode(), "YAML values"),
])
def test_binary_or_bomb_config_files_are_refused(tmp_path, data, needle):
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        config.load_yaml(path)
    assert_one_line(info.value, needle, str(path))


@pytest.mark.parametrize(("text", "needle"), [
    ("epochs: 1\nnorms: bn\nepochs: 3\n", "key 'epochs' twice (lines 1 and 3)"),
    ("model_params:\n  width: 8\n  width: 16\n", "key 'width' twice (lines 2 and 3)"),
    ("{seeds: 1, seeds: 2}", "key 'seeds' twice (line 1)"),
])
def test_a_duplicate_yaml_key_is_refused_with_its_lines(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        safe_yaml.read(path, "config")
    assert_one_line(info.value, needle, str(path))


def test_a_small_alias_is_fine():
    assert safe_yaml.loads("a: &w 3\nb: *w\n", "x") == {"a": 3, "b": 3}


@pytest.mark.parametrize("item", ["width=[1", "width={a: [}", "width=" + BOMB.replace("\n", "\n "),
                                  "width=!!binary x"])
def test_key_value_yaml_errors_are_one_line(item):
    with pytest.raises(ConfigError) as info:
        config.parse_key_values([item], "--model-param")
    assert_one_line(info.value, "--model-param width")


# -- values and limits -------------------------------------------------------------------------


@pytest.mark.parametrize(("seeds", "needle"), [
    ("10000000000", "at most 1,000"),
    (10_000_000_000, "at most 1,000"),
    (f"0-{MAX_SEED + 5}", "above 4294967295"),
    ("0-5000", "at most 1,000"),
    (f"1,{MAX_SEED + 1}", "above 4294967295"),
    ([0, MAX_SEED + 1], "above 4294967295"),
    (list(range(MAX_SEEDS + 1)), "at most 1,000"),
    ("9" * 20_000, "character text"),
])
def test_absurd_seeds_are_refused_before_a_list_is_built(seeds, needle):
    with pytest.raises(ConfigError) as info:
        config.parse_seeds(seeds)
    assert_one_line(info.value, needle)


def test_largest_seed_is_accepted():
    assert config.parse_seeds([MAX_SEED]) == [MAX_SEED]


@pytest.mark.parametrize("key", ["lr", "momentum", "gamma", "weight_decay", "label_smoothing"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_training_floats_are_refused(key, value):
    cfg = config.build_config({"dataset": "digits", "norms": "bn", key: value})
    with pytest.raises(ConfigError) as info:
        check_config(cfg.train, cfg.norms)
    assert_one_line(info.value, key)


@pytest.mark.parametrize("text", ["lr: .nan", "momentum: .inf", "gamma: -.inf", "weight_decay: .NaN"])
def test_non_finite_yaml_values_are_refused(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(f"norms: [bn]\n{text}\n")
    cfg = config.resolve({}, path)
    with pytest.raises(ConfigError) as info:
        check_config(cfg.train, cfg.norms)
    assert_one_line(info.value, text.split(":")[0])


@pytest.mark.parametrize(("changes", "needle"), [
    ({"epochs": 10**8}, "epochs must be an integer in [1, 10,000]"),
    ({"batch_size": 10**7}, "batch_size must be an integer in [1, 65,536]"),
    ({"step_size": 10**9}, "step_size"),
    ({"num_workers": 10**6}, "num_workers"),
    ({"cpu_threads": 10**6}, "cpu_threads"),
    ({"model_params": {"width": 10**6}}, "parameters; at most 1,000,000,000"),
    ({"model_params": {"depth": 10**6}}, "depth in [1, 1000]"),
    ({"model_params": {"width": float("nan")}}, "not finite"),
    ({"model_params": {"width": 2**40}}, "beyond 2,147,483,647"),
    ({"model": "wrn", "model_params": {"depth": 6 * 10**6 + 4}}, "at most 1000"),
    ({"model": "resnet18", "dataset": "fake", "dataset_params": {"image_size": 1, "size": 8}}, "at least 8x8"),
    ({"dataset": "fake", "dataset_params": {"image_size": 1, "size": 8}}, "at least 2x2"),
    ({"dataset": "fake", "dataset_params": {"image_size": 10**5}}, "image_size <= 1024"),
    ({"dataset": "fake", "dataset_params": {"size": 10**9}}, "size <= 1,000,000"),
    ({"dataset": "fake", "dataset_params": {"size": 10**6, "image_size": 1024}}, "GiB"),
    ({"dataset": "fake", "dataset_params": {"size": float("inf")}}, "not finite"),
    ({"dataset": "digits", "dataset_params": {"val_fraction": float("nan")}}, "not finite"),
])
def test_absurd_sizes_are_refused_before_building(changes, needle):
    with pytest.raises(normkit.NormkitError) as info:
        check_config(TrainConfig(**changes), ["bn"])
    assert_one_line(info.value, needle)


def test_model_params_are_typed_and_finite():
    assert model_params("small-cnn", {"width": 8}) == {"width": 8}
    for bad in (float("inf"), [1, float("nan")]):
        with pytest.raises(normkit.SpecError, match="not finite"):
            model_params("vit-small", {"width": bad})


def test_model_summaries_name_the_defaults_they_build():
    params = inspect.signature(preact_resnet.wide_resnet).parameters
    summary = {name: plugins.registry().lookup_item("model", name).summary
               for name in ("wrn", "vit", "vit-small", "small-cnn")}
    assert f"WRN-{params['depth'].default}-{params['width'].default}" in summary["wrn"]
    assert "WRN-16-4" in summary["wrn"] and summary["small-cnn"].startswith("3 conv-norm-ReLU blocks")
    assert "patch 4, 8 layers, 8 heads, width 768, MLP 2304" in summary["vit"]
    assert "patch 2, 2 layers, 4 heads, width 64, MLP 128" in summary["vit-small"]


# -- dataset names and paths --------------------------------------------------------------------


def _images(folder, classes=("a", "b"), per_class=3):
    from PIL import Image

    for cls in classes:
        (folder / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(folder / cls / f"{i}.png")


def test_a_directory_named_like_a_dataset_does_not_shadow_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _images(tmp_path / "digits")
    builtin = load_dataset("digits")
    assert (builtin.num_classes, builtin.in_channels) == (10, 1)
    for path_form in ("./digits", str(tmp_path / "digits"), "digits/"):
        folder = load_dataset(path_form, image_size=8)
        assert (folder.num_classes, folder.in_channels) == (2, 3)


def test_a_bare_name_of_a_directory_hints_at_the_path_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _images(tmp_path / "myimages")
    with pytest.raises(normkit.SpecError) as info:
        load_dataset("myimages")
    assert_one_line(info.value, "unknown dataset", "write it as a path: ./myimages")


@pytest.mark.parametrize("name", ["./missing", "~/surely-not-here-normkit", "/nonexistent/x"])
def test_a_path_that_is_not_a_directory_is_refused(name):
    with pytest.raises(normkit.SpecError) as info:
        load_dataset(name)
    assert_one_line(info.value, "does not exist")


# -- runs.jsonl rows and the results directory --------------------------------------------------

ENV = {"host": "h", "torch_version": "2", "device": "cpu"}
RECORD = EpochRecord(0, 1.0, 0.5, 0.9, 0.6, None, 0.5, 100.0, 10.0, 0.1)


def good_row() -> dict:
    return run_rows(RunResult("bn", 0, "ok", [RECORD], 10), ENV)[0]


@pytest.mark.parametrize(("row", "needle"), [
    ([1, 2], "is a JSON list, not an object"),
    ("text", "is a JSON str"),
    (None, "is a JSON NoneType"),
    ({"norm": "bn"}, "lacks seed, status, epoch, params"),
    ({**good_row(), "seed": "zero"}, "has seed 'zero'"),
    ({**good_row(), "seed": -1}, "has seed -1"),
    ({**good_row(), "status": "great"}, "has status 'great'"),
    ({**good_row(), "epoch": 1.5}, "has epoch 1.5"),
    ({**good_row(), "val_acc": "high"}, "has val_acc 'high'"),
    ({**good_row(), "params": True}, "has params True"),
    ({**good_row(), "extras": [1]}, "has extras [1]"),
    ({**good_row(), "extras": {"diagnostics": 5}}, "has extras {'diagnostics': 5}"),
    ({**good_row(), "status": "failed"}, "no error text"),
    ({**good_row(), "norm": ""}, "has norm ''"),
])
def test_check_row_names_the_problem(row, needle):
    with pytest.raises(ConfigError) as info:
        check_row(row, "runs.jsonl:7")
    assert_one_line(info.value, "runs.jsonl:7", needle)


@pytest.fixture
def store(tmp_path):
    store = ResultsDir.create(tmp_path / "r", "norms: [bn]\n", {"python": "3"})
    store.append_run(RunResult("bn", 0, "ok", [RECORD], 10), ENV)
    return store


@pytest.mark.parametrize(("line", "needle"), [
    (b"\xff\xfe\x00garbage\n", ":2 is not UTF-8"),
    (b"[1, 2]\n", ":2 is a JSON list"),
    (b'{"norm": "bn"}\n', ":2 lacks"),
    (b"[" * 100_000 + b"\n", ":2 is not a JSON row"),
])
def test_tampered_runs_jsonl_is_one_line_naming_file_and_line(store, line, needle):
    with (store.path / RUNS_FILE).open("ab") as f:
        f.write(line)
    before = (store.path / RUNS_FILE).read_bytes()
    with pytest.raises(ConfigError) as info:
        store.runs()
    assert_one_line(info.value, str(store.path / RUNS_FILE), needle)
    assert (store.path / RUNS_FILE).read_bytes() == before


def test_a_symlinked_runs_file_is_refused_and_nothing_written_elsewhere(store, tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    (store.path / RUNS_FILE).unlink()
    os.symlink(target, store.path / RUNS_FILE)  # dangling
    for action in (lambda: ResultsDir.open(store.path), store.rows,
                   lambda: store.append_run(RunResult("bn", 1, "ok", [RECORD], 10), ENV),
                   lambda: store.write_summary([{"norm": "bn"}])):
        with pytest.raises(ConfigError) as info:
            action()
        assert_one_line(info.value, "is a symbolic link")
    assert not target.exists()


def test_a_symlinked_results_directory_is_refused(store, tmp_path):
    link = tmp_path / "link"
    os.symlink(store.path, link)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        ResultsDir.open(link)


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "line 1 is not valid JSON"),
    ("[1, 2]", "holds a JSON list"),
    ("\xff", "is not UTF-8 text"),
])
def test_broken_environment_json_is_one_line(store, text, needle):
    (store.path / "environment.json").write_text(text, encoding="latin-1")
    with pytest.raises(ConfigError) as info:
        store.environment()
    assert_one_line(info.value, "environment.json", needle)


# -- failed runs --------------------------------------------------------------------------------


def test_failed_run_is_one_row_naming_the_norm_and_resume_retries_it(store):
    try:
        raise RuntimeError("shape\nmismatch [2, 3]")
    except RuntimeError as exc:
        failed = failed_run("gn(groups=8)", 0, exc)
    assert failed.status == "failed" and failed.epochs == [] and failed.params is None
    assert failed.error == "gn(groups=8) failed: RuntimeError: shape mismatch [2, 3]"
    store.append_run(failed, ENV)
    rows = store.rows()
    assert rows[-1]["status"] == "failed" and rows[-1]["epoch"] is None and rows[-1]["error"] == failed.error
    assert RunId.of("gn(groups=8)", 0) not in store.finished() and RunId.of("bn", 0) in store.finished()
    retry = RunResult("gn(groups=8)", 0, "ok", [RECORD], 12)
    store.append_run(retry, ENV)
    runs = {(r.norm, r.seed): r for r in store.runs()}
    assert runs[("gn(groups=8)", 0)] == dataclasses.replace(retry, extras={})
    assert RunId.of("gn(groups=8)", 0) in store.finished()


def test_rows_to_runs_keeps_the_latest_attempt():
    fail_row = run_rows(RunResult("bn", 0, "failed", [], None, error="bn failed: x"), ENV)
    ok_rows = run_rows(RunResult("bn", 0, "ok", [RECORD, dataclasses.replace(RECORD, epoch=1)], 10), ENV)
    runs = rows_to_runs([*fail_row, *ok_rows])
    assert len(runs) == 1 and runs[0].status == "ok" and len(runs[0].epochs) == 2
    runs = rows_to_runs([*fail_row, *fail_row])
    assert len(runs) == 1 and runs[0].status == "failed"


def test_one_line_flattens_and_shortens():
    assert one_line("a\n  b\tc") == "a b c"
    assert len(one_line("x" * 1000)) == 400 and json.dumps(one_line("y\n" * 500)).count("\\n") == 0


@pytest.mark.parametrize("key", ["train_loss", "val_acc"])
def test_an_epoch_row_needs_its_measurements(key):
    with pytest.raises(ConfigError, match=f"is an epoch row without {key}"):
        check_row({**good_row(), key: None}, "runs.jsonl:1")
    assert check_row({**good_row(), "val_top5": None, "peak_mem_mb": None}, "x") is not None


@pytest.mark.parametrize("text", ["norms: [[1], {a: 2}]\n", "norms: []\n", "norms: [bn]\nbaseline: [x]\n",
                                  "- bn\n"])
def test_report_refuses_a_config_that_compare_never_writes(store, text):
    from normkit_lab.analysis.report import load_results

    (store.path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_results([store.path])
    assert_one_line(info.value, "is not a config written by `normkit compare`")
