"""`--executor slurm` through submitit's real local executor (no cluster, no mocks): the same numbers and
files as the local executor, the sbatch script a real cluster would get, preemption, lost tasks, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from normkit_lab.errors import ConfigError
from normkit_lab.executors import ExecutorOptions, make_executor
from normkit_lab.records import RunId
from normkit_lab.runs.execute import Job, run_job
from normkit_lab.store.results import METRICS_DIR, RUNS_FILE, SUMMARY_JSON
from normkit_lab.study import compare, config
from normkit_lab.study.plan import compare_plan
from normkit_lab.study.progress import PlainProgress

pytest.importorskip("submitit")

from normkit_lab.executors.slurm import MISSING, SLURM_DIR, SlurmExecutor  # noqa: E402

NORMKIT = str(Path(sys.executable).with_name("normkit"))
LOCAL = {"cluster": "local", "timeout_min": 60}


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if "time" not in k and "throughput" not in k and "mem" not in k
             and "load" not in k}
            for row in rows]


def _summary(store_path: Path) -> list[dict]:
    return _without_timing(json.loads((store_path / SUMMARY_JSON).read_text()))


def _attempts(store) -> Counter:
    """Rows of each (run, epoch): 1 everywhere when every run was recorded once."""
    return Counter(RunId.of_row(row).key() + f"/{row['epoch']}" for row in store.rows())


def _by_identity(rows: list[dict]) -> dict:
    return {RunId.of_row(r).key() + f"/{r['epoch']}": _without_timing([r])[0] for r in rows}


@pytest.fixture
def cfg():
    cfg = config.build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 2, "epochs": 1, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg)
    return cfg


def test_slurm_local_gives_the_numbers_and_files_of_the_local_executor(cfg, tmp_path, capsys):
    local = compare.create_store(cfg, tmp_path / "local")
    compare.run_compare(cfg, local)
    slurm = compare.create_store(cfg, tmp_path / "slurm")
    executor = make_executor(ExecutorOptions(kind="slurm", slurm=dict(LOCAL)))
    compare.run_compare(cfg, slurm, executor=executor, progress=PlainProgress())
    out = capsys.readouterr().out
    assert _summary(slurm.path) == _summary(local.path)
    assert _by_identity(slurm.rows()) == _by_identity(local.rows())
    assert set(_attempts(slurm).values()) == {1} and len(_attempts(slurm)) == 4
    assert {r.status for r in slurm.runs()} == {"ok"}
    tasks = [p for p in (slurm.path / SLURM_DIR).iterdir() if p.is_dir() and list(p.glob("*_result.pkl"))]
    assert len(tasks) == 4  # one submitit folder per run, under the store
    assert out.count(": ok, final val acc") == 4 and out.count("epoch 1/1") == 4  # end and epoch events relayed


def test_sbatch_script_for_a_real_cluster(cfg, tmp_path, monkeypatch):
    """What `sbatch` would get from the CLI's flags (a stand-in `srun` on PATH lets submitit build a SLURM
    executor; nothing is submitted)."""
    from normkit_cli.compare import _executor_options

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    gpu = config.build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 3, "epochs": 1, "batch_size": 128,
                               "device": "cuda",
                               "nproc_per_node": 2,
                               "cpu_threads": 4, "num_workers": 2})
    jobs = [Job.make(gpu, run_id, tmp_path / "store") for run_id in compare_plan(gpu)]
    options = _executor_options("slurm", None, 1, None, "gpu", 90, -1, None,
                                ["slurm_account=lab", "array_parallelism=2", "mem_gb=32"])
    text = make_executor(options).sbatch_text(jobs)
    lines = set(text.splitlines())
    for flag in ("--partition=gpu", "--time=90", "--gpus-per-node=2", "--array=0-5%2", "--account=lab",
                 "--cpus-per-task=12", "--ntasks-per-node=1", "--nodes=1", "--mem=32GB", "--job-name=normkit-compare",
                 "--signal=USR2@90", "--open-mode=append"):
        assert f"#SBATCH {flag}" in lines, f"{flag} missing from:\n{text}"
    assert f"#SBATCH --output={tmp_path / 'store' / SLURM_DIR}/%A_%a/%A_%a_0_log.out" in lines
    assert f"{sys.executable} -u -m submitit.core._submit" in text
    # --slurm-gpus-per-node and --slurm-cpus-per-task win over the defaults; CPU runs ask for no GPU
    options = _executor_options("slurm", None, 1, None, None, 60, 1, 6, None)
    assert {"#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=6"} <= set(make_executor(options).sbatch_text(
        jobs).splitlines())
    cpu_jobs = [Job.make(cfg, run_id, tmp_path / "store") for run_id in compare_plan(cfg)]
    assert "gpus-per-node" not in SlurmExecutor(ExecutorOptions(kind="slurm")).sbatch_text(cpu_jobs)
    assert not (tmp_path / "store").exists()


def test_bad_slurm_settings_fail_before_anything_runs_with_one_line(tmp_path, monkeypatch):
    def refused(slurm: dict) -> str:
        with pytest.raises(ConfigError) as info:
            make_executor(ExecutorOptions(kind="slurm", slurm=slurm))
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "cluster='mars'" in refused({"cluster": "mars"})
    assert "refused the parameters" in refused({"cluster": "local", "no_such_option": 1})
    assert "refused the parameters" in refused({"cluster": "local", "timeout_min": "soon"})
    assert "one task on one node" in refused({"cluster": "local", "nodes": 2})
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun here
    assert "srun/sbatch are not on PATH" in refused({})
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if not installed
    assert refused({"cluster": "local"}) == MISSING


# -- slow: real processes, preemption, lost tasks, Ctrl-C, the CLI -----------------------------------


def _task_pids(store_path: Path) -> list[int]:
    """Processes running a submitit task of this store (python -m submitit.core._submit <store>/slurm/...)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"submitit.core._submit" in cmd and any(str(store_path).encode() in part for part in cmd):
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_a_preempted_run_resumes_from_its_checkpoint_with_the_same_numbers(tmp_path):
    """SLURM's warning signal (USR2) mid-run: submitit requeues the task, which resumes from the run's
    last epoch checkpoint and ends bit-identical to a run that was never interrupted."""
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": 1, "epochs": 25, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg)
    local = compare.create_store(cfg, tmp_path / "local")
    compare.run_compare(cfg, local)
    store = compare.create_store(cfg, tmp_path / "slurm")
    run_id = compare_plan(cfg)[0]
    signalled: list[int] = []

    def on_event(kind, value):
        if kind == "epoch" and not signalled and value[1].epoch >= 1 and store.checkpoint_path(run_id).exists():
            pids = _task_pids(store.path)
            assert len(pids) == 1
            os.kill(pids[0], signal.SIGUSR2)
            signalled.append(value[1].epoch)

    SlurmExecutor(ExecutorOptions(kind="slurm", slurm=dict(LOCAL))).run(
        [Job.make(cfg, run_id, store)], on_event)
    assert signalled and signalled[0] < 24, "the run ended before it could be preempted"
    logs = "".join(p.read_text() for p in (store.path / SLURM_DIR).rglob("*_log.*"))
    assert "this job is preempted" in logs and "Requeued job" in logs
    assert set(_attempts(store).values()) == {1}
    assert _by_identity(store.rows()) == _by_identity(local.rows())
    assert not store.checkpoint_path(run_id).exists()  # removed once the run ended


@pytest.mark.slow
def test_a_killed_task_is_recorded_failed_and_resume_continues_it(tmp_path):
    cfg = config.build_config({"dataset": "digits", "norms": "bn", "seeds": 1, "epochs": 25, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg)
    store = compare.create_store(cfg, tmp_path / "s")
    run_id = compare_plan(cfg)[0]
    killed: list[int] = []
    ends = []

    def on_event(kind, value):
        if kind == "epoch" and not killed and value[1].epoch >= 2 and store.checkpoint_path(run_id).exists():
            for pid in _task_pids(store.path):
                os.kill(pid, signal.SIGKILL)
            killed.append(value[1].epoch)
        if kind == "end":
            ends.append(value)

    executor = SlurmExecutor(ExecutorOptions(kind="slurm", slurm=dict(LOCAL)))
    executor.run([Job.make(cfg, run_id, store)], on_event)
    assert killed and len(ends) == 1 and ends[0].status == "failed"
    assert "ended without a result" in ends[0].error and "log:" in ends[0].error and "\n" not in ends[0].error
    assert store.checkpoint_path(run_id).exists()  # kept: the retry continues from it
    results = compare.run_compare(*compare.open_store(store.path), executor=executor)
    assert [r.status for r in results.runs] == ["ok"] and len(results.runs[0].epochs) == 25


@pytest.mark.slow
def test_a_run_another_process_is_training_is_watched_not_submitted_again(tmp_path):
    """Resuming while an earlier array still trains some runs: those are not submitted a second time."""
    cfg = config.build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 2, "epochs": 6, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg)
    store = compare.create_store(cfg, tmp_path / "s")
    jobs = [Job.make(cfg, run_id, store) for run_id in compare_plan(cfg)]
    other = threading.Thread(target=run_job, args=(jobs[0],))  # "another process" training the first run
    other.start()
    metrics = store.path / METRICS_DIR / f"{jobs[0].run.slug()}.csv"
    deadline = time.monotonic() + 60
    while not metrics.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # written once run_job holds the run's lock and starts training
    events = []
    SlurmExecutor(ExecutorOptions(kind="slurm", slurm=dict(LOCAL))).run(
        jobs, lambda kind, value: events.append((kind, value)))
    other.join()
    assert ("skip", jobs[0].run) in events and sum(kind == "end" for kind, _ in events) == 3
    assert len([p for p in (store.path / SLURM_DIR).iterdir() if list(p.glob("*_submitted.pkl"))]) == 3
    assert set(_attempts(store).values()) == {1} and len(_attempts(store)) == 4 * 6


@pytest.mark.slow
def test_ctrl_c_leaves_the_tasks_running_and_resume_collects_them(cfg, tmp_path, capsys):
    store = compare.create_store(cfg, tmp_path / "s")
    executor = make_executor(ExecutorOptions(kind="slurm", slurm={**LOCAL, "slurm_array_parallelism": 4}))
    jobs = [Job.make(cfg, run_id, store) for run_id in compare_plan(cfg)]

    def interrupt(kind, value):
        if kind == "start":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        executor.run(jobs, interrupt)
    err = capsys.readouterr().err
    assert "keep training" in err and f"normkit compare --resume {store.path}" in err
    assert _task_pids(store.path), "the tasks were stopped"
    results = compare.run_compare(*compare.open_store(store.path), executor=executor)
    assert len(results.runs) == 4 and {r.status for r in results.runs} == {"ok"}
    assert set(_attempts(store).values()) == {1}
    deadline = time.monotonic() + 60
    while _task_pids(store.path) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.slow
def test_cli_compare_with_the_slurm_executor(tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run([NORMKIT, "compare", "--dataset", "digits", "--norms", "bn,gn", "--seeds", "2", "--epochs",
                           "1", "--batch-size",
                           "128", "--device", "cpu",
                           "--out", str(out), "--executor", "slurm", "--slurm-param", "cluster=local"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (out / RUNS_FILE).read_text().splitlines()]
    assert Counter((r["norm"], r["seed"]) for r in rows) == {("bn", 0): 1, ("bn", 1): 1, ("gn", 0): 1, ("gn", 1): 1}
    assert (out / SLURM_DIR).is_dir() and (out / SUMMARY_JSON).is_file()
    bad = subprocess.run([NORMKIT, "compare", "--dataset", "digits", "--norms", "bn", "--seeds", "1", "--epochs", "1",
                          "--batch-size", "128",
                          "--out",
                          str(tmp_path / "bad"), "--executor", "slurm", "--slurm-param", "cluster=local",
                          "--slurm-param", "no_such_option=1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "refused the parameters" in bad.stderr and "Traceback" not in bad.stderr
