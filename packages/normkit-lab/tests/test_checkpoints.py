"""Per-epoch checkpoints: an interrupted run resumes from its last finished epoch, bit-identical on CPU to
a run that was never interrupted; files load with weights_only=True; damaged ones are one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from normkit_lab.errors import ConfigError
from normkit_lab.records import RunId
from normkit_lab.runs.checkpoints import STATE_KEYS, Checkpointing
from normkit_lab.runs.execute import Job, RunOptions, run_job
from normkit_lab.study import compare, config

TIMING = {"epoch_time_s", "cpu_time_s", "load_avg", "throughput", "peak_mem_mb"}


@pytest.fixture(scope="module")
def cfg():
    # bnn draws noise from torch's global RNG every step: resuming must restore it exactly
    cfg = config.build_config({"dataset": "digits", "norms": "bnn", "seeds": 1, "epochs": 3, "batch_size": 64,
                               "device": "cpu"})
    compare.check(cfg)
    return cfg


def _metrics(store) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in store.rows()]


def _job(cfg, store, keep=True) -> Job:
    return Job.make(cfg, RunId.of("bnn", 0), store, RunOptions(keep_checkpoints=keep))


def _interrupt_at(epoch: int):
    def events(kind, value):
        if kind == "epoch" and value[1].epoch == epoch:
            raise KeyboardInterrupt

    return events


def test_an_interrupted_run_resumes_bit_identically(cfg, tmp_path):
    whole = compare.create_store(cfg, tmp_path / "whole")
    assert run_job(_job(cfg, whole)) is not None

    cut = compare.create_store(cfg, tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        run_job(_job(cfg, cut), _interrupt_at(2))  # after epoch 2's checkpoint was not yet written
    saved = torch.load(cut.checkpoint_path(RunId.of("bnn", 0)), weights_only=True)
    assert len(saved["records"]) == 2 and cut.rows() == []
    with pytest.raises(KeyboardInterrupt):
        run_job(_job(cfg, cut), _interrupt_at(2))  # interrupted again, after resuming
    epochs_seen = []
    result = run_job(_job(cfg, cut), lambda kind, value: kind == "epoch" and epochs_seen.append(value[1].epoch))
    assert epochs_seen == [2] and result.status == "ok" and len(result.epochs) == 3

    assert _metrics(cut) == _metrics(whole)
    a = torch.load(whole.weights_path(RunId.of("bnn", 0)), weights_only=True)["model"]
    b = torch.load(cut.weights_path(RunId.of("bnn", 0)), weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not cut.checkpoint_path(RunId.of("bnn", 0)).exists()  # the per-epoch file goes when the run ends


def test_only_the_final_weights_are_kept_and_only_when_asked(cfg, tmp_path):
    store = compare.create_store(dataclasses.replace(cfg), tmp_path / "s")
    run_job(_job(cfg, store, keep=False))
    assert list((store.path / "checkpoints").iterdir()) == []


@pytest.mark.parametrize(("content", "needle"), [(b"garbage", "cannot be read (UnpicklingError"),
                                                  (b"", "is empty (a write was cut short)")])
def test_a_damaged_checkpoint_is_one_line_and_keeps_the_store(cfg, tmp_path, content, needle):
    store = compare.create_store(cfg, tmp_path / "s")
    path = store.checkpoint_path(RunId.of("bnn", 0))
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        run_job(_job(cfg, store))
    assert needle in str(info.value) and "to restart that run" in str(info.value)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == content and store.rows() == []  # nothing rewritten


def test_a_checkpoint_of_another_run_is_refused(cfg, tmp_path):
    path = tmp_path / "c.pt"
    Checkpointing(path, {"run": "a"}).write(dict.fromkeys(STATE_KEYS) | {"records": []})
    with pytest.raises(ConfigError, match="belongs to another run"):
        Checkpointing(path, {"run": "b"}).load()
    assert Checkpointing(path, {"run": "a"}).load()["records"] == []
