"""Failures inside a run, by kind (docs/reliability.md, "Failures inside a run"): the norm's failure is
recorded and the others go on; a damaged or foreign checkpoint is refused, kept, nothing recorded; the
machine's failure keeps the last good checkpoint, records nothing and names its cause. Every test here
attacks one of those promises."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import normkit
from normkit.testing import temporary_plugin
from normkit_lab.errors import ConfigError, DamagedRunFile
from normkit_lab.records import RunId
from normkit_lab.runs.execute import Job, RunOptions, run_job
from normkit_lab.store.results import ResultsDir
from normkit_lab.study import compare, config


@pytest.fixture(scope="module")
def cfg():
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": 1, "epochs": 3, "batch_size": 64,
                               "device": "cpu"})
    compare.check(cfg)
    return cfg


def _job(cfg, store, norm="bn") -> Job:
    return Job.make(cfg, RunId.of(norm, 0), store, RunOptions())


def _stop_after(epoch: int):
    def events(kind, value):
        if kind == "epoch" and value[1].epoch == epoch:
            raise KeyboardInterrupt

    return events


@pytest.fixture(scope="module")
def cut(cfg, tmp_path_factory):
    """A store whose bn run stopped after 2 of 3 epochs: (store, checkpoint path, saved state)."""
    store = compare.create_store(cfg, tmp_path_factory.mktemp("cut") / "s")
    with pytest.raises(KeyboardInterrupt):
        run_job(_job(cfg, store), _stop_after(1))  # after epoch 1, before its checkpoint: records [0]
    with pytest.raises(KeyboardInterrupt):
        run_job(_job(cfg, store), _stop_after(2))  # resumed, epoch 1 saved: records [0, 1]
    path = store.checkpoint_path(RunId.of("bn", 0))
    return store, path, torch.load(path, weights_only=True)


def _tamper(state: dict, how: str) -> dict:
    state = {**state, "model": dict(state["model"]), "rng": dict(state["rng"])}
    weight = next(k for k in state["model"] if k.endswith("weight") and state["model"][k].dim() == 4)
    if how == "records":  # the audit's case: 5 copies of epoch 0
        state["records"] = [state["records"][0]] * 5
    elif how == "records-short":
        state["records"] = state["records"][:1]
    elif how == "shape":
        state["model"][weight] = state["model"][weight][:1]
    elif how == "dtype":
        state["model"][weight] = state["model"][weight].double()
    elif how == "missing-tensor":
        del state["model"][weight]
    elif how == "missing-key":
        del state["optimizer"]
    elif how == "momentum":
        opt = state["optimizer"]
        state["optimizer"] = {**opt, "state": {**opt["state"], 0: {"momentum_buffer": torch.zeros(3)}}}
    elif how == "rng":
        state["rng"]["torch"] = state["rng"]["torch"][:10]
    elif how == "steps":
        state["steps"] = state["steps"] + 1
    return state


@pytest.mark.parametrize("how", ["records", "records-short", "shape", "dtype", "missing-tensor", "missing-key",
                                 "momentum", "rng", "steps"])
def test_a_checkpoint_that_does_not_fit_the_run_is_refused_and_kept(cfg, cut, tmp_path, how):
    _, _, state = cut
    store = compare.create_store(cfg, tmp_path / "s")
    path = store.checkpoint_path(RunId.of("bn", 0))
    path.parent.mkdir(parents=True)
    torch.save(_tamper(state, how), path)
    before = path.read_bytes()
    metrics = store.path / "metrics" / f"{RunId.of('bn', 0).slug()}.csv"
    metrics.parent.mkdir()
    metrics.write_text("epoch,val_acc\n0,0.5\n1,0.6\n")  # the earlier attempt's per-epoch metrics
    with pytest.raises(DamagedRunFile) as info:
        run_job(_job(cfg, store))
    message = str(info.value)
    assert str(path) in message and "delete it to restart" in message and "\n" not in message
    assert path.read_bytes() == before  # nothing deleted or rewritten
    assert metrics.read_text() == "epoch,val_acc\n0,0.5\n1,0.6\n"  # the metrics CSV not reset
    assert store.rows() == []  # nothing recorded


def test_an_untouched_checkpoint_still_resumes(cfg, cut, tmp_path):
    _, _, state = cut
    store = compare.create_store(cfg, tmp_path / "s")
    path = store.checkpoint_path(RunId.of("bn", 0))
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    epochs = []
    result = run_job(_job(cfg, store), lambda kind, value: kind == "epoch" and epochs.append(value[1].epoch))
    assert epochs == [2] and result.status == "ok" and [r.epoch for r in result.epochs] == [0, 1, 2]
    assert not path.exists()  # removed only after the row was written
    assert len(store.rows()) == 3


def test_a_symlink_loop_and_a_directory_as_checkpoint_are_one_line(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")
    path = store.checkpoint_path(RunId.of("bn", 0))
    path.parent.mkdir(parents=True)
    os.symlink(path, path)  # a link to itself: ELOOP
    with pytest.raises(DamagedRunFile) as info:
        run_job(_job(cfg, store))
    assert "Errno" not in str(info.value) and "symbolic links" in str(info.value) and str(path) in str(info.value)
    assert path.is_symlink() and store.rows() == []


# -- the norm's own failures, BaseException included ---------------------------------------------


class _Quits(nn.Module):
    """A norm whose forward ends the process the way buggy code does: sys.exit or a raised Ctrl-C."""

    def __init__(self, num_channels: int, how: str = "exit") -> None:
        super().__init__()
        self.how = how

    def forward(self, x):
        if self.how == "exit":
            sys.exit(5)
        raise KeyboardInterrupt


class _QuitPlugin:
    @normkit.hookimpl
    def normkit_register_norms(self, register):
        register("quits", factory=_Quits, summary="ends the process from forward")


@pytest.mark.parametrize("how", ["exit", "interrupt"])
def test_a_norm_that_raises_systemexit_or_keyboardinterrupt_is_its_failure(tmp_path, how):
    with temporary_plugin(_QuitPlugin(), "quits"):
        cfg = config.build_config({"dataset": "digits", "norms": ["bn", f"quits(how={how})"], "seeds": 1, "epochs": 1,
                                   "batch_size": 64, "device": "cpu"})
        store = compare.create_store(cfg, tmp_path / "s")
        quits = run_job(Job.make(cfg, RunId.of(f"quits(how={how})", 0), store))
        bn = run_job(Job.make(cfg, RunId.of("bn", 0), store))  # the comparison goes on
    kind = "SystemExit: 5" if how == "exit" else "KeyboardInterrupt"
    assert quits.status == "failed" and kind in quits.error
    assert bn.status == "ok"
    statuses = {row["norm"]: row["status"] for row in store.rows()}
    assert statuses == {"quits(how=interrupt)" if how == "interrupt" else "quits(how=exit)": "failed", "bn": "ok"}


def test_a_real_sigint_still_stops_the_comparison(cfg, tmp_path):
    store = compare.create_store(cfg, tmp_path / "s")

    def events(kind, value):
        if kind == "epoch" and value[1].epoch == 1:
            os.kill(os.getpid(), 2)  # a real Ctrl-C, delivered while the run trains

    with pytest.raises(KeyboardInterrupt):
        run_job(_job(cfg, store), events)
    assert store.rows() == []
    assert store.checkpoint_path(RunId.of("bn", 0)).is_file()


def test_a_systemexit_from_a_signal_handler_is_not_the_norms(cfg, tmp_path):
    """submitit's requeue handler (SLURM preemption) ends the task with sys.exit(-1) from a signal handler:
    that must leave the run resumable, not record it as the norm's failure."""
    import signal

    store = compare.create_store(cfg, tmp_path / "s")
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: sys.exit(-1))

    def events(kind, value):
        # Armed after epoch 1, when epoch 0's checkpoint is on disk: it fires while epoch 1's checkpoint is
        # written (an atomic replace, which keeps epoch 0's) or while epoch 2 trains, outside this callback,
        # however loaded the machine is.
        if kind == "epoch" and value[1].epoch == 1:
            signal.setitimer(signal.ITIMER_REAL, 0.02)

    try:
        with pytest.raises(SystemExit):
            run_job(_job(cfg, store), events)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert store.rows() == []
    assert store.checkpoint_path(RunId.of("bn", 0)).is_file()


# -- the machine's failures ---------------------------------------------------------------------

DISK_FULL = textwrap.dedent("""
    import resource, signal, sys
    from normkit_lab.study import compare, config
    from normkit_lab.errors import MachineFailure
    from normkit_lab.runs.execute import Job, run_job
    from normkit_lab.records import RunId

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": 1, "epochs": 3, "batch_size": 64,
                               "device": "cpu"})
    store = compare.create_store(cfg, sys.argv[1])

    def events(kind, value):
        if kind == "epoch" and value[1].epoch == 1:  # epoch 0's checkpoint is written; epoch 1's cannot be
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    try:
        run_job(Job.make(cfg, RunId.of("bn", 0), store), events)
    except MachineFailure as exc:
        print("MachineFailure:", exc)
        sys.exit(3)
""")


def test_a_failed_checkpoint_write_keeps_the_last_good_one_and_blames_no_norm(tmp_path):
    out = tmp_path / "s"
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    line = proc.stdout.strip()
    assert "cannot write checkpoint" in line and "\n" not in line and "bn failed" not in line
    store = ResultsDir(out)
    assert store.rows() == []  # nothing recorded as the norm's fault
    path = store.checkpoint_path(RunId.of("bn", 0))
    saved = torch.load(path, weights_only=True)
    assert [r["epoch"] for r in saved["records"]] == [0]  # the last good checkpoint, kept
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": 1, "epochs": 3, "batch_size": 64,
                               "device": "cpu"})
    epochs = []
    result = run_job(Job.make(cfg, RunId.of("bn", 0), store),
                     lambda kind, value: kind == "epoch" and epochs.append(value[1].epoch))
    assert result.status == "ok" and epochs == [1, 2]  # resumed from it


# -- links below the results directory ----------------------------------------------------------


@pytest.mark.parametrize("where", ["tensorboard/{slug}", "tensorboard", "metrics/{slug}.csv", "metrics",
                                   "checkpoints", "locks/{slug}.lock", "locks"])
def test_a_link_at_any_level_below_the_store_is_refused_and_nothing_written_through_it(cfg, tmp_path, where):
    store = compare.create_store(cfg, tmp_path / "s")
    slug = RunId.of("bn", 0).slug()
    link = store.path / where.format(slug=slug)
    link.parent.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere if not link.suffix else elsewhere / "file", link)
    job = Job.make(cfg, RunId.of("bn", 0), store, RunOptions(log=("tensorboard",)))
    with pytest.raises(ConfigError) as info:
        run_job(job)
    assert f"{str(link)!r} is a symbolic link" in str(info.value) and "\n" not in str(info.value)
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert not (store.path / "runs.jsonl").exists()


NAMED = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    from normkit_lab.store.atomic import atomic_write_text
    from normkit_lab.store.results import ResultsDir

    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))  # Python ignores SIGXFSZ: EFBIG
    root = Path(sys.argv[1])
    store = ResultsDir(root)
    for write in (lambda: atomic_write_text(root / "summary.json", "x" * 10_000),
                  lambda: store.append_rows([{"norm": "bn", "pad": "x" * 10_000}])):
        try:
            write()
        except OSError as exc:
            print(exc.filename, exc.strerror)
""")


def test_a_full_disk_in_normkits_own_writes_names_the_file(tmp_path):
    """Issue 41: a write that fails part-way (a full disk) raised an OSError naming no file, so the one-line
    error said only "cannot access: File too large"; RLIMIT_FSIZE stands in for the full disk."""
    proc = subprocess.run([sys.executable, "-c", NAMED, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [f"{tmp_path / 'summary.json'} File too large",
                                        f"{tmp_path / 'runs.jsonl'} File too large"]
    assert not (tmp_path / "summary.json").exists()  # nothing half-written left behind
