"""The results store: keyed by run identity, refuses a hand-edited config, and stays whole when several
processes fill it at once (real processes, real locks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from normkit_lab.errors import ConfigError
from normkit_lab.records import RunId, config_hash
from normkit_lab.store.results import RUNS_FILE, STORE_FILE, ResultsDir
from normkit_lab.study import compare, config

NORMKIT = str(Path(sys.executable).with_name("normkit"))


@pytest.fixture
def cfg():
    cfg = config.build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 3, "epochs": 1, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg)
    return cfg


def _edit(store: ResultsDir, **values) -> None:
    raw = yaml.safe_load(store.config_path.read_text())
    store.config_path.write_text(yaml.safe_dump({**raw, **values}, sort_keys=False))


def test_store_records_the_config_hash_in_store_json_and_every_row(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")
    info = json.loads((store.path / STORE_FILE).read_text())
    assert info["config_hash"] == config_hash(cfg.to_dict()) == store.config_hash
    assert info["config"]["epochs"] == 1 and "seeds" not in info["config"] and "device" not in info["config"]
    compare.run_compare(cfg, store)
    assert {row["config_hash"] for row in store.rows()} == {store.config_hash}


def test_a_hand_edited_epochs_is_refused_with_one_line_and_nothing_changes(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")
    compare.run_compare(cfg, store)
    _edit(store, epochs=2)
    before = (store.path / RUNS_FILE).read_bytes()
    with pytest.raises(ConfigError) as info:
        compare.open_store(store.path)
    text = str(info.value)
    assert "\n" not in text and "was edited after the store was created (epochs: 1 -> 2)" in text
    assert (store.path / RUNS_FILE).read_bytes() == before


def test_plan_and_runtime_keys_may_change(cfg, tmp_path):
    """More seeds or another device do not change what a finished run computed: resume runs the rest."""
    store = compare.create_store(cfg, tmp_path / "s")
    compare.run_compare(cfg, store)
    _edit(store, seeds=[0, 1, 2, 3], device="cpu", baseline="gn")
    cfg2, store2 = compare.open_store(store.path)
    results = compare.run_compare(cfg2, store2)
    assert sorted({r.seed for r in results.runs}) == [0, 1, 2, 3] and len(store2.rows()) == 8


def test_rows_of_another_configuration_are_refused(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")
    compare.run_compare(cfg, store)
    rows = (store.path / RUNS_FILE).read_text().replace(store.config_hash, "0123456789abcdef", 1)
    (store.path / RUNS_FILE).write_text(rows)
    with pytest.raises(ConfigError, match="holds runs of another configuration"):
        ResultsDir.open(store.path)


def test_a_damaged_store_json_is_one_line(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")
    (store.path / STORE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="store.json' is damaged"):
        ResultsDir.open(store.path)


def test_a_claimed_run_is_not_claimed_again_until_released(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")
    run = RunId.of("bn", 0)
    with store.claim(run) as first:
        assert first
        with store.claim(run) as second:
            assert not second
        with store.claim(RunId.of("bn", 1)) as other:
            assert other
    with store.claim(run) as again:
        assert again


_APPENDER = """
import sys
from pathlib import Path
from normkit_lab.store.results import ResultsDir
store = ResultsDir(Path(sys.argv[1]))
me = int(sys.argv[2])
for i in range(150):
    store.append_rows([{"norm": "bn", "seed": me, "status": "ok", "epoch": i, "params": 1, "train_loss": 0.5,
                        "train_acc": 0.5, "val_loss": 0.5, "val_acc": 0.5, "pad": "x" * (3000 + 37 * i)}] * 3)
"""


def test_concurrent_appends_never_tear_or_interleave_rows(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(store.path), str(k)]) for k in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    rows = store.rows()  # every line parses and passes the row schema
    assert len(rows) == 4 * 150 * 3
    assert Counter(r["seed"] for r in rows) == {k: 450 for k in range(4)}


def test_two_processes_filling_one_store_run_every_run_exactly_once(cfg, tmp_path):
    """Two `normkit compare --resume` on the same store at once: each run is trained by one of them."""
    cfg.train.epochs = 2
    store = compare.create_store(cfg, tmp_path / "s")
    env = {**os.environ, "CI": "1"}
    procs = [subprocess.Popen([NORMKIT, "compare", "--resume", str(store.path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    keys = Counter(RunId.of_row(r) for r in store.rows() if r["epoch"] == 1)
    assert set(keys) == {RunId.of(n, s) for n in ("bn", "gn") for s in range(3)}
    assert set(keys.values()) == {1}, keys  # no run trained twice
    trained = [sum(f"{n} seed {s}: ok" in out for n in ("bn", "gn") for s in range(3)) for out in outputs]
    skipped = [out.count("finished by another process") for out in outputs]
    assert sum(trained) == 6 and [t + s for t, s in zip(trained, skipped, strict=True)] == [6, 6], outputs


# -- store identity without store.json, and edits named key by key ------------------------------


def _one_run_store(tmp_path) -> ResultsDir:
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": 1, "epochs": 1, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg)
    store = compare.create_store(cfg, tmp_path / "s")
    compare.run_compare(cfg, store)
    return store


def test_a_deleted_store_json_does_not_switch_the_config_check_off(tmp_path):
    """The audit's case: store.json deleted, config.yaml edited to 2 epochs, resume mixed 1- and 2-epoch runs."""
    store = _one_run_store(tmp_path)
    (store.path / STORE_FILE).unlink()
    ResultsDir.open(store.path)  # rebuilt from the rows' hash and config.yaml: they agree
    _edit(store, epochs=2)
    rows_before = (store.path / RUNS_FILE).read_bytes()
    with pytest.raises(ConfigError) as info:
        compare.open_store(store.path)
    assert "store.json' is missing" in str(info.value) and "config.yaml" in str(info.value)
    assert (store.path / RUNS_FILE).read_bytes() == rows_before


def test_rows_without_a_config_hash_and_no_store_json_are_refused(tmp_path):
    store = _one_run_store(tmp_path)
    (store.path / STORE_FILE).unlink()
    rows = [json.loads(line) for line in (store.path / RUNS_FILE).read_text().splitlines()]
    (store.path / RUNS_FILE).write_text("".join(json.dumps({**r, "config_hash": None}) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="cannot be checked"):
        ResultsDir.open(store.path)


def test_an_edit_from_1_to_1_0_is_named_with_every_changed_key(tmp_path):
    store = _one_run_store(tmp_path)
    _edit(store, epochs=1.0, batch_size=64)
    with pytest.raises(ConfigError) as info:
        ResultsDir.open(store.path)
    message = str(info.value)
    assert "epochs: 1 -> 1.0" in message and "batch_size: 128 -> 64" in message and "values changed" not in message
