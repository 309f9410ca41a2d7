"""How a training program reports its metrics to normkit: one line per epoch on stdout,

    normkit: {"epoch": 3, "val_acc": 0.971, "test_acc": 0.968}

one JSON object per line, after the prefix `normkit: `. Any language can print it; Python programs
call `report_metrics(epoch=3, val_acc=0.971, test_acc=0.968)`, which prints the same. Lines
without the prefix are the program's own output (kept in its run directory, never parsed).

This module is imported by users' training scripts, so it imports nothing heavy (no torch).
The checks (`check_record`) are the ones a comparison applies to every reported line: values are
finite numbers, epochs increase, accuracies are fractions as normkit's own trainer records them,
and no metric takes the name of a column of runs.jsonl.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

PREFIX = "normkit: "
# runs.jsonl columns that are not metrics (a run's identity, status and environment)
RESERVED = frozenset({"norm", "seed", "phase", "cell", "tuned", "status", "params", "threads", "config_hash",
                      "error", "extras", "trainer", "host", "torch_version", "device"})
# the accuracies normkit's own trainer records, as fractions in [0, 1]
FRACTIONS = frozenset({"train_acc", "val_acc", "test_acc", "val_top5"})
ACCURACY_ENV = "NORMKIT_ACCURACY"  # "percent" when the comparison reads accuracies in percent
MAX_METRICS = 200  # keys per line
MAX_NAME = 100


class ReportError(ValueError):
    """A reported line that is not a valid record (the run is recorded as failed, with this text)."""


@dataclass
class ReportedEpoch:
    """One epoch as a program reported it: the epoch number and its metrics (finite numbers)."""

    epoch: int
    metrics: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, **self.metrics}

    def get(self, name: str, default: Any = None) -> Any:
        return self.metrics.get(name, default)

    def __getattr__(self, name: str) -> Any:
        """A metric by name (`record.val_acc`); None when the program did not report it, as EpochRecord
        fields are None when not measured."""
        if name.startswith("__") or name in ("epoch", "metrics"):
            raise AttributeError(name)
        return self.__dict__.get("metrics", {}).get(name)


def _finite(value: Any) -> bool:
    """A finite number that a float can hold (an integer beyond float's range is not one)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_record(values: Any, previous: int | None, percent: bool = False) -> ReportedEpoch:
    """The record of one reported mapping, or ReportError naming what is wrong.

    `epoch` (an integer >= 0) defaults to the previous epoch + 1 (0 for the first); epochs must
    increase. Every other key is a metric: a finite number (not a bool), named like an identifier
    of at most MAX_NAME characters, not a RESERVED column; accuracies in FRACTIONS lie in [0, 1]
    (in [0, 100] with `percent`: the comparison said its program reports percent, `--metric test_acc:percent`).
    `params` (an integer >= 0) may be reported as the model's parameter count.
    """
    if not isinstance(values, dict):
        raise ReportError(f"reported a JSON {type(values).__name__}, not an object of metric names to numbers")
    values = dict(values)
    epoch = values.pop("epoch", None)
    if epoch is None:
        epoch = 0 if previous is None else previous + 1
    if not (isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0):
        raise ReportError(f"reported epoch {_short(epoch)}; it must be an integer >= 0")
    if previous is not None and epoch <= previous:
        raise ReportError(f"reported epoch {epoch} after epoch {previous}; epochs must increase")
    if len(values) > MAX_METRICS:
        raise ReportError(f"reported {len(values)} metrics in one line; at most {MAX_METRICS}")
    metrics: dict[str, float] = {}
    for name, value in values.items():
        if not (isinstance(name, str) and name.isidentifier() and len(name) <= MAX_NAME):
            raise ReportError(f"reported a metric named {_short(name)}; names are identifiers like val_acc")
        if name in RESERVED and name != "params":
            raise ReportError(f"reported a metric named {name!r}, a column of runs.jsonl; rename it")
        if not _finite(value):
            raise ReportError(f"reported {name}={_short(value)} at epoch {epoch}; metrics must be finite numbers")
        if name in FRACTIONS and percent and not 0 <= value <= 100:
            raise ReportError(f"reported {name}={value!r} at epoch {epoch}; this comparison reads accuracies in "
                              f"percent, in [0, 100]")
        if name in FRACTIONS and not percent and not 0 <= value <= 1:  # repr: never rounded into [0, 1]
            way_out = (f" (report {value / 100:.10g}), or say the program reports percent: --metric "
                       f"test_acc:percent" if 2 <= value <= 100 else "; report a value in that range")
            raise ReportError(f"reported {name}={value!r} at epoch {epoch}; accuracies are fractions in [0, 1]"
                              f"{way_out}")
        metrics[name] = float(value) if name != "params" else value
    params = metrics.get("params")
    if params is not None and not (isinstance(params, int) and params >= 0):
        raise ReportError(f"reported params={_short(params)}; it must be the parameter count, an integer >= 0")
    return ReportedEpoch(epoch, metrics)


def parse_line(line: str) -> Any:
    """The JSON value after PREFIX on a stdout line; None for any other line; ReportError when the
    text after the prefix is not JSON, or is an object that gives a key twice (JSON keeps the last
    silently, so which value normkit records would be a guess)."""
    text = line.rstrip("\r\n")
    if not text.startswith(PREFIX):
        return None
    try:
        return json.loads(text[len(PREFIX):], object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or an integer of 4,300+ digits
        if isinstance(exc, ReportError):
            raise
        raise ReportError(f"printed {_short(text, 80)}, which is not `normkit: ` followed by one JSON "
                          f"object") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = next((key for key in keys if keys.count(key) > 1), None)
    if repeated is not None:
        raise ReportError(f"reported {repeated!r} twice in one line; report each metric once")
    return dict(pairs)


_NEAR_MISS = re.compile(r"\s*normkit\s*:|\s*NORMKIT\s*:|\s*Normkit\s*:", re.ASCII)


def near_miss(line: str) -> bool:
    """True for a line that looks meant as a report but lacks the exact prefix (`normkit:{...}`,
    ` normkit: {...}`, `Normkit: ...`): such a line is the program's own output, and a run that reports
    nothing else points at it."""
    return not line.startswith(PREFIX) and _NEAR_MISS.match(line) is not None


def _short(value: Any, limit: int = 40) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def report_metrics(epoch: int | None = None, *, file: TextIO | None = None, **metrics: float) -> None:
    """Report one epoch's metrics to `normkit compare --command` (a `normkit: {...}` line on stdout).

    Checked here as normkit checks it, so a bad value fails in the program, at the line that
    reports it: `report_metrics(epoch=3, val_acc=0.971, test_acc=0.968)`. Outside a comparison it
    just prints the line.
    """
    values: dict[str, Any] = dict(metrics) if epoch is None else {"epoch": epoch, **metrics}
    values = {k: (float(v) if hasattr(v, "item") and not isinstance(v, (int, float)) else v)
              for k, v in values.items()}  # numpy / torch scalars
    if epoch is not None and hasattr(epoch, "item"):
        values["epoch"] = int(epoch)
    check_record(values, None, percent=os.environ.get(ACCURACY_ENV) == "percent")
    stream = file or sys.stdout
    print(PREFIX + json.dumps(values), file=stream, flush=True)
