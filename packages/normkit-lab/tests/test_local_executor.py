"""`--jobs N`: runs in N worker processes give the numbers of sequential execution; the overall ETA."""

from __future__ import annotations

import json

import pytest

from normkit_lab.errors import ConfigError
from normkit_lab.executors import ExecutorOptions, make_executor
from normkit_lab.executors.local import worker_count
from normkit_lab.records import EpochRecord, RunId, RunResult
from normkit_lab.runs.device import split_threads
from normkit_lab.study import compare, config
from normkit_lab.study.progress import PlainProgress, Progress, format_eta

TIMING = {"epoch_time_s", "cpu_time_s", "load_avg", "load_avg_max", "throughput", "peak_mem_mb", "mean_epoch_time_s",
          "samples_per_s"}


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING and "time" not in k and "samples" not in k
             and "mem" not in k} for row in rows]


def _by_identity(rows: list[dict]) -> dict:
    return {RunId.of_row(r).key() + f"/{r['epoch']}": {k: v for k, v in r.items() if k not in TIMING}
            for r in rows}


def test_two_jobs_give_the_numbers_of_sequential_execution(tmp_path, capsys):
    cfg = config.build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 2, "epochs": 2, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg, parallel=2)
    sequential = compare.create_store(cfg, tmp_path / "seq")
    compare.run_compare(cfg, sequential)
    parallel = compare.create_store(cfg, tmp_path / "par")
    compare.run_compare(cfg, parallel, executor=make_executor(ExecutorOptions(jobs=2)), progress=PlainProgress())
    out = capsys.readouterr().out
    assert _by_identity(parallel.rows()) == _by_identity(sequential.rows())
    summary = [json.loads((s.path / "summary.json").read_text()) for s in (sequential, parallel)]
    assert _without_timing(summary[0]) == _without_timing(summary[1])
    assert out.count(": ok, final val acc") == 4 and "ETA" in out
    assert out.count("epoch 2/2") == 4  # epoch events travel from the workers to this process


def pool_workers() -> set[int]:
    """This process's live spawned worker processes (Linux /proc)."""
    import os
    from pathlib import Path

    from normkit_lab.processes import descendants

    def is_worker(pid: int) -> bool:
        try:
            return b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    return {pid for pid in descendants(os.getpid()) if is_worker(pid)}


def test_a_sequential_compare_starts_its_worker_processes_once_for_every_look(tmp_path):
    """Issue 39: each look of `--seeds auto --jobs 2` started a new pool, whose workers imported torch and the
    plugins again (seconds of CPU a round). Now the looks share one pool, shut down when the comparison ends."""

    cfg = config.build_config({"dataset": "digits", "norms": "bn,gn", "seeds": "auto", "max_seeds": 5, "epochs": 1,
                               "batch_size": 128, "device": "cpu"})
    compare.check(cfg, parallel=2)
    store = compare.create_store(cfg, tmp_path / "par")
    seen: set[int] = set()

    class WorkersSeen(Progress):
        def run_start(self, run_id):
            seen.update(pool_workers())
            super().run_start(run_id)

    compare.run_compare(cfg, store, executor=make_executor(ExecutorOptions(jobs=2)), progress=WorkersSeen())
    looks = json.loads((store.path / "looks.json").read_text())["looks"]
    assert len(looks) == 2 and len({(r["norm"], r["seed"]) for r in store.rows()}) == 10  # 3 seeds, then 5
    assert len(seen) == 2, f"worker processes {sorted(seen)} over {len(looks)} looks"
    assert pool_workers() == set()  # the pool is shut down with the comparison


@pytest.mark.slow
def test_a_suite_with_two_jobs_starts_its_worker_processes_once_for_every_workload(tmp_path):
    """Issue 39: each workload's tuning runs, and each round of its seeds, started a new pool whose workers
    imported torch and the plugins again. Now the whole suite shares one pool, shut down when it ends."""
    import normkit
    from normkit.testing import temporary_plugin
    from normkit_lab.suite.run import SuitePlan, create_suite, run_suite
    from normkit_lab.suite.scorecard import write_scorecard

    small = {"question": "does it train?", "target": 50.0, "tune": {"lr": [0.05]},
             "config": {"model": "small-cnn", "dataset": "digits", "batch_size": 128, "epochs": 1}}

    class TwoWorkloads:
        @normkit.hookimpl
        def normkit_register_workloads(self, register):
            register("pool-a", small)
            register("pool-b", small)

    seen: set[int] = set()

    class WorkersSeen(Progress):
        def run_start(self, run_id):
            seen.update(pool_workers())
            super().run_start(run_id)

    with temporary_plugin(TwoWorkloads(), "two-workloads"):
        suite = create_suite(SuitePlan.make("bn,gn", seeds=3, workloads=["pool-a", "pool-b"]), tmp_path / "suite",
                             parallel=2)
        run_suite(suite, executor=make_executor(ExecutorOptions(jobs=2)), progress=WorkersSeen, parallel=2)
        card = write_scorecard(suite)
    assert card["missing"] == [] and card["failed_runs"] == {} and all(w["complete"] for w in card["workloads"])
    assert len(seen) == 2, f"worker processes {sorted(seen)} over the suite's 2 workloads"
    assert pool_workers() == set()


@pytest.mark.slow
def test_a_worker_killed_between_rounds_costs_no_run_and_ctrl_c_between_rounds_stops_the_pool(tmp_path, capfd):
    """The pool a session keeps between rounds: a worker killed while it idles (out of memory, say) breaks
    it, and the next round starts a new one without counting its runs as lost; a Ctrl-C between rounds
    stops the workers with the session."""
    import os
    import signal
    import time

    from normkit_lab.executors.local import LocalExecutor
    from normkit_lab.runs.execute import Job

    cfg = config.build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 2, "epochs": 1, "batch_size": 128,
                               "device": "cpu"})
    compare.check(cfg, parallel=2)
    store = compare.create_store(cfg, tmp_path / "out")
    executor = LocalExecutor(ExecutorOptions(jobs=2))
    ended = []

    def on_event(kind, value):
        if kind == "end":
            ended.append((value.norm, value.seed, value.status))

    with pytest.raises(KeyboardInterrupt), executor.session():
        executor.run([Job.make(cfg, RunId.of(norm, 0), store) for norm in cfg.norms], on_event)
        first = pool_workers()
        assert len(first) == 2
        for pid in first:  # a Ctrl-C reaching the idle workers alone: they wait on, without a traceback
            os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        assert pool_workers() == first
        os.kill(min(first), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while min(first) in pool_workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        executor.run([Job.make(cfg, RunId.of(norm, 1), store) for norm in cfg.norms], on_event)
        second = pool_workers()
        assert len(second) == 2 and not second & first
        raise KeyboardInterrupt  # Ctrl-C while the comparison decides whether to start another round
    assert pool_workers() == set() and "Traceback" not in capfd.readouterr().err
    assert sorted(ended) == [("bn", 0, "ok"), ("bn", 1, "ok"), ("gn", 0, "ok"), ("gn", 1, "ok")]
    assert {row["status"] for row in store.rows()} == {"ok"}


def test_worker_count_and_thread_split_on_cpu():
    assert worker_count(ExecutorOptions(), "cpu") == 1
    assert worker_count(ExecutorOptions(jobs=3), "cpu") == 3
    assert split_threads(1, 4) == 1 and split_threads(8, 1) <= 8
    with pytest.raises(ConfigError, match=r"--jobs must be an integer in \[1, "):
        ExecutorOptions(jobs=0)
    with pytest.raises(ConfigError, match="unknown executor 'dask'"):
        ExecutorOptions(kind="dask")


def _record(epoch: int) -> EpochRecord:
    return EpochRecord(epoch, 0.5, 0.5, 0.5, 0.5, None, 0.1, 1.0, 1.0, 0.1)


def test_eta_counts_the_epochs_left_at_this_sessions_pace(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("normkit_lab.study.progress.time.monotonic", lambda: now[0])
    progress = Progress()
    progress.start(total=4, done=1, epochs=5)  # 15 epochs to train
    now[0] = 110.0
    a, b = RunId.of("bn", 1), RunId.of("gn", 1)
    progress.run_start(a)
    progress.run_start(b)
    assert progress.eta_seconds() is None
    for epoch in range(3):
        progress.epoch_end(a, _record(epoch))
    progress.epoch_end(b, _record(0))
    progress.epoch_end(b, _record(1))
    # 5 epochs in 10 s; 15 - 5 = 10 epochs left -> 20 s
    assert progress.eta_seconds() == pytest.approx(20.0)
    progress.run_end(RunResult("bn", 1, "diverged", [], 1))  # a run ending early drops its unfinished epochs
    assert progress.eta_seconds() == pytest.approx((2 * 5 - 2) * 2.0)
    assert format_eta(20.4) == "ETA 0:20" and format_eta(3725) == "ETA 1:02:05" and format_eta(None) == "ETA -"


def test_cuda_slots_spread_runs_over_the_visible_gpus(monkeypatch):
    """The slot arithmetic (no GPU here: torch's device count is set, the layout is what is checked)."""
    import torch

    from normkit_lab.executors.local import cuda_slots

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_slots("cpu", None, 1, 1) is None
    assert cuda_slots("auto", None, 1, 1) == ["0", "1", "2", "3"]  # one run per GPU by default
    assert cuda_slots("cuda", None, 2, 1) == ["0", "0", "1", "1", "2", "2", "3", "3"]  # --jobs-per-gpu 2
    assert cuda_slots("cuda", 2, 1, 1) == ["0", "1"]
    assert cuda_slots("cuda", None, 1, 2) == ["0,1", "2,3"]  # DDP runs of 2 processes each
    assert cuda_slots("cuda:2", 3, 1, 1) == ["2", "2", "2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert cuda_slots("cuda", None, 1, 1) == ["5", "7"]
    with pytest.raises(ConfigError, match="--jobs 3 needs 3 GPU slots but there are 2"):
        cuda_slots("cuda", 3, 1, 1)
    with pytest.raises(ConfigError, match="runs need 4 GPUs each"):
        cuda_slots("cuda", None, 1, 4)


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (Linux /proc)."""
    from pathlib import Path

    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids + [g for k in kids for g in _children(k)]


@pytest.mark.slow
def test_a_killed_worker_loses_nothing_and_its_run_resumes_from_its_checkpoint(tmp_path):
    """SIGKILL one pool worker mid-run: the pool restarts, the run continues from its last epoch, every run
    ends ok exactly once."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "out"
    normkit = str(Path(sys.executable).with_name("normkit"))
    proc = subprocess.Popen([normkit, "compare", "--dataset", "digits", "--norms", "bn,gn", "--seeds", "2",
                             "--epochs", "40", "--batch-size",
                             "128", "--jobs", "2",
                             "--device", "cpu", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "CI": "1"})
    deadline = time.monotonic() + 120
    while not list((out / "checkpoints").glob("*.pt")) and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [p for p in _children(proc.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
    assert workers, "no worker process found"
    os.kill(workers[0], signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    finals = [(r["norm"], r["seed"]) for r in rows if r["epoch"] == 39]
    assert sorted(finals) == [("bn", 0), ("bn", 1), ("gn", 0), ("gn", 1)] and {r["status"] for r in rows} == {"ok"}
    assert list((out / "checkpoints").iterdir()) == []
