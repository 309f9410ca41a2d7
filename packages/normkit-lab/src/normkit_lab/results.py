"""A comparison's results directory: what is written, how, and how it is read back.

    config.yaml       the resolved config (loadable with --config / --resume)
    runs.jsonl        one row per run and epoch, long format: the run's identity (norm, seed, phase,
                      cell, tuned), status, params, threads, the epoch's metrics, environment columns
    tuning.json       with --tune: every candidate's mean val accuracy per (cell, norm), and the choice
    summary.csv/json  one row per norm (a view of runs.jsonl, rewritten after every run)
    environment.json  versions, device, CPU, threads, git commit

Every file is written atomically (temporary file + os.replace). A run's rows are appended to
runs.jsonl in one write followed by fsync once the run has finished, so an interrupted comparison
keeps exactly its finished runs. A run that diverged before its first epoch ended still gets
one row, with `epoch` null, so resume knows it finished.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from normkit_lab.errors import ConfigError
from normkit_lab.plan import RunId
from normkit_lab.training import EpochRecord, RunResult

CONFIG_FILE = "config.yaml"
RUNS_FILE = "runs.jsonl"
SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
ENVIRONMENT_FILE = "environment.json"
TUNING_FILE = "tuning.json"


@contextlib.contextmanager
def atomic_replace_from(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one step."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never half of one."""
    with atomic_replace_from(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


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
    except OSError as exc:
        raise ConfigError(f"cannot create results directory {str(candidate)!r}: {exc.strerror or exc}; "
                          f"choose another --out") from None


def epoch_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(EpochRecord)]


def run_rows(result: RunResult, env: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs.jsonl rows of one finished run (the last carries the callbacks' extras, if any)."""
    head = {**RunId.of_run(result).fields(), "status": result.status, "params": result.params,
            "threads": result.threads}
    records = [dataclasses.asdict(r) for r in result.epochs] or [dict.fromkeys(epoch_fields())]
    rows = [{**head, **record, **env} for record in records]
    if result.extras:
        rows[-1]["extras"] = result.extras
    return rows


def rows_to_runs(rows: Iterable[dict[str, Any]]) -> list[RunResult]:
    """Group runs.jsonl rows back into RunResults (by run identity), in the order runs finished."""
    fields = epoch_fields()
    grouped: dict[RunId, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(RunId.of_row(row), []).append(row)
    runs = []
    for run_id, group in grouped.items():
        epochs = [EpochRecord(**{k: row.get(k) for k in fields})
                  for row in group if row.get("epoch") is not None]
        extras: dict[str, Any] = {}
        for row in group:
            extras.update(row.get("extras") or {})
        runs.append(RunResult(norm=run_id.norm, seed=run_id.seed, status=group[-1]["status"], epochs=epochs,
                              params=group[-1]["params"], extras=extras, threads=group[-1].get("threads"),
                              phase=run_id.phase, cell=dict(run_id.cell), tuned=dict(run_id.tuned)))
    return runs


class ResultsDir:
    """One results directory; created fresh by `create`, reopened (for resume/report) by `open`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, out: str | Path | None, config_yaml: str, environment: dict[str, Any],
               kind: str = "compare") -> ResultsDir:
        store = cls(new_results_dir(out, kind))
        atomic_write_text(store.path / CONFIG_FILE, config_yaml)
        store.write_environment(environment)
        return store

    @classmethod
    def open(cls, path: str | Path) -> ResultsDir:
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            what = "does not exist" if not path.exists() else f"has no {CONFIG_FILE}"
            raise ConfigError(f"{str(path)!r} {what}; give a directory written by `normkit compare`")
        return cls(path)

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    def write_environment(self, environment: dict[str, Any]) -> None:
        atomic_write_text(self.path / ENVIRONMENT_FILE, json_text(environment))

    def append_run(self, result: RunResult, env: dict[str, Any]) -> None:
        """Append a finished run's rows in one write, then flush and fsync."""
        self.append_rows(run_rows(result, env))

    def append_rows(self, rows: list[dict[str, Any]]) -> None:
        runs_path = self.path / RUNS_FILE
        self._drop_torn_tail(runs_path)
        text = "".join(json.dumps(_finite(row)) + "\n" for row in rows)
        with runs_path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

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
        """Every complete row of runs.jsonl (a torn last line is ignored)."""
        path = self.path / RUNS_FILE
        if not path.exists():
            return []
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(keepends=True), 1):
            if not line.endswith("\n"):
                break
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(f"{path!s}:{number} is not a JSON row; the file was edited or "
                                  f"damaged, so fix or remove that line") from None
        return rows

    def runs(self) -> list[RunResult]:
        return rows_to_runs(self.rows())

    def finished(self) -> set[RunId]:
        """The identities of the runs saved here (resume skips them)."""
        return {RunId.of_row(row) for row in self.rows()}

    def write_tuning(self, table: list[dict[str, Any]]) -> None:
        """tuning.json: one row per (cell, norm, candidate) with its mean val accuracy and the choice."""
        atomic_write_text(self.path / TUNING_FILE, json_text(table))

    def write_summary(self, rows: list[dict[str, Any]]) -> None:
        """summary.json (list of per-norm rows) and summary.csv (same rows, flat)."""
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
