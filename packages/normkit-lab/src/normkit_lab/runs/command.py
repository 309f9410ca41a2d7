"""The command trainer: any program as a run (`normkit compare --command "python train.py ..."`).

For each run the command's placeholders are filled in (`template.py`), the program starts in the
directory the comparison was started from, with the run's values also in its environment
(NORMKIT_NORM, NORMKIT_SEED, NORMKIT_RUN_DIR, NORMKIT_PHASE, NORMKIT_EPOCHS, NORMKIT_CELL and
NORMKIT_TUNED as JSON, NORMKIT_CELL_<KEY> and NORMKIT_TUNED_<KEY> for each key), and reports its
metrics as `normkit: {json}` lines on stdout (`normkit_lab.reporting`). Its stdout and stderr are
kept in the run's directory (stdout.log, stderr.log, appended by every attempt).

A run fails, with the reason and the last lines of stderr in its record, when the program exits
non-zero or is killed, reports nothing or never the primary metric, reports a malformed or
non-finite value (it is stopped at once), or runs past `timeout` seconds (its process group is
killed). The comparison goes on either way. When normkit itself is stopped (Ctrl-C, SIGTERM, a
killed worker), the program's process group is stopped too and the run is not recorded, so
resume starts it again, with the same `{run_dir}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import normkit
from normkit_lab.errors import ConfigError, one_line
from normkit_lab.processes import read_status, supervised
from normkit_lab.reporting import ACCURACY_ENV, PREFIX, ReportError, near_miss, parse_line
from normkit_lab.runs.external import (
    Records,
    check_external,
    plain_config,
    record_or_check_code,
    require_metric,
    tuning_score,
)
from normkit_lab.runs.template import CommandTemplate
from normkit_lab.runs.trainer import RunContext
from normkit_lab.store.safe_paths import make_dirs

if TYPE_CHECKING:
    from normkit_lab.records import RunId, RunResult
    from normkit_lab.spec import CompareConfig, TrainConfig

POLL_S = 0.1
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
STDERR_TAIL_LINES = 5
STDERR_TAIL_CHARS = 320  # with the reason, within the 400 characters of a failure line: its end is kept
MAX_LINE_BYTES = 1 << 20  # a stdout line is read at most this much at a time; a longer report is refused


class CommandFailed(normkit.NormkitError):
    """The program's run failed (recorded as a failed run with this one line)."""


@dataclass(frozen=True)
class CommandTrainer:
    """Runs `command` once per run in `workdir`; `metric`/`select` say what it must report; `timeout`
    seconds per run (None: no limit)."""

    command: str
    workdir: str
    metric: str
    select: str = "final"
    timeout: float | None = None
    percent: bool = False  # the program reports accuracies in percent (`CompareConfig.accuracies_in_percent`)
    kind: str = "command"

    @classmethod
    def of(cls, cfg: CompareConfig) -> CommandTrainer:
        assert cfg.command is not None
        return cls(cfg.command, cfg.command_dir or os.getcwd(), cfg.metric, cfg.select, cfg.timeout,
                   cfg.accuracies_in_percent)

    def check(self, cfg: CompareConfig, parallel: int = 1) -> None:
        """The command splits, names only known placeholders and an existing program; the files it names
        are hashed into the config (`code_files`), and on resume must not have changed."""
        workdir = Path(self.workdir)
        if not workdir.is_dir():
            raise ConfigError(f"the command's directory {self.workdir!r} does not exist; run the comparison "
                              f"from the directory of the training script")
        template = CommandTemplate.parse(self.command)
        template.check(cfg.sweep, cfg.tune, workdir)
        check_external(cfg)
        for norm in cfg.norms:
            normkit.parse(norm)
        record_or_check_code(cfg, template.named_files(workdir),
                             "with the file as it was; code_files in config.yaml holds its hash")
        cfg.command_dir = self.workdir
        if cfg.train.cpu_threads is None and parallel > 1:
            from normkit_lab.runs.device import split_threads

            cfg.train.cpu_threads = split_threads(os.cpu_count() or 1, parallel)

    def run_config(self, run_id: RunId, base: TrainConfig) -> TrainConfig:
        return plain_config(run_id, base)

    def tuning_score(self, cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
        return tuning_score(cfg, run)

    def values(self, job: Any, run_dir: Path) -> dict[str, Any]:
        """Every placeholder's value for `job`'s run."""
        run_id = job.run
        return {"norm": run_id.norm, "seed": run_id.seed, "run_dir": str(run_dir), "phase": run_id.phase,
                "epochs": job.train.epochs, "python": sys.executable, **{f"cell.{k}": v for k, v in run_id.cell},
                **dict(run_id.tuned)}

    def environment(self, job: Any, values: dict[str, Any]) -> dict[str, str]:
        from normkit_lab.runs.template import text_of

        run_id = job.run
        env = dict(os.environ)
        env.update({"NORMKIT_NORM": run_id.norm, "NORMKIT_SEED": str(run_id.seed),
                    "NORMKIT_RUN_DIR": values["run_dir"], "NORMKIT_PHASE": run_id.phase,
                    "NORMKIT_EPOCHS": str(job.train.epochs), "NORMKIT_CELL": json.dumps(dict(run_id.cell)),
                    "NORMKIT_TUNED": json.dumps(dict(run_id.tuned)), "PYTHONUNBUFFERED": "1",
                    ACCURACY_ENV: "percent" if self.percent else "fraction"})
        for prefix, items in (("NORMKIT_CELL_", run_id.cell), ("NORMKIT_TUNED_", run_id.tuned)):
            for key, value in items:
                env[prefix + key.upper()] = text_of(value)
        threads = job.train.cpu_threads
        if threads is not None:
            for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NORMKIT_CPU_THREADS"):
                env[name] = str(threads)
        if job.train.device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = job.train.device.split(":", 1)[1]
        return env

    def train(self, job: Any, context: RunContext) -> RunResult:
        from normkit_lab.records import RunResult

        run_dir = make_dirs(Path(job.store), context.run_dir)
        values = self.values(job, run_dir.resolve())
        argv = CommandTemplate.parse(self.command).argv(values)
        records = Records(run_dir, context.on_epoch, context.loggers, self.percent)
        started = time.monotonic()
        status, cpu_s, stderr_tail, problem = _run(argv, self.workdir, self.environment(job, values), run_dir,
                                                   records, self.timeout)
        wall_s = time.monotonic() - started
        epochs = records.epochs()
        if problem is None and status != "exit 0":
            problem = f"exited with {_exit_text(status)}"
        if problem is None:
            try:
                records.require_this_attempt("no `normkit: {...}` line on stdout")
                require_metric(epochs, self.metric, self.select, self.percent)
            except ReportError as exc:
                problem = str(exc)
        if problem is not None:
            tail = f"; stderr: {stderr_tail}" if stderr_tail else "; stderr was empty"
            raise CommandFailed(one_line(f"{problem}{tail}", 600))
        params = next((r.metrics["params"] for r in reversed(epochs) if "params" in r.metrics), None)
        for record in epochs:
            record.metrics.pop("params", None)
        return RunResult(norm=normkit.parse(job.run.norm).text, seed=job.run.seed, status="ok", epochs=epochs,
                         params=params, extras={"command": {"argv": argv, "wall_s": round(wall_s, 3), "cpu_s": cpu_s}},
                         trainer=self.kind)


def _exit_text(status: str) -> str:
    """The supervisor's `exit N` / `signal N` as the record says it."""
    kind, _, number = status.partition(" ")
    if kind == "signal":
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(int(number)).name}"
        return f"signal {number}"
    return f"status {number}"


def _run(argv: list[str], workdir: str, env: dict[str, str], run_dir: Path, records: Records,
         timeout: float | None) -> tuple[str, float | None, str, str | None]:
    """Run the program under its supervisor (`normkit_lab.processes`) to its end: (its exit status as
    `exit N` / `signal N`, the CPU seconds of its process tree, the stderr tail, the problem or None).
    Its stdout is copied to stdout.log and parsed line by line (in a thread, handed to this one); a bad
    line stops it."""
    lines: queue.Queue[str | None] = queue.Queue()
    with (run_dir / "stdout.log").open("ab", buffering=0) as out, (run_dir / "stderr.log").open("ab") as err:
        banner = f"--- normkit: {time.strftime('%Y-%m-%d %H:%M:%S')} {json.dumps(argv)}\n".encode()
        out.write(banner)
        err.write(banner)
        err.flush()
        err_start = err.tell()
        status_read, status_write = os.pipe()
        try:
            proc = subprocess.Popen(supervised(argv, status_write, STOP_GRACE_S), cwd=workdir, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                    start_new_session=True, pass_fds=(status_write,))
        except OSError as exc:
            os.close(status_read)
            return "exit 127", None, "", f"could not start the supervisor of {argv[0]!r}: {exc.strerror or exc}"
        finally:
            os.close(status_write)
        log_failed: list[OSError] = []
        reader = threading.Thread(target=_read, args=(proc.stdout, out, lines, log_failed), daemon=True)
        reader.start()
        problem = None
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            done = False
            while not done:
                try:
                    line = lines.get(timeout=POLL_S)
                except queue.Empty:
                    line = ""
                if line is None:
                    done = True
                elif line is _LOG_FAILED:
                    break
                elif line:
                    problem = _take(line, records)
                    if problem is not None:
                        break
                if deadline is not None and time.monotonic() > deadline and proc.poll() is None:
                    problem = f"ran past the timeout of {timeout:g} s and was stopped"
                    break
        finally:
            if proc.poll() is None:  # a problem, a timeout, or normkit itself stopping (Ctrl-C, SIGTERM)
                _stop(proc)
            proc.wait()
            reader.join(timeout=STOP_GRACE_S)
            status, cpu_s = read_status(status_read)
            os.close(status_read)
    if log_failed:  # the machine's failure, not the program's: nothing is recorded (runs.execute)
        raise log_failed[0]
    while problem is None:  # lines the reader handed over after the last poll
        try:
            line = lines.get_nowait()
        except queue.Empty:
            break
        if line:
            problem = _take(line, records)
    if problem is None and status.startswith("error "):
        problem = f"could not start {argv[0]!r}: {status[6:]}"
    if not status.startswith(("exit ", "signal ")):  # the supervisor itself was killed
        status = f"signal {-proc.returncode}" if (proc.returncode or 0) < 0 else f"exit {proc.returncode}"
    return status, cpu_s, _tail(run_dir / "stderr.log", err_start), problem


def _take(line: str, records: Records) -> str | None:
    if line is _OVERLONG:
        return f"printed a `normkit:` line longer than {MAX_LINE_BYTES:,} bytes; report fewer metrics per line"
    if near_miss(line) and records.near_miss is None:
        records.near_miss = line.strip()
    try:
        values = parse_line(line)
        if values is not None:
            records.add(values)
    except ReportError as exc:
        return str(exc)
    return None


_OVERLONG = "\x00overlong\x00"  # handed over in place of a `normkit:` line longer than MAX_LINE_BYTES
_LOG_FAILED = "\x00log failed\x00"  # handed over when stdout.log cannot be written (a full disk)


def _read(stream: IO[bytes] | None, out: IO[bytes], lines: queue.Queue[str | None], failed: list[OSError]) -> None:
    """Copy the program's stdout to stdout.log and hand each line to the run's thread; None at the end
    (after _LOG_FAILED, with the error in `failed`, when stdout.log cannot be written).
    A line is read MAX_LINE_BYTES at a time, so an endless line costs no more memory than that: the
    rest of it is copied to the log, and it is handed over only when it is short enough to be a report."""
    assert stream is not None
    try:
        overlong = False
        for raw in iter(lambda: stream.readline(MAX_LINE_BYTES), b""):
            try:
                out.write(raw)
                out.flush()
            except OSError as exc:  # a full disk: the run's thread stops the program and raises it, naming the file
                lines.put(_LOG_FAILED)
                failed.append(OSError(exc.errno, exc.strerror, out.name))
                return
            complete = raw.endswith(b"\n")
            if not overlong and (complete or len(raw) < MAX_LINE_BYTES):
                lines.put(raw.decode("utf-8", errors="replace"))
            elif not overlong and raw.startswith(PREFIX.encode()):
                lines.put(_OVERLONG)
            overlong = not complete
    finally:
        lines.put(None)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the program: SIGTERM to its supervisor, which stops every process below it (SIGTERM, then
    SIGKILL after STOP_GRACE_S); SIGKILL to the supervisor's group if it does not finish in time."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=3 * STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _tail(path: Path, start: int) -> str:
    """The last lines this attempt wrote to stderr.log, joined with ' | ' (for the run's record)."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read()[-64_000:].decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tail = " | ".join(lines[-STDERR_TAIL_LINES:])
    return tail if len(tail) <= STDERR_TAIL_CHARS else "..." + tail[-STDERR_TAIL_CHARS:]

