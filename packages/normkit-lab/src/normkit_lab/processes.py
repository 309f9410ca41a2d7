"""No process outlives normkit: what keeps the programs, workers and Ray processes it starts from
running on after it stops, however it stops (an error, Ctrl-C, SIGTERM, or SIGKILL, which runs no
cleanup code of normkit at all).

- `die_with_parent()`, called in a child process: the kernel sends it SIGKILL when its parent
  dies (Linux PR_SET_PDEATHSIG), so the local pool's workers go with a killed normkit
  (`start_worker`, their initializer, asks for it before their heavy imports).
- `supervised(argv, ...)`: the command line that runs a `--command` program under a supervisor,
  `python -c '... _main(...)' supervise ...`. The supervisor is a child subreaper (Linux
  PR_SET_CHILD_SUBREAPER): every process the program starts stays below it, even one that calls
  `setsid` or whose parent exits. When the program exits, what it left behind (a grandchild holding
  its stdout open) is stopped; when the supervisor is told to stop (SIGTERM: normkit's timeout or its
  own stop; or its parent died: it gets SIGTERM from the kernel), the whole tree is stopped, SIGTERM
  then SIGKILL. Its last act is to write the program's exit status to a pipe normkit reads.
- `watch(pids)`: a detached watchdog that kills the process trees under `pids` once this process
  has died (Ray's local instance: its GCS, raylet, agents and workers are not normkit's children).

Linux only (`/proc`, prctl); elsewhere the supervisor is a plain parent and the watchdog is not
started. Imports nothing heavy: the supervisor starts once per run.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05
WATCH_S = 0.5  # how often the watchdog notes the processes below the ones it watches


def _prctl(option: int, value: int) -> bool:
    """prctl(option, value); False where it is not available."""
    if not LINUX:
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send this process `sig` when its parent dies; exit now if `parent` (the pid the
    parent had) is already gone (it died before the request was made)."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))
    if LINUX and os.getppid() != parent:
        os._exit(1)


def start_worker(parent: int, init: str, *args: Any) -> None:
    """A pool worker's initializer: die with `parent` first, then import `init` ("module:function", which
    imports torch: seconds) and call it with `args`. A normkit killed while its workers start takes them
    along at once, instead of after their imports (this module imports nothing heavy)."""
    die_with_parent(parent)
    module, _, name = init.partition(":")
    getattr(importlib.import_module(module), name)(*args)


def descendants(root: int) -> list[int]:
    """Every live process below `root` in the process tree (children first), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if LINUX else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap() -> None:
    """Collect every exited child (a subreaper inherits the orphans' exit statuses)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(root: int, grace: float) -> None:
    """SIGTERM every process below `root`, then SIGKILL what is left after `grace` seconds."""
    _signal_all(descendants(root), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while descendants(root) and time.monotonic() < deadline:
        if root == os.getpid():
            _reap()
        time.sleep(POLL_S)
    while True:  # a process may start another while it is being killed
        left = descendants(root)
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        if root == os.getpid():
            _reap()
        time.sleep(POLL_S)
    if root == os.getpid():
        _reap()


# -- the supervisor of one program ------------------------------------------------------------------


# How the supervisor and the watchdog start: not `python -m`, which puts the working directory (the
# user's project) first on sys.path, where a `signal.py` or `subprocess.py` of theirs would be imported
_ENTRY = ("import sys; del sys.path[0]; from normkit_lab.processes import _main; sys.exit(_main(sys.argv[1:]))")


def supervised(argv: Sequence[str], status_fd: int, grace: float) -> list[str]:
    """The command line that runs `argv` under a supervisor writing its exit status to `status_fd`."""
    return [sys.executable, "-c", _ENTRY, "supervise", str(os.getpid()), str(status_fd), repr(float(grace)), "--",
            *argv]


class _Stop(Exception):
    """The supervisor was told to stop (SIGTERM, SIGINT or SIGHUP)."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop


def _supervise(parent: int, status_fd: int, grace: float, argv: list[str]) -> int:
    """Run `argv` to its end or until stopped; stop everything it left; report `exit N` / `signal N`."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    die_with_parent(parent, signal.SIGTERM)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    me = os.getpid()
    status = "stopped"
    try:
        try:
            program = subprocess.Popen(argv, close_fds=True, preexec_fn=_program_dies_with(me))
        except OSError as exc:
            status = f"error {exc.strerror or exc}"
        else:
            code = program.wait()
            status = f"signal {-code}" if code < 0 else f"exit {code}"
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stop once: a second SIGTERM must not cut the cleanup
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_tree(me, grace)
        import resource

        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the program and every process below it, reaped
        with contextlib.suppress(OSError):
            os.write(status_fd, f"{status}\ncpu {usage.ru_utime + usage.ru_stime:.3f}".encode())
    return 0 if status == "exit 0" else 1


def _program_dies_with(supervisor: int) -> Any:
    def preexec() -> None:
        die_with_parent(supervisor, signal.SIGKILL)

    return preexec if LINUX else None


def read_status(status_fd: int) -> tuple[str, float | None]:
    """What the supervisor reported: the program's end (`exit N`, `signal N`, `error TEXT`, `stopped`; ''
    if the supervisor died first) and the CPU seconds of the program and every process below it."""
    chunks = []
    with contextlib.suppress(OSError):
        while True:
            chunk = os.read(status_fd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    status, _, cpu = b"".join(chunks).decode(errors="replace").partition("\ncpu ")
    try:
        return status, float(cpu)
    except ValueError:
        return status, None


# -- the watchdog of processes that are not our children --------------------------------------------


def watch(pids: Sequence[int], grace: float = 2.0) -> Any:
    """Start a watchdog that, once this process has died or closed the returned handle, stops every
    process below `pids` (and `pids` themselves). Returns the handle to close (None off Linux)."""
    if not LINUX:
        return None
    read, write = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-c", _ENTRY, "watch", repr(float(grace)), *map(str, pids)], stdin=read,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    finally:
        os.close(read)
    return os.fdopen(write, "wb")


def _watch(grace: float, roots: list[int]) -> int:
    """Until stdin ends (the watched process died or closed it), note every process below `roots` every
    WATCH_S; then stop every noted process still running (a process's parent may die first, its
    children then hang below init, out of reach of a walk made only at the end)."""
    import select

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    noted: dict[int, str] = {}
    while True:
        for pid in [*roots, *(p for root in roots for p in descendants(root))]:
            noted.setdefault(pid, _started(pid))
        ready, _, _ = select.select([sys.stdin], [], [], WATCH_S)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
    doomed = {pid for pid, started in noted.items() if started and _started(pid) == started}
    doomed |= {p for pid in doomed for p in descendants(pid)}
    _signal_all(doomed, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in doomed):
        time.sleep(POLL_S)
    _signal_all(doomed | {p for pid in doomed for p in descendants(pid)}, signal.SIGKILL)
    return 0


def _alive(pid: int) -> bool:
    return _state(pid) not in ("", "Z")


def _state(pid: int) -> str:
    """/proc's state letter of `pid` (Z: a zombie); '' when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2:][:1]


def _started(pid: int) -> str:
    """When `pid` started (/proc's start time, in clock ticks): tells a process from a later one that
    reuses its number; '' when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2:].split()[19]


def _main(args: list[str]) -> int:
    if args[:1] == ["supervise"] and len(args) >= 5 and args[4] == "--":
        return _supervise(int(args[1]), int(args[2]), float(args[3]), args[5:])
    if args[:1] == ["watch"] and len(args) >= 2:
        return _watch(float(args[1]), [int(a) for a in args[2:]])
    print("usage: processes supervise PARENT FD GRACE -- ARGV... | watch GRACE PID...", file=sys.stderr)
    return 2
