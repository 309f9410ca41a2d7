"""The Ray executor (`--executor ray`, normkit-lab's extra `ray`): each run is one Ray task calling `run_job`.

    executor = RayExecutor(ExecutorOptions(kind="ray"))                      # a local Ray instance
    executor = RayExecutor(ExecutorOptions(kind="ray", ray_address="auto"))  # an existing cluster
    executor.run(jobs, on_event)

Each task asks Ray for what its run uses: `cpu_threads` CPUs (times `nproc_per_node` for a CPU DDP run)
and, when the run trains on CUDA, `nproc_per_node` GPUs, which Ray pins through CUDA_VISIBLE_DEVICES.
Tasks write into the results directory themselves, so on a cluster it must be on storage every node
sees (NFS, Lustre with flock...) and every node needs the same Python environment with normkit
installed. The store's run locks keep a task from training a run that another process holds, as for
the local pool. Progress ("start", "epoch", "end") flows from the tasks through a small Ray actor and
`on_event` is called here, in the driver; "skip" and failures of dead workers are decided here too.
Without an address (and without RAY_ADDRESS) a quiet local instance sized to this machine is started
(no dashboard, token authentication on every port it opens) and shut down at the end of the outermost
`session()` (a comparison's looks, a suite's workloads and rounds share one instance), or of `run` called
outside one; an instance someone else started is left alone. Ray worker logs stay in Ray's session directory
(/tmp/ray/session_latest/logs), not on this terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from normkit_lab.errors import ConfigError, one_line
from normkit_lab.executors.local import LOST_ATTEMPTS, record_lost_run
from normkit_lab.executors.options import ExecutorOptions
from normkit_lab.processes import watch
from normkit_lab.records import RunId
from normkit_lab.runs.execute import Events, Job, run_job
from normkit_lab.spec import TrainConfig
from normkit_lab.store.results import ResultsDir

MISSING_RAY = "--executor ray needs Ray: pip install 'ray>=2.9' (normkit-lab's extra ray; normkit is not on PyPI)"
POLL_S = 0.2  # how often the driver relays progress events while tasks run
CONNECT_TIMEOUT_S = 5.0  # Ray retries an unreachable address for minutes; a plain TCP probe fails fast
START_ATTEMPTS = 3  # a run whose worker died before it started is submitted this many times, then failed
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # tasks pass only small records; don't reserve 30% of memory


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(MISSING_RAY) from None
    return ray


class RayExecutor:
    """Runs each job as a Ray task on a local instance or on the cluster at `options.ray_address`."""

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options
        self._ray = _import_ray()  # fail before any store is created when Ray is missing
        self._local_env = contextlib.ExitStack()  # a local instance's token, until it is shut down
        self._sessions = 0
        self._connected = False  # Ray started or joined by this executor: shut down when the session ends
        if options.ray_address:
            _probe(options.ray_address)  # an address nothing listens at: before any store is created too

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Keep Ray started (or joined) for every `run` inside (nested sessions share the outermost one's): the
        first `run` starts it and the outermost session's end shuts it down, also on an error or Ctrl-C. Why: a
        local instance and its workers (each importing torch) take 10 to 15 s to start, once per comparison's
        look or suite round when each `run` started its own."""
        self._sessions += 1
        try:
            yield
        finally:
            self._sessions -= 1
            if self._sessions == 0:
                self._disconnect()

    def run(self, jobs: list[Job], on_event: Events) -> None:
        if not jobs:
            return
        with self.session():  # outside a caller's session: Ray for this call alone
            if not self._connected:
                self._connected = self._connect()
            with _sigterm_through_ray():
                self._run(jobs, on_event)

    def _disconnect(self) -> None:
        """Stop the local instance this executor started; only disconnect from a cluster."""
        try:
            if self._connected:
                self._connected = False
                with _keep_sigterm_handler():
                    self._ray.shutdown()
        finally:
            self._local_env.close()

    # -- connecting ------------------------------------------------------------------------------

    def _connect(self) -> bool:
        """Start or join Ray unless this process already did; True when we must shut it down."""
        ray = self._ray
        if ray.is_initialized():
            return False
        address = self.options.ray_address or os.environ.get("RAY_ADDRESS") or None
        quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        with _keep_sigterm_handler():
            if address is None:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network calls, no notice
                try:
                    self._local_env.enter_context(_loopback_instance(ray))
                    with _quiet_logger("ray._private.authentication.authentication_token_setup"):
                        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, _node_ip_address="127.0.0.1",
                                 object_store_memory=LOCAL_OBJECT_STORE_BYTES, **quiet)
                    self._local_env.enter_context(_stopped_with_this_process(ray))
                except Exception as exc:
                    self._local_env.close()
                    raise ConfigError(f"could not start a local Ray instance: {one_line(str(exc), 200)}; "
                                      f"its logs are under /tmp/ray/session_latest/logs") from None
                except BaseException:  # Ctrl-C while it starts: stop what did start
                    with contextlib.suppress(Exception):
                        ray.shutdown()
                    self._local_env.close()
                    raise
                return True
            _probe(address)
            try:
                with _quiet_logger("ray._private.authentication.authentication_token_setup"):
                    ray.init(address=address, **quiet)
            except Exception as exc:
                auth = ("" if os.environ.get("RAY_AUTH_MODE") else
                        "; a cluster with token authentication also needs RAY_AUTH_MODE=token and its token "
                        "(~/.ray/auth_token or RAY_AUTH_TOKEN) here")
                raise ConfigError(_cannot_connect(address, str(exc)) + auth) from None
            return True

    # -- running ---------------------------------------------------------------------------------

    def _run(self, jobs: list[Job], on_event: Events) -> None:
        ray = self._ray
        # tasks may start in another working directory (or on another node): give them absolute paths
        jobs = [dataclasses.replace(job, store=str(Path(job.store).resolve())) for job in jobs]
        cluster = _Cluster.of(ray)
        task = ray.remote(_run_task)
        events = ray.remote(num_cpus=0)(_EventBox).remote()
        relay = _Relay(on_event)
        refs: dict[Any, tuple[Job, int]] = {}
        tokens = itertools.count()
        attempts: dict[RunId, int] = {}

        def submit(job: Job, wait_for_holder: bool) -> None:
            cpus, gpus = cluster.resources(job.train)
            token = next(tokens)
            ref = task.options(num_cpus=cpus, num_gpus=gpus, max_retries=0, retry_exceptions=False,
                               name=f"normkit {job.run.slug()}").remote(job, wait_for_holder, events, token, gpus)
            refs[ref] = (job, token)

        try:
            for job in jobs:
                submit(job, False)
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL_S)
                relay.live(ray.get(events.take.remote()))
                for ref in ready:
                    job, token = refs.pop(ref)
                    try:
                        outcome, emitted = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        raise _task_error(exc) from exc
                    except ray.exceptions.RayError:  # its worker process or node died
                        relay.live(ray.get(events.take.remote()))  # its "start", if it got that far
                        attempts[job.run] = attempts.get(job.run, 0) + 1
                        gave_up = attempts[job.run] >= (LOST_ATTEMPTS if job.run in relay.started else START_ATTEMPTS)
                        for again in record_lost_run(job, relay, give_up=gave_up):
                            submit(again, False)
                        continue
                    relay.finished(token, emitted)
                    if outcome == "busy":  # another process holds it: wait for that one
                        submit(job, True)
                    elif outcome == "skipped":
                        on_event("skip", job.run)
        except BaseException:  # Ctrl-C, SIGTERM, an error: stop every task (checkpoints stay)
            for ref in refs:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise
        finally:
            with contextlib.suppress(Exception):
                ray.kill(events)


class _Relay:
    """Calls `on_event` once per task event, in the task's order: live from the event box while it
    runs, then whatever had not arrived yet from the list the task returns (its sends are not waited
    for: a task blocked in ray.get or ray.wait lends its CPUs to the next task, oversubscribing them)."""

    def __init__(self, on_event: Events) -> None:
        self.on_event = on_event
        self.delivered: dict[int, int] = {}  # task token -> events of it delivered
        self.started: set[RunId] = set()

    def __call__(self, kind: str, value: Any) -> None:
        if kind == "start":
            self.started.add(value)
        self.on_event(kind, value)

    def live(self, events: list[tuple[int, int, str, Any]]) -> None:
        for token, seq, kind, value in events:
            self._deliver(token, seq, kind, value)

    def finished(self, token: int, emitted: list[tuple[str, Any]]) -> None:
        for seq, (kind, value) in enumerate(emitted):
            self._deliver(token, seq, kind, value)

    def _deliver(self, token: int, seq: int, kind: str, value: Any) -> None:
        if seq < self.delivered.get(token, 0):
            return  # delivered already (late arrivals from the box after the task's own list)
        self.delivered[token] = seq + 1
        self(kind, value)


@dataclasses.dataclass(frozen=True)
class _Cluster:
    """What the cluster offers, to size each task's resource request."""

    node_cpus: float  # CPUs of the largest node (0: unknown, e.g. an autoscaler's empty head)
    node_gpus: float  # GPUs of the node with the most

    @classmethod
    def of(cls, ray: Any) -> _Cluster:
        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        return cls(max((n.get("CPU", 0.0) for n in nodes), default=0.0),
                   max((n.get("GPU", 0.0) for n in nodes), default=0.0))

    def resources(self, train: TrainConfig) -> tuple[int, int]:
        """(num_cpus, num_gpus) of a task training with `train`."""
        gpus = task_gpus(train.device, train.nproc_per_node, self.node_gpus)
        if gpus > self.node_gpus:
            raise ConfigError(f"runs need {gpus} GPU{'s' if gpus > 1 else ''} on one node (--device "
                              f"{train.device}, --nproc-per-node {train.nproc_per_node}) but no node of the Ray "
                              f"cluster has {'any' if not self.node_gpus else 'that many'}; use --device cpu "
                              f"or a cluster with GPU nodes")
        cpus = task_cpus(train.cpu_threads, train.nproc_per_node, gpus)
        return (min(cpus, max(1, int(self.node_cpus))) if self.node_cpus else cpus), gpus


def task_gpus(device: str, nproc_per_node: int, cluster_gpus: float) -> int:
    """GPUs a run's task asks for: `nproc_per_node` when it trains on CUDA ("cuda", "cuda:N", or "auto"
    on a cluster with GPUs), else 0."""
    if device.startswith("cuda") or (device == "auto" and cluster_gpus > 0):
        return nproc_per_node
    return 0


def task_cpus(cpu_threads: int | None, nproc_per_node: int, gpus: int) -> int:
    """CPUs a run's task asks for: its torch threads (at least 1), per process for a CPU DDP run."""
    threads = max(1, cpu_threads or 1)
    return threads if gpus else threads * nproc_per_node


def _task_error(exc: Any) -> BaseException:
    """The exception a task raised, as itself (one line in the CLI), not Ray's wrapper with its traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, ImportError):
        return ConfigError(f"a Ray worker cannot import {cause.name or 'normkit'} ({one_line(str(cause), 200)}); "
                           f"every node needs the same Python environment with normkit installed")
    if isinstance(cause, BaseException):
        return cause
    return RuntimeError(one_line(str(exc)))


@contextlib.contextmanager
def _loopback_instance(ray: Any) -> Iterator[None]:
    """Start the local instance on loopback only and with Ray's token authentication; this
    process's settings are restored when the instance is shut down.

    Ray binds its servers (GCS, raylet and its object manager, every worker, the runtime-env agent)
    to the node's address, and turns `_node_ip_address="127.0.0.1"` into the machine's network
    address unless Ray's cluster mode is off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read by
    `ray._private.services.get_node_ip_address`): with it off, the node address is 127.0.0.1 and
    nothing listens beyond loopback. Token authentication stays on as a second lock, also when
    RAY_AUTH_MODE says otherwise; with no dashboard nothing else listens (docs/scaling.md).
    """
    from ray._private import ray_constants

    saved_auth = os.environ.pop("RAY_AUTH_MODE", None)
    saved_cluster_env = os.environ.get(_CLUSTER_MODE_ENV)
    saved_cluster = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTER_MODE_ENV] = "0"  # for the processes Ray starts
    ray_constants.ENABLE_RAY_CLUSTER = False  # for this one, which imported Ray already
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_cluster
        _restore_env(_CLUSTER_MODE_ENV, saved_cluster_env)
        _restore_env("RAY_AUTH_MODE", saved_auth)  # Ray sets it to "token" for this process


_CLUSTER_MODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _stopped_with_this_process(ray: Any) -> Iterator[None]:
    """A watchdog stops the local instance's processes (GCS, raylet, its agents and workers, and the
    programs below them) if this process dies without shutting it down (SIGKILL); Ray's own cleanup
    runs only on a normal exit. The watchdog is released after the shutdown."""
    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    pids = [process.pid for _, process in node.live_processes()] if node is not None else []
    handle = watch(pids) if pids else None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _probe(address: str) -> None:
    """Fail in seconds on an address nothing listens at (ray.init would retry it for minutes)."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or address == "auto":
        return  # "auto", "local" or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(_cannot_connect(address, str(exc) or type(exc).__name__)) from None


def _cannot_connect(address: str, why: str) -> str:
    return (f"cannot connect to the Ray cluster at --ray-address {address!r}: {one_line(why, 200)}; start one "
            f"with `ray start --head` or give its address (auto on a cluster node, HOST:6379, "
            f"or ray://HOST:10001 for Ray Client), or drop --ray-address for a local instance")


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """Silence one logger's warnings for a block (recent Rays warn on every local start, and on joining
    a cluster found with "auto", that token authentication is on, their default)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """ray.init installs a SIGTERM handler calling sys.exit; keep ours (SIGTERM unwinds like Ctrl-C)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sigterm_through_ray() -> Iterator[None]:
    """Ray's blocking calls (ray.wait, ray.get) turn whatever a signal handler raises into a plain
    KeyboardInterrupt. Remember that SIGTERM came, and raise what the handler raises (the CLI's
    `Terminated`, exit 143) instead of that KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    if not callable(handler):  # SIG_DFL ends the process, SIG_IGN ignores it: nothing to carry
        yield
        return
    came: list[bool] = []

    def remember(signum: int, frame: Any) -> None:
        came.append(True)
        handler(signum, frame)

    signal.signal(signal.SIGTERM, remember)
    try:
        yield
    except KeyboardInterrupt as exc:
        if not came or type(exc) is not KeyboardInterrupt:
            raise
        handler(signal.SIGTERM, None)  # raises the handler's own exception
        raise
    finally:
        signal.signal(signal.SIGTERM, handler)


# -- in the Ray worker -------------------------------------------------------------------------


class _EventBox:
    """A Ray actor holding the tasks' progress events until the driver takes them. Not async, so the
    events of one task arrive in the order it sent them."""

    def __init__(self) -> None:
        self._events: list[tuple[int, int, str, Any]] = []

    def put(self, event: tuple[int, int, str, Any]) -> None:
        self._events.append(event)

    def take(self) -> list[tuple[int, int, str, Any]]:
        events, self._events = self._events, []
        return events


def _run_task(job: Job, wait_for_holder: bool, events: Any, token: int, gpus: int) -> tuple[str, list[Any]]:
    """Run one job; its outcome ("ran", "skipped": finished already, "busy": another process holds
    it) and every event it sent, in order."""
    if gpus:  # Ray set CUDA_VISIBLE_DEVICES to the GPUs it gave this task
        job = job.with_train(device="cuda")
    emitted: list[tuple[str, Any]] = []

    def emit(kind: str, value: Any) -> None:
        events.put.remote((token, len(emitted), kind, value))  # not waited for: see _Relay
        emitted.append((kind, value))

    result = run_job(job, emit, wait=wait_for_holder)
    if result is not None:
        return "ran", emitted
    if wait_for_holder or job.run in ResultsDir(Path(job.store)).finished():
        return "skipped", emitted
    return "busy", emitted
