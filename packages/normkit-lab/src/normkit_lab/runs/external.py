"""What the command and function trainers share: metric records reported by the user's code, how a
run of them is scored for tuning, and the checks their configuration needs.

Their records are `reporting.ReportedEpoch`s, saved as they arrive to `metrics.jsonl` in the run's
directory. A run that is started again after an interruption keeps the records of earlier attempts
for the epochs the new attempt has not reported (a program that resumes itself from `{run_dir}`
reports only its remaining epochs); an epoch reported again replaces the earlier record and every
later one (a program that starts over reports epoch 0 again).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normkit_lab.errors import ConfigError
from normkit_lab.reporting import FRACTIONS, ReportedEpoch, ReportError, check_record

if TYPE_CHECKING:
    from normkit_lab.records import RunId, RunResult
    from normkit_lab.spec import CompareConfig, TrainConfig

METRICS_FILE = "metrics.jsonl"


def record_or_check_code(cfg: CompareConfig, now: dict[str, str], what: str) -> None:
    """Save the code's file hashes on the first check; on resume refuse (one line) any file whose hash
    changed, since the saved runs were made with the code as it was. `what` ends the message's cause."""
    from normkit_lab.runs.template import changed_files

    if cfg.code_files is None:
        cfg.code_files = now
        return
    changed = changed_files(cfg.code_files, now)
    if changed:
        raise ConfigError(f"{', '.join(changed)} changed since this comparison started (its runs were made "
                          f"{what}); restore it, or start a new comparison")


def check_external(cfg: CompareConfig) -> None:
    """What every non-built-in trainer needs of the config: a metric it can read, and a selection it can make."""
    from normkit_lab.metrics import metric_named

    metric = metric_named(cfg.metric)
    if cfg.select == "best-val" and metric.select_by == metric.field and not metric.field.startswith("val_"):
        raise ConfigError(f"select best-val picks the epoch on the validation counterpart of the metric, and "
                          f"{metric.field!r} has none (name it test_X and report val_X too); or use --select final")


class Records:
    """The records of one run: earlier attempts' (from metrics.jsonl) and this attempt's, checked as
    they arrive and appended to the file at once."""

    def __init__(self, run_dir: Path, on_epoch: Callable[[Any], None] | None, loggers: Sequence[Any] = (),
                 percent: bool = False) -> None:
        self.path = run_dir / METRICS_FILE
        self.percent = percent  # accuracies arrive in percent: recorded as fractions (`metrics.reports_percent`)
        self.on_epoch = on_epoch
        self.loggers = list(loggers)  # `runs.loggers` (CSV, TensorBoard): each record at its epoch
        self.earlier = _load(self.path)
        self.current: list[ReportedEpoch] = []
        self.near_miss: str | None = None  # the first output line that looks meant as a report but is not one

    def add(self, values: Any) -> ReportedEpoch:
        """Check and keep one reported mapping (ReportError when it is not a valid record)."""
        previous = self.current[-1].epoch if self.current else None
        record = check_record(values, previous, percent=self.percent)
        if self.percent:
            record.metrics.update({k: v / 100 for k, v in record.metrics.items() if k in FRACTIONS})
        self.current.append(record)
        try:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record.as_dict()) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # a full disk: named, so the one line that stops the comparison says where
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        step = record.metrics.get("step")
        for logger in self.loggers:
            logger.on_reported(record.epoch, record.metrics, step=None if step is None else int(step))
        if self.on_epoch is not None:
            self.on_epoch(record)
        return record

    def require_this_attempt(self, how: str) -> None:
        """ReportError unless this attempt reported an epoch: an attempt that reports nothing cannot be
        told from one that did nothing, so earlier attempts' records alone never make a run ok. `how`
        says what was missing; a near-miss line is pointed at."""
        if self.current:
            return
        n = len(self.earlier)
        earlier = f"; the {n} epoch{'s' if n != 1 else ''} an earlier attempt reported are not enough" if n else ""
        hint = (f"; the line {self.near_miss[:60]!r} is not a report: it must start with `normkit: ` exactly "
                f"(one space), then a JSON object" if self.near_miss else "")
        raise ReportError(f"reported no metrics ({how}){earlier}{hint}")

    def epochs(self) -> list[ReportedEpoch]:
        """Earlier attempts' records before this attempt's first epoch, then this attempt's."""
        if not self.current:
            return list(self.earlier)
        first = self.current[0].epoch
        return [r for r in self.earlier if r.epoch < first] + self.current


def _load(path: Path) -> list[ReportedEpoch]:
    """The records of earlier attempts (each attempt's own checked list; a later attempt's epoch e
    replaces the records from e on)."""
    if not path.is_file():
        return []
    records: list[ReportedEpoch] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            values = json.loads(line)
            record = check_record(values, None)
        except (json.JSONDecodeError, ReportError, RecursionError):
            continue  # a torn last line of a killed attempt
        records = [r for r in records if r.epoch < record.epoch] + [record]
    return records


def require_metric(epochs: list[ReportedEpoch], cfg_metric: str, select: str, percent: bool = False) -> None:
    """ReportError unless the metric (and with best-val its validation field) was reported, and, when the
    comparison reads accuracies in percent, unless some accuracy is above 1 percent: a program whose every
    accuracy is at most 1 reports fractions, which read as percent would make a 10-point gap 0.1 points."""
    from normkit_lab.metrics import metric_named

    metric = metric_named(cfg_metric)
    needed = [metric.field] + ([metric.select_by] if select == "best-val" else [])
    reported = sorted({name for r in epochs for name in r.metrics})
    for name in needed:
        if not any(name in r.metrics for r in epochs):
            raise ReportError(f"never reported {name} (it reported {', '.join(reported) or 'nothing'}); report "
                              f"it, or choose another --metric")
    accuracies = [(value, name, r.epoch) for r in epochs for name, value in r.metrics.items() if name in FRACTIONS]
    if percent and accuracies and max(accuracies)[0] <= 0.01:  # recorded as fractions: reported <= 1
        value, name, epoch = max(accuracies)
        raise ReportError(f"reported every accuracy at most 1 (the largest {name}={100 * value:.6g} at epoch "
                          f"{epoch}), so it reports fractions, not the percent its --metric ...:percent says; "
                          f"drop :percent from --metric")


def tuning_score(cfg: CompareConfig, run: RunResult | None) -> float:
    """The metric's validation field at the selected epoch, signed so that higher is better; -inf for a
    missing or failed run or one that never reported it."""
    from normkit_lab.metrics import metric_named, selected_epoch

    if run is None or run.status != "ok":
        return -math.inf
    metric = metric_named(cfg.metric)
    records = [r.as_dict() for r in run.epochs]
    record = selected_epoch(records, metric, cfg.select, metric.select_by)
    if record is None:
        return -math.inf
    return metric.sign * float(record[metric.select_by])


def plain_config(run_id: RunId, base: TrainConfig) -> TrainConfig:
    """The training values of a run of the user's code: the base ones (device, threads, epochs), as cell
    and tuned values are the program's own keys, passed to it, never applied to normkit's loop."""
    return base
