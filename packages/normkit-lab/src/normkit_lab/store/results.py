"""A comparison's results directory: what is written, how, and how it is read back.

    config.yaml       the resolved config (loadable with --config / --resume)
    runs.jsonl        one row per run and epoch, long format: the run's identity (norm, seed, phase,
                      cell, tuned), status, params, threads, the epoch's metrics, environment columns
    tuning.json       with --tune: every candidate's mean val accuracy per (cell, norm), and the choice
    summary.csv/json  one row per norm (a view of runs.jsonl, rewritten after every run)
    environment.json  versions, device, CPU, threads, git commit; `resumes`: the environments of resumes
                      allowed to change versions (normkit_lab.study.versions)
    store.json        the hash of what every run computes (config_identity) and those values, written
                      once at creation: a config.yaml edited afterwards is refused, so a store never
                      mixes runs of two configurations (e.g. 3- and 2-epoch runs); when it is
                      missing, the rows' config hash stands in for it, checked against config.yaml
    checkpoints/      the last finished epoch of each run in progress (removed when it ends), and with
                      --keep-checkpoints the final weights of every run
    metrics/          one CSV of per-epoch metrics per run; tensorboard/ with --log tensorboard
    runs/             one directory per run of a --command or train= trainer: its stdout/stderr, the
                      metrics it reported, and whatever the program keeps there ({run_dir})
    locks/            lock files: one per run (held while it trains) and one for appending rows

The store is keyed by run identity (`RunId` plus the config hash in every row). Several processes
may fill one store at once (a local pool, Ray tasks, SLURM array jobs): a run is trained only by the
process holding its lock, which first checks that no one finished it, and rows are appended under
a store-wide lock; the operating system drops a dead process's locks.

Every file is written atomically (temporary file + os.replace). A run's rows are appended to
runs.jsonl in one write followed by fsync once the run has finished, so an interrupted comparison
keeps exactly its finished runs. A run that diverged before its first epoch ended still gets
one row, with `epoch` null, so resume knows it finished; so does a run that failed (status
"failed", its one-line `error`), which resume runs again (a later attempt replaces it).

Reading is strict: every row must pass `check_row` (one schema), and a symlink in the directory
is refused, so a tampered directory gives one line naming the file and line, never a traceback,
and nothing is written through a link to elsewhere.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from normkit_lab import safe_yaml
from normkit_lab.errors import ConfigError, short_repr
from normkit_lab.records import EpochRecord, RunId, RunResult, config_hash, config_identity
from normkit_lab.reporting import RESERVED, ReportedEpoch
from normkit_lab.store import locks
from normkit_lab.store.atomic import atomic_write_text
from normkit_lab.store.safe_paths import make_dirs, refuse_links

CONFIG_FILE = "config.yaml"
RUNS_FILE = "runs.jsonl"
SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
ENVIRONMENT_FILE = "environment.json"
STATUSES = ("ok", "diverged", "failed")
TRAINERS = ("builtin", "command", "function")  # normkit_lab.runs.trainer.TRAINER_KINDS
TUNING_FILE = "tuning.json"
STORE_FILE = "store.json"
CHECKPOINTS_DIR = "checkpoints"
RUN_DIRS = "runs"
LOCKS_DIR = "locks"
METRICS_DIR = "metrics"  # per-epoch CSV of every run (normkit_lab.runs.loggers)


def json_text(obj: Any) -> str:
    """JSON with NaN/inf written as null (strict JSON readers reject NaN)."""
    return json.dumps(_finite(obj), indent=2) + "\n"


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def new_results_dir(out: str | Path | None, kind: str = "compare") -> Path:
    """Create a fresh directory: `out`, or runs/<timestamp>-<kind>; `-1`, `-2`... if taken."""
    base = Path(out) if out is not None else Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"
    candidate, suffix = base, 0
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                suffix += 1
                candidate = base.with_name(f"{base.name}-{suffix}")
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise ConfigError(f"cannot create results directory {str(candidate)!r}: "
                          f"{getattr(exc, 'strerror', None) or exc}; "
                          f"choose another --out") from None


def epoch_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(EpochRecord)]


def run_rows(result: RunResult, env: dict[str, Any], config_hash: str | None = None) -> list[dict[str, Any]]:
    """The runs.jsonl rows of one finished run (the last carries the callbacks' extras, if any)."""
    head = {**RunId.of_run(result).fields(), "status": result.status, "params": result.params,
            "threads": result.threads}
    if config_hash is not None:
        head["config_hash"] = config_hash
    if result.error is not None:
        head["error"] = result.error
    if result.trainer != "builtin":
        head["trainer"] = result.trainer
    records = [r.as_dict() for r in result.epochs] or [dict.fromkeys(epoch_fields())]
    rows = [{**head, **record, **env} for record in records]
    if result.extras:
        rows[-1]["extras"] = result.extras
    return rows


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_MEASURED = ("train_loss", "train_acc", "val_loss", "val_acc")  # every finished epoch has these


def _row_problem(row: Any) -> str | None:
    """Why `row` is not a runs.jsonl row (None when it is one)."""
    if not isinstance(row, dict):
        return f"is a JSON {type(row).__name__}, not an object"
    missing = [key for key in ("norm", "seed", "status", "epoch", "params") if key not in row]
    if missing:
        return f"lacks {', '.join(missing)}"
    checks = [
        ("norm", isinstance(row["norm"], str) and bool(row["norm"]), "a spec text"),
        ("seed", _is_int(row["seed"]) and row["seed"] >= 0, "an integer >= 0"),
        ("status", row["status"] in STATUSES, f"one of {', '.join(STATUSES)}"),
        ("epoch", row["epoch"] is None or (_is_int(row["epoch"]) and row["epoch"] >= 0), "null or an integer >= 0"),
        ("params", row["params"] is None or (_is_int(row["params"]) and row["params"] >= 0),
         "null or an integer >= 0"),
        ("error", row.get("error") is None or isinstance(row["error"], str), "null or a text"),
        ("config_hash", row.get("config_hash") is None or isinstance(row["config_hash"], str), "null or a text"),
        ("phase", row.get("phase") in (None, "compare", "tune"), "null, compare or tune"),
        ("trainer", row.get("trainer") in (None, *TRAINERS), f"null or one of {', '.join(TRAINERS)}"),
        *((key, row.get(key) is None or (isinstance(row[key], dict) and all(
            isinstance(v, (int, float, str, bool)) or v is None for v in row[key].values())),
           "null or an object of plain values") for key in ("cell", "tuned")),
        ("extras", row.get("extras") is None or (isinstance(row["extras"], dict)
                                                 and all(isinstance(v, dict) for v in row["extras"].values())),
         "null or an object of objects (one per callback)"),
        *((key, row.get(key) is None or _is_number(row[key]), "null or a number")
          for key in epoch_fields() if key != "epoch"),
    ]
    for key, ok, expected in checks:
        if not ok:
            return f"has {key} {short_repr(row.get(key), 40)}; it must be {expected}"
    values = [*row.items(), *(item for key in ("cell", "tuned") for item in (row.get(key) or {}).items())]
    for key, value in values:  # normkit writes NaN and inf as null (json_text), so one here was edited in
        if isinstance(value, float) and not math.isfinite(value):
            return f"has {key} {value!r}; normkit records only finite numbers (or null)"
    if row["status"] == "failed" and not isinstance(row.get("error"), str):
        return "has status failed but no error text"
    if row["epoch"] is not None and row.get("trainer") in (None, "builtin"):
        missing = [key for key in _MEASURED if not _is_number(row.get(key))]
        if missing:
            return f"is an epoch row without {', '.join(missing)}"
    return None


def check_row(row: Any, where: str) -> dict[str, Any]:
    """`row` when it is a valid runs.jsonl row; else one ConfigError naming `where` (file:line)."""
    problem = _row_problem(row)
    if problem is not None:
        raise ConfigError(f"{where} {problem}; the file was edited or damaged, so fix or remove that line")
    return row


def group_runs(rows: Iterable[dict[str, Any]]) -> dict[RunId, list[dict[str, Any]]]:
    """Rows grouped by run identity, keeping each run's latest attempt (a retried failure is replaced), in
    the order runs first appeared. The one grouping of rows into runs: `rows_to_runs` (RunResults) and the
    summary's views (`summary.runs_from_rows`) are both built on it."""
    grouped: dict[RunId, list[dict[str, Any]]] = {}
    for row in rows:
        key = RunId.of_row(row)
        group = grouped.setdefault(key, [])
        if group and (group[-1].get("status") == "failed" or row.get("status") == "failed"):
            group.clear()  # a failed attempt is one row; the next attempt starts afresh
        group.append(row)
    return grouped


def rows_to_runs(rows: Iterable[dict[str, Any]]) -> list[RunResult]:
    """Group runs.jsonl rows back into RunResults (by run identity), in the order runs first appeared."""
    fields = epoch_fields()
    runs = []
    for run_id, group in group_runs(rows).items():
        trainer = group[-1].get("trainer") or "builtin"
        epochs: list[Any] = [EpochRecord(**{k: row.get(k) for k in fields}) if trainer == "builtin"
                             else reported_epoch(row) for row in group if row.get("epoch") is not None]
        extras: dict[str, Any] = {}
        for row in group:
            extras.update(row.get("extras") or {})
        runs.append(RunResult(norm=run_id.norm, seed=run_id.seed, status=group[-1]["status"], epochs=epochs,
                              params=group[-1]["params"], extras=extras, error=group[-1].get("error"),
                              threads=group[-1].get("threads"), phase=run_id.phase, cell=dict(run_id.cell),
                              tuned=dict(run_id.tuned), trainer=trainer))
    return runs


def reported_epoch(row: dict[str, Any]) -> ReportedEpoch:
    """A reported epoch back from its runs.jsonl row: every number that is not a column of the row's
    identity or environment is a metric."""
    return ReportedEpoch(row["epoch"], {k: v for k, v in row.items() if k not in RESERVED and k != "epoch"
                                        and _is_number(v)})


def _as_json(value: Any) -> str:
    """`value` as config_hash sees it (so 1 and 1.0, or true and 1, differ)."""
    return json.dumps(value, sort_keys=True, default=repr)


def refuse_symlinks(path: Path) -> None:
    """Refuse a results directory that is, or holds, a symbolic link (writes must stay inside it)."""
    if path.is_symlink():
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):  # a loop, or a link to nothing
            raise ConfigError(f"{str(path)!r} is a symbolic link that leads nowhere (a loop or a missing "
                              f"target); give the results directory's real path") from None
        raise ConfigError(f"{str(path)!r} is a symbolic link; give the results directory's real path "
                          f"({str(real)!r}) so every write stays inside it")
    links = sorted(p for p in path.iterdir() if p.is_symlink()) if path.is_dir() else []
    if links:
        raise ConfigError(f"{str(links[0])!r} is a symbolic link; a results directory holds only its own "
                          f"files, so replace the link with the file or directory itself")


class ResultsDir:
    """One results directory; created fresh by `create`, reopened (for resume/report) by `open`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, out: str | Path | None, config_yaml: str, environment: dict[str, Any],
               kind: str = "compare") -> ResultsDir:
        store = cls(new_results_dir(out, kind))
        atomic_write_text(store.path / CONFIG_FILE, config_yaml)
        raw = safe_yaml.read(store.path / CONFIG_FILE, "config", saved=True) or {}
        atomic_write_text(store.path / STORE_FILE, json_text(
            {"format": 1, "config_hash": config_hash(raw), "config": config_identity(raw)}))
        store.write_environment(environment)
        return store

    @classmethod
    def open(cls, path: str | Path) -> ResultsDir:
        path = Path(path)
        refuse_symlinks(path)
        if not (path / CONFIG_FILE).is_file():
            what = "does not exist" if not path.exists() else f"has no {CONFIG_FILE}"
            raise ConfigError(f"{str(path)!r} {what}; give a directory written by `normkit compare`")
        store = cls(path)
        store.check_config_unchanged()
        return store

    def _store_info(self) -> dict[str, Any] | None:
        """store.json; when it is missing, rebuilt from the rows' config hash and checked against config.yaml
        (None only for a store with no rows: nothing to mix). Damaged or unverifiable: one ConfigError."""
        path = self.path / STORE_FILE
        if not path.is_file():
            return self._info_from_rows(path)
        try:
            info = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            info = None
        if not (isinstance(info, dict) and isinstance(info.get("config_hash"), str)
                and isinstance(info.get("config"), dict)):
            raise ConfigError(f"{str(path)!r} is damaged; it records the configuration the runs were made "
                              f"with, so restore it from a copy or start a new comparison with --out")
        return info

    def _info_from_rows(self, path: Path) -> dict[str, Any] | None:
        """What store.json held, from the rows (each records its config hash) and config.yaml, or refused."""
        rows = self.rows()
        if not rows:
            return None
        hashes = {row.get("config_hash") for row in rows}
        if None in hashes or len(hashes) != 1:
            raise ConfigError(f"{str(path)!r} is missing and the rows of {RUNS_FILE} do not all record one "
                              f"configuration, so the store cannot be checked; restore {STORE_FILE} from a copy "
                              f"or start a new comparison with --out")
        (rows_hash,) = hashes
        raw = safe_yaml.read(self.config_path, "config", saved=True)
        if not isinstance(raw, dict) or config_hash(raw) != rows_hash:
            raise ConfigError(f"{str(path)!r} is missing and {str(self.config_path)!r} is not the configuration "
                              f"the runs in {RUNS_FILE} were made with (their hash {rows_hash}); restore both "
                              f"files from a copy or start a new comparison with --out")
        return {"format": 1, "config_hash": rows_hash, "config": config_identity(raw)}

    @property
    def config_hash(self) -> str | None:
        """The hash of what the store's runs compute (None for directories older than store.json)."""
        info = self._store_info()
        return None if info is None else info["config_hash"]

    def check_config_unchanged(self) -> None:
        """Refuse a config.yaml edited after creation in a way that changes what runs compute, and rows
        written under another configuration: one line naming the changed keys."""
        info = self._store_info()
        if info is None:
            return
        raw = safe_yaml.read(self.config_path, "config", saved=True)
        if not isinstance(raw, dict):
            raise ConfigError(f"{str(self.config_path)!r} is not a config written by `normkit compare` (not a "
                              f"mapping of keys to values); restore it")
        if config_hash(raw) != info["config_hash"]:
            now, then = config_identity(raw), info["config"]
            changed = [f"{k}: {short_repr(then.get(k), 30)} -> {short_repr(now.get(k), 30)}"
                       for k in sorted(set(now) | set(then)) if _as_json(now.get(k)) != _as_json(then.get(k))]
            raise ConfigError(f"{str(self.config_path)!r} was edited after the store was created "
                              f"({'; '.join(changed) or 'values changed'}); its runs were made with the original "
                              f"values, so restore them (listed in {STORE_FILE}) or start a new comparison")
        other = sorted({row["config_hash"] for row in self.rows() if row.get("config_hash") not in
                        (None, info["config_hash"])})
        if other:
            raise ConfigError(f"{str(self.path / RUNS_FILE)!r} holds runs of another configuration (hash "
                              f"{other[0]}, this store's is {info['config_hash']}); keep each configuration in "
                              f"its own directory and merge them with `normkit report`")

    # -- several writers -----------------------------------------------------------------------

    def claim(self, run_id: RunId, wait: bool = False) -> contextlib.AbstractContextManager[bool]:
        """Hold `run_id`'s lock for a block: True when this process may train it, False when another
        process holds it (with `wait`, blocks until it is free). Check `finished()` after claiming."""
        return locks.try_exclusive(self._lock_path(f"{run_id.slug()}.lock"), wait=wait)

    def environment_lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold environment.json's lock for a read-modify-write (two resumes at once each record theirs)."""
        return locks.exclusive(self._lock_path("environment.lock"))

    def _lock_path(self, name: str) -> Path:
        """locks/<name>, checked for symbolic links at every level (the lock file is opened for writing)."""
        refuse_symlinks(self.path)
        return refuse_links(self.path, make_dirs(self.path, self.path / LOCKS_DIR) / name)

    def checkpoint_path(self, run_id: RunId) -> Path:
        """Where `run_id`'s last finished epoch is saved while it trains."""
        return self.path / CHECKPOINTS_DIR / f"{run_id.slug()}.pt"

    def run_dir(self, run_id: RunId) -> Path:
        """runs/<slug>/: a directory of the run's own files (a program's logs and checkpoints), kept
        between attempts; created by the trainers that use it."""
        return self.path / RUN_DIRS / run_id.slug()

    def weights_path(self, run_id: RunId) -> Path:
        """Where `--keep-checkpoints` keeps `run_id`'s final weights."""
        return self.path / CHECKPOINTS_DIR / f"{run_id.slug()}.final.pt"

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    def write_environment(self, environment: dict[str, Any]) -> None:
        refuse_symlinks(self.path)
        atomic_write_text(self.path / ENVIRONMENT_FILE, json_text(environment))

    def environment(self) -> dict[str, Any] | None:
        """environment.json as a mapping (None when absent); a damaged file raises one ConfigError."""
        path = self.path / ENVIRONMENT_FILE
        if not path.is_file():
            return None
        try:
            env = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"{str(path)!r} is not UTF-8 text (binary data?); restore it or delete it") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{str(path)!r} line {exc.lineno} is not valid JSON ({exc.msg}); restore it "
                              f"or delete it") from None
        except RecursionError:
            raise ConfigError(f"{str(path)!r} nests too deeply; restore it or delete it") from None
        if not isinstance(env, dict):
            raise ConfigError(f"{str(path)!r} holds a JSON {type(env).__name__}, not an object; restore it "
                              f"or delete it")
        return env

    def append_run(self, result: RunResult, env: dict[str, Any]) -> None:
        """Append a finished run's rows in one write, then flush and fsync."""
        self.append_rows(run_rows(result, env, self.config_hash))

    def append_rows(self, rows: list[dict[str, Any]]) -> None:
        """Append rows under the store-wide lock, so concurrent writers never interleave or tear lines."""
        runs_path = self.path / RUNS_FILE
        refuse_symlinks(self.path)
        text = "".join(json.dumps(_finite(row)) + "\n" for row in rows)
        with locks.exclusive(self._lock_path("runs.lock")):
            self._drop_torn_tail(runs_path)
            fd = os.open(runs_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                with os.fdopen(fd, "a", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:  # a full disk: a torn line is cut by the next append; the file is named
                raise OSError(exc.errno, exc.strerror or str(exc), str(runs_path)) from None

    @staticmethod
    def _drop_torn_tail(path: Path) -> None:
        """Cut a half-written last line (a crash inside a write) so the next row starts clean."""
        if not path.exists():
            return
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def rows(self) -> list[dict[str, Any]]:
        """Every complete row of runs.jsonl, each checked by `check_row` (a torn last line is ignored)."""
        path = self.path / RUNS_FILE
        refuse_symlinks(self.path)
        if not path.exists():
            return []
        rows = []
        for number, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
            if not line.endswith(b"\n"):
                break
            where = f"{path!s}:{number}"
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(f"{where} is not UTF-8 text (binary data?); the file was edited or "
                                  f"damaged, so fix or remove that line") from None
            try:
                row = json.loads(text)
            except (json.JSONDecodeError, RecursionError):
                raise ConfigError(f"{where} is not a JSON row; the file was edited or "
                                  f"damaged, so fix or remove that line") from None
            rows.append(check_row(row, where))
        return rows

    def runs(self) -> list[RunResult]:
        return rows_to_runs(self.rows())

    def finished(self) -> set[RunId]:
        """Identities of runs that ended ok or diverged; failed runs are not finished (resume retries them)."""
        return {RunId.of_run(run) for run in self.runs() if run.status != "failed"}

    def write_tuning(self, table: list[dict[str, Any]]) -> None:
        """tuning.json: one row per (cell, norm, candidate) with its mean val accuracy and the choice."""
        refuse_symlinks(self.path)
        atomic_write_text(self.path / TUNING_FILE, json_text(table))

    def write_summary(self, rows: list[dict[str, Any]]) -> None:
        """summary.json (list of per-norm rows) and summary.csv (same rows, flat)."""
        refuse_symlinks(self.path)
        atomic_write_text(self.path / SUMMARY_JSON, json_text(rows))
        atomic_write_text(self.path / SUMMARY_CSV, csv_text(rows))


def csv_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(_finite(rows))
    return buf.getvalue()
