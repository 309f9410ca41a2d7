"""`--executor ray` on a real local Ray instance: the same numbers as the local executor, every run once.

No mocks: each test starts Ray (through RayExecutor, or the CLI in a subprocess) on this machine. Every
Ray process started here inherits a marker in its environment, so the module's fixture can check that
none is left once the tests end (Ray shut down, no stray workers).
"""

from __future__ import annotations

import collections
import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from normkit_lab.errors import ConfigError
from normkit_lab.executors import ExecutorOptions, make_executor
from normkit_lab.records import RunId
from normkit_lab.runs.execute import Job
from normkit_lab.store.results import SUMMARY_JSON, ResultsDir
from normkit_lab.study.compare import check, create_store, open_store, run_compare
from normkit_lab.study.config import build_config
from normkit_lab.study.plan import compare_plan
from normkit_lab.study.progress import Progress

pytestmark = pytest.mark.xdist_group("ray")  # a local Ray instance (conftest.py)

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs normkit-lab[ray]")

MARKER = "NORMKIT_RAY_TEST_MARKER"
# summary columns that vary run to run
TIMING = {"time_per_epoch_s", "cpu_time_per_epoch_s", "load_avg_max", "throughput_samples_s", "peak_mem_mb"}
ROW_TIMING = {"epoch_time_s", "cpu_time_s", "load_avg", "throughput", "peak_mem_mb", "host"}  # in runs.jsonl rows
NORMKIT = str(Path(sys.executable).with_name("normkit"))


def _marked_processes(marker: str) -> list[tuple[int, str]]:
    """Live processes (not this one) whose environment carries `marker`: (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"{MARKER}={marker}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if state != "Z":
            found.append((int(entry.name), command))
    return found


def _wait_gone(marker: str, timeout: float = 20.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while (left := _marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module", autouse=True)
def ray_processes_end() -> Any:
    """Mark every process Ray starts from here; afterwards Ray is shut down and none of them is left."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the stray-process check reads /proc")
    marker = uuid.uuid4().hex
    saved = {key: os.environ.get(key) for key in (MARKER, "RAY_USAGE_STATS_ENABLED", "RAY_ADDRESS")}
    os.environ[MARKER] = marker
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.pop("RAY_ADDRESS", None)
    try:
        yield marker
    finally:
        if "ray" in sys.modules and sys.modules["ray"] is not None and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert _wait_gone(marker) == []


class Recorder(Progress):
    """Keeps the events run_compare passes on, quietly."""

    def __init__(self, on_epoch: Any = None) -> None:
        super().__init__()
        self.events: list[tuple[str, Any]] = []
        self.on_epoch = on_epoch

    def run_start(self, run_id: Any) -> None:
        self.events.append(("start", run_id.slug()))

    def epoch_end(self, run_id: Any, record: Any) -> None:
        self.events.append(("epoch", run_id.slug()))
        if self.on_epoch is not None:
            self.on_epoch(run_id)

    def run_skipped(self, run_id: Any) -> None:
        self.events.append(("skip", run_id.slug()))

    def run_end(self, result: Any) -> None:
        self.events.append(("end", (result.norm, result.seed)))


def _compare(out: Path, executor: Any, progress: Progress | None = None, **values: Any) -> tuple[ResultsDir, float]:
    cfg = build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 2, "epochs": 1, "batch_size": 128, **values})
    check(cfg)
    store = create_store(cfg, out)
    start = time.perf_counter()
    run_compare(cfg, store, executor=executor, progress=progress or Recorder())
    return store, time.perf_counter() - start


def _summary(store: ResultsDir) -> list[dict[str, Any]]:
    import json

    rows = json.loads((store.path / SUMMARY_JSON).read_text())
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _rows(store: ResultsDir) -> dict[tuple[str, int, int], dict[str, Any]]:
    """runs.jsonl rows by (norm, seed, epoch) without timings; asserts no (run, epoch) is there twice."""
    rows = store.rows()
    keys = [(row["norm"], row["seed"], row["epoch"]) for row in rows]
    assert len(keys) == len(set(keys)), collections.Counter(keys).most_common(3)
    return {key: {k: v for k, v in row.items() if k not in ROW_TIMING} for key, row in zip(keys, rows, strict=True)}


def _once_each(store: ResultsDir, n_runs: int) -> None:
    counts = collections.Counter((run.norm, run.seed) for run in store.runs())
    assert len(counts) == n_runs and set(counts.values()) == {1}, counts


@needs_ray
def test_ray_gives_the_local_numbers_and_each_run_once(tmp_path: Path) -> None:
    import ray

    from normkit_lab.executors.ray import RayExecutor

    local, _ = _compare(tmp_path / "local", make_executor(ExecutorOptions()))
    recorder = Recorder()
    remote, _ = _compare(tmp_path / "ray", RayExecutor(ExecutorOptions(kind="ray")), recorder)
    assert not ray.is_initialized()  # it shut down the instance it started

    assert _rows(remote) == _rows(local)  # same runs, same numbers to the bit (every run seeds itself)
    _once_each(remote, 4)
    ray_rows, local_rows = _summary(remote), _summary(local)
    assert [row["norm"] for row in ray_rows] == ["bn", "gn"]
    assert len(ray_rows) == len(local_rows)
    for ray_row, local_row in zip(ray_rows, local_rows, strict=True):  # means may sum the runs in another order
        assert ray_row.keys() == local_row.keys()
        for key, value in ray_row.items():
            if isinstance(value, float):
                assert value == pytest.approx(local_row[key], rel=1e-12), key
            else:
                assert value == local_row[key], key
    for slug in {value for kind, value in recorder.events if kind == "start"}:  # each run's events in order
        assert [kind for kind, value in recorder.events if value == slug] == ["start", "epoch"]
    assert sorted(value for kind, value in recorder.events if kind == "end") == [
        ("bn", 0), ("bn", 1), ("gn", 0), ("gn", 1)]


@needs_ray
def test_a_session_keeps_one_instance_for_its_runs_and_stops_it_on_ctrl_c(tmp_path: Path) -> None:
    """A comparison's looks (and a suite's rounds) call `run` inside one `session()`: the first starts Ray, the
    next reuses that instance (the same driver job: no second start), and the session's end stops it, here
    by Ctrl-C; each run's events arrive once."""
    import ray

    from normkit_lab.executors.ray import RayExecutor

    cfg = build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 1, "epochs": 1, "batch_size": 128})
    check(cfg)
    store = create_store(cfg, tmp_path / "out")
    first, second = (Job.make(cfg, item, store) for item in compare_plan(cfg))
    executor = RayExecutor(ExecutorOptions(kind="ray"))
    events: list[str] = []
    with pytest.raises(KeyboardInterrupt), executor.session():
        executor.run([first], lambda kind, value: events.append(kind))
        assert ray.is_initialized()
        job = ray.get_runtime_context().get_job_id()
        executor.run([second], lambda kind, value: events.append(kind))
        assert ray.is_initialized() and ray.get_runtime_context().get_job_id() == job
        raise KeyboardInterrupt
    assert not ray.is_initialized()
    assert events.count("end") == 2 and len(store.runs()) == 2


def _one_job(tmp_path: Path) -> Job:
    cfg = build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 1, "epochs": 1, "batch_size": 128})
    check(cfg)
    store = create_store(cfg, tmp_path / "out")
    return Job.make(cfg, compare_plan(cfg)[0], store)


@needs_ray
def test_unreachable_address_is_one_config_error_naming_it(tmp_path: Path) -> None:
    import ray

    from normkit_lab.executors.ray import RayExecutor

    job = _one_job(tmp_path)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"--ray-address '127\.0\.0\.1:1'.*ray start --head") as info:
        RayExecutor(ExecutorOptions(kind="ray", ray_address="127.0.0.1:1")).run([job], lambda kind, value: None)
    assert "\n" not in str(info.value) and time.perf_counter() - start < 15
    assert not ray.is_initialized()


def test_missing_ray_is_one_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError) as info:
        make_executor(ExecutorOptions(kind="ray"))
    assert str(info.value).startswith("--executor ray needs Ray: pip install 'ray>=2.9'")  # no index has normkit-lab


def test_task_resources() -> None:
    from normkit_lab.executors.ray import task_cpus, task_gpus

    assert task_gpus("auto", 1, 0) == 0 and task_gpus("auto", 1, 4) == 1 and task_gpus("cpu", 2, 4) == 0
    assert task_gpus("cuda", 2, 0) == 2 and task_gpus("cuda:1", 1, 8) == 1
    assert task_cpus(None, 1, 0) == 1 and task_cpus(4, 1, 1) == 4 and task_cpus(2, 3, 0) == 6


# -- longer: the CLI end to end, Ctrl-C and resume, a worker that dies ------------------------


def _cli(*args: str, marker: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, MARKER: marker, "RAY_USAGE_STATS_ENABLED": "0", "NO_COLOR": "1"}
    return subprocess.Popen([NORMKIT, "compare", *args], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


@needs_ray
@pytest.mark.slow
def test_cli_compare_with_ray_end_to_end(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    proc = _cli("--dataset", "digits", "--norms", "bn,gn", "--seeds", "2", "--epochs", "1", "--batch-size", "128",
                "--executor", "ray",
                "--out", str(tmp_path / "out"), marker=marker)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "WARNING" not in err, err
    store = ResultsDir.open(tmp_path / "out")
    _once_each(store, 4)
    assert [row["norm"] for row in _summary(store)] == ["bn", "gn"]
    assert _wait_gone(marker) == []


@needs_ray
@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_keeps_finished_runs_and_resume_with_ray_finishes_the_rest(tmp_path: Path, signum: int,
                                                                          code: int) -> None:
    marker = uuid.uuid4().hex
    out = tmp_path / "out"
    values = ("--dataset", "digits", "--norms", "bn,gn", "--seeds", "2", "--epochs", "6", "--batch-size", "128")
    proc = _cli(*values, "--executor", "ray", "--out", str(out), marker=marker)
    deadline = time.monotonic() + 240
    while not list((out / "checkpoints").glob("*.pt")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # runs are training (each has saved an epoch) ...
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)  # ... Ctrl-C (or SIGTERM) the driver alone: it must stop the tasks itself
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "interrupted" in err and "--resume" in err
    assert _wait_gone(marker) == []  # tasks cancelled, local instance shut down
    store = ResultsDir.open(out)
    assert len(store.runs()) < 4

    resumed = _cli("--resume", str(out), "--executor", "ray", marker=marker)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    _once_each(store, 4)
    assert _wait_gone(marker) == []

    cfg = build_config({"dataset": "digits", "norms": "bn,gn", "seeds": 2, "epochs": 6, "batch_size": 128})
    check(cfg)
    reference = create_store(cfg, tmp_path / "reference")
    run_compare(cfg, reference, progress=Recorder())
    assert _rows(store) == _rows(reference)  # resumed from checkpoints, the numbers of uninterrupted runs


@needs_ray
@pytest.mark.slow
def test_a_worker_lost_twice_fails_its_run_once_is_retried_and_resume_finishes_it(
        tmp_path: Path, ray_processes_end: str) -> None:
    """A run whose worker dies is submitted again from its checkpoint; lost a second time it is a failed
    run (docs/scaling.md), the others finish, and --resume trains it."""
    from normkit_lab.executors.ray import RayExecutor

    killed: list[str] = []

    def kill_the_first_runs_worker(run_id: Any) -> None:  # SIGKILL the worker training one run, twice
        slug = run_id.slug()
        if len(killed) < 2 and (not killed or killed[0] == slug):
            for pid, command in _marked_processes(ray_processes_end):
                if command.startswith(f"ray::normkit {slug}"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(slug)
                    break

    executor = RayExecutor(ExecutorOptions(kind="ray"))
    store, _ = _compare(tmp_path / "out", executor, Recorder(on_epoch=kill_the_first_runs_worker), epochs=4)
    assert len(killed) == 2
    _once_each(store, 4)
    failed = [run for run in store.runs() if run.status == "failed"]
    assert [RunId.of_run(run).slug() for run in failed] == [killed[0]], failed
    assert "worker process died" in failed[0].error

    cfg, store = open_store(store.path)
    run_compare(cfg, store, executor=executor, progress=Recorder())  # resume retries failed runs
    assert {run.status for run in store.runs()} == {"ok"}
