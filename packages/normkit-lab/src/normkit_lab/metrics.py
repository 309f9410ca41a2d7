"""The primary metric of a comparison: which EpochRecord field, in what unit, and which way is better.

Verdicts are direction-aware: a difference counts as "better" when it moves the metric in its good
direction. The value of a run is the metric at the final epoch (`select: final`) or at the epoch
with the best validation counterpart (`select: best-val`); never the best test value, since picking
the best of many test evaluations is itself a selection on test data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normkit.errors import did_you_mean
from normkit_lab.errors import ConfigError

SELECTS = ("final", "best-val")


@dataclass(frozen=True)
class Metric:
    """A metric read from every epoch's record.

    field: the record key (`test_acc`); scale: factor to the reported unit (fraction -> percent);
    low/high: the valid range in that unit (plots clip intervals to it); select_by: the validation
    field that picks the epoch under `select: best-val`; fallback: the field used, with a note, when
    results predate the test split; default_margin: the equivalence margin when `margin` is null.
    """

    field: str
    label: str
    unit: str
    higher_is_better: bool
    scale: float
    low: float | None
    high: float | None
    select_by: str
    fallback: str | None
    default_margin: float
    reads: str | None = None  # a derived metric: the record field it averages (`field` is then its name)
    last: int = 1  # a derived metric: the mean of `reads` over the last `last` epochs

    @property
    def derived(self) -> bool:
        return self.reads is not None

    @property
    def sign(self) -> float:
        """+1 when higher is better, else -1: multiplies differences so that positive = better."""
        return 1.0 if self.higher_is_better else -1.0

    def clip(self, value: float) -> float:
        """`value` limited to the metric's valid range."""
        if self.low is not None:
            value = max(self.low, value)
        if self.high is not None:
            value = min(self.high, value)
        return value


_ACC = {"unit": "%", "higher_is_better": True, "scale": 100.0, "low": 0.0, "high": 100.0,
        "select_by": "val_acc", "default_margin": 0.5}
_LOSS = {"unit": "nats", "higher_is_better": False, "scale": 1.0, "low": 0.0, "high": None,
         "select_by": "val_loss", "default_margin": 0.01}

# Bits per byte of a byte-level language model (lower is better). The default margin, 0.05 bits/byte,
# is about 2% of the ~2.37 bits/byte gpt-tiny reaches on pysrc in its streamed CPU recipe, well below
# its gap to the trigram table (~0.3), and about what five seeds resolve (docs/reproduce.md).
_BPB = {"unit": "bits/byte", "higher_is_better": False, "scale": 1.0, "low": 0.0, "high": None,
        "select_by": "val_bpb", "default_margin": 0.05}
LAST_EPOCHS = 3  # the *_last3 metrics: a mean over the last epochs, smoothing the end of training

METRICS: dict[str, Metric] = {
    "test_acc": Metric("test_acc", "test accuracy", fallback="val_acc", **_ACC),
    "test_loss": Metric("test_loss", "test loss", fallback="val_loss", **_LOSS),
    "val_acc": Metric("val_acc", "validation accuracy", fallback=None, **_ACC),
    "val_loss": Metric("val_loss", "validation loss", fallback=None, **_LOSS),
    "test_bpb": Metric("test_bpb", "test bits per byte", fallback="val_bpb", **_BPB),
    "val_bpb": Metric("val_bpb", "validation bits per byte", fallback=None, **_BPB),
    "test_bpb_last3": Metric("test_bpb_last3", f"test bits per byte, mean of the last {LAST_EPOCHS} epochs",
                             fallback=None, reads="test_bpb", last=LAST_EPOCHS, **_BPB),
    "val_bpb_last3": Metric("val_bpb_last3", f"validation bits per byte, mean of the last {LAST_EPOCHS} epochs",
                            fallback=None, reads="val_bpb", last=LAST_EPOCHS, **_BPB),
}
DEFAULT_METRIC = "test_acc"


DIRECTIONS = {"max": True, "min": False}
PERCENT = "percent"  # `test_acc:percent`: the program reports its accuracies in percent


def reports_percent(name: str) -> bool:
    """True for `ACC:percent`: the training program reports accuracies in percent (timm's train.py does).
    Said once for the whole comparison and recorded with the metric in config.yaml; every reported
    accuracy of every run is then divided by 100 as it is recorded, so runs.jsonl holds fractions as for
    normkit's own runs, and tables, margins and the MDE are in percent points, the program's own unit."""
    return isinstance(name, str) and name.partition(":")[2].strip() == PERCENT


def metric_named(name: str) -> Metric:
    """The metric `name`: a registered one (`test_acc`), or one a training program reports, named with
    its direction (`f1:max`, `test_wer:min`; values used as reported, scale 1, no default margin).
    A registered name may carry its own direction (`test_loss:min`), an accuracy the scale its program
    reports it in (`test_acc:percent`, see `reports_percent`). ConfigError otherwise."""
    if not isinstance(name, str):
        raise ConfigError(f"metric must be a name such as test_acc or f1:max, not {name!r}")
    field, sep, direction = name.partition(":")
    field = field.strip()
    if direction.strip() == PERCENT:
        if field not in METRICS or METRICS[field].unit != "%":
            raise ConfigError(f"metric {name!r}: only the accuracies normkit knows "
                              f"({', '.join(k for k, m in METRICS.items() if m.unit == '%')}) take :percent")
        return METRICS[field]
    if sep and direction.strip() not in DIRECTIONS:
        raise ConfigError(f"metric {name!r} must end in :max (higher is better) or :min (lower is better)")
    if field in METRICS:
        known = METRICS[field]
        if sep and DIRECTIONS[direction.strip()] != known.higher_is_better:
            better = "higher" if known.higher_is_better else "lower"
            raise ConfigError(f"metric {name!r}: {field} is one normkit knows, and {better} is better; drop the "
                              f":{direction.strip()}")
        return known
    if not sep:
        raise ConfigError(f"unknown metric {name!r}{did_you_mean(name, list(METRICS))}; choose one of "
                          f"{', '.join(METRICS)}, or name your program's own metric with its direction, "
                          f"e.g. {field}:max (--higher-is-better) or {field}:min (--lower-is-better)")
    if not field.isidentifier():
        raise ConfigError(f"metric {name!r}: {field!r} is not a metric name (an identifier like test_f1)")
    select_by = "val_" + field[len("test_"):] if field.startswith("test_") else field
    return Metric(field=field, label=field.replace("_", " "), unit="", higher_is_better=DIRECTIONS[direction.strip()],
                  scale=1.0, low=None, high=None, select_by=select_by, fallback=None, default_margin=math.nan)


def metric_spec(name: str) -> str:
    """How config.yaml records `name`: a registered metric by its name, another with its direction."""
    metric = metric_named(name)
    if reports_percent(name):
        return f"{metric.field}:{PERCENT}"
    if metric.field in METRICS:
        return metric.field
    return f"{metric.field}:{'max' if metric.higher_is_better else 'min'}"


def needs_margin(metric: Metric) -> bool:
    """True for a program's own metric: normkit does not know its unit, so the margin must be given."""
    return not math.isfinite(metric.default_margin)


def split_metrics(value: str) -> list[str]:
    """`test_acc,test_loss` -> the metrics' specs in order, each checked (ConfigError, one line, for an
    unknown one or one named twice)."""
    names = [part.strip() for part in str(value).split(",")]
    if not all(names):
        raise ConfigError(f"--metric {value!r} has an empty name; write metrics separated by commas, e.g. "
                          f"test_acc,test_loss")
    specs = [metric_spec(name) for name in names]
    fields = [metric_named(spec).field for spec in specs]
    repeated = sorted({f for f in fields if fields.count(f) > 1})
    if repeated:
        raise ConfigError(f"--metric {value!r} names {', '.join(repeated)} twice; name each metric once")
    return specs


def margin_for(name: str) -> float:
    """A further metric's margin: its own default (a program's own metric has none, so it can only be
    read as the first metric, whose margin --margin gives)."""
    metric = metric_named(name)
    if needs_margin(metric):
        raise ConfigError(f"metric {metric.field} is your program's own, so normkit does not know its unit and "
                          f"its margin: read it as the first --metric, with --margin in its unit")
    return metric.default_margin


def metric_list(value: str) -> list[str]:
    """The metrics of `--metric a,b,...` (or `metric: a,b` in a config file), checked: the first is the
    comparison's metric (tuning and selection use it, `--margin` is in its unit), the others are read from
    the same runs at their own default margins, one Holm family across all (analysis.metric_family)."""
    first, *others = split_metrics(value)
    for name in others:
        margin_for(name)
    return [first, *others]


def margin_of(config: Mapping[str, Any], metric: Metric) -> float:
    """The equivalence margin in the metric's unit: config `margin`, or the metric's default."""
    value = config.get("margin")
    if value is None:
        if needs_margin(metric):
            raise ConfigError(f"metric {metric.field} is your program's own, so normkit does not know its unit: "
                              f"give the equivalence margin in it, e.g. --margin 0.01")
        return metric.default_margin
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"margin must be a number > 0 in the metric's unit, not {value!r}")
    return float(value)


def select_of(config: Mapping[str, Any]) -> str:
    """The epoch selection rule: config `select`, `final` by default."""
    value = config.get("select") or "final"
    if value not in SELECTS:
        raise ConfigError(f"select must be one of {', '.join(SELECTS)}, not {value!r}")
    return str(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def selected_epoch(epochs: Sequence[Mapping[str, Any]], metric: Metric, select: str,
                   field: str | None = None) -> Mapping[str, Any] | None:
    """The epoch record whose value is reported: the last one, or the best on `metric.select_by`
    (earliest on ties). `field` is the field that must be present (default: the metric's)."""
    field = field or metric.field
    usable = [e for e in epochs if _finite(e.get(field))]
    if not usable:
        return None
    if select == "final":
        last = epochs[-1]
        return last if _finite(last.get(field)) else None
    scored = [e for e in usable if _finite(e.get(metric.select_by))]
    if not scored:
        return None
    key = metric.sign
    return max(scored, key=lambda e: key * e[metric.select_by])


def run_value(epochs: Sequence[Mapping[str, Any]], metric: Metric, select: str,
              field: str | None = None) -> float | None:
    """A run's primary value in the metric's unit (None when the selected epoch lacks it).

    A derived metric (`reads`, `last`) is the mean of its field over the run's last `last` epochs
    (fewer when the run has fewer), whatever `select` says: it selects nothing.
    """
    if metric.derived and field in (None, metric.field):
        tail = [e.get(metric.reads) for e in epochs[-metric.last:]]
        if not tail or not all(_finite(v) for v in tail):
            return None
        return metric.scale * sum(float(v) for v in tail) / len(tail)
    field = field or metric.field
    record = selected_epoch(epochs, metric, select, field)
    return None if record is None else metric.scale * float(record[field])
