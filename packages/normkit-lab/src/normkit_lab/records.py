"""Which run and what it measured: `RunId` (a run's identity), `RunResult` and `EpochRecord`, and the
config hash that ties a run to the configuration it ran under.

Plain data at the bottom of the lab, passed upward: trainers return RunResults (`normkit_lab.runs`),
the store writes and reads them as runs.jsonl rows (`normkit_lab.store`), the study plans RunIds
(`normkit_lab.study.plan`) and the analysis summarizes the rows (`normkit_lab.analysis`).

A run is identified by its norm spec text, seed, phase (`tune` or `compare`), cell (the swept
training values) and tuned values (on `tune` runs the candidate tried, on `compare` runs the
value chosen by tuning). `RunId.key()` is the one identity used everywhere: resume skips the
identities already in runs.jsonl, and a results store can be keyed by it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import normkit
from normkit_lab.errors import one_line
from normkit_lab.spec import TrainConfig

PHASES = ("tune", "compare")
# extras key of a run recorded as the same run as one trained in another norm_batch cell (study/twins.py)
SAME_RUN = "same_run"
SELECTIONS = ("final", "best-val")

# Config keys that change where or how fast runs execute, not what they compute: they may change on
# resume and differ between merged directories.
RUNTIME_KEYS = frozenset({"device", "data_dir", "download", "num_workers", "diagnostics", "timeout"})
# Keys that choose which runs exist and how they are summarized; each run's own identity (norm, seed,
# cell, tuned) says where it belongs, so they are not part of the config hash either.
PLAN_KEYS = frozenset({"norms", "seeds", "baseline", "select", "metric", "margin", "ablate"})
# cpu_threads is resolved per machine and split between parallel jobs; it changes speed, not results
# beyond float rounding, and is recorded in every row (`threads`).
# command_dir: where a --command runs (an absolute path, so a copied store still compares equal).
_UNHASHED = RUNTIME_KEYS | PLAN_KEYS | {"cpu_threads", "command_dir"}
# Keys added after stores existed: unset, they leave the hash of an older store's config unchanged.
_NEWER_OPTIONAL = frozenset({"norm_batch"})


def config_identity(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config.yaml mapping that decides what every run computes (model, data, epochs, ...)."""
    return {k: v for k, v in sorted(config.items())
            if k not in _UNHASHED and not (k in _NEWER_OPTIONAL and v is None)}


def config_hash(config: dict[str, Any]) -> str:
    """A short stable hash of `config_identity(config)`: part of every run's identity in a store."""
    text = json.dumps(config_identity(config), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def frozen(values: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """A mapping as the sorted (key, value) pairs `RunId` holds its cell and tuned values in (hashable)."""
    return tuple(sorted((values or {}).items()))


@dataclass(frozen=True)
class RunId:
    """The identity of one run (hashable; `cell` and `tuned` are sorted (key, value) pairs)."""

    norm: str
    seed: int
    phase: str = "compare"
    cell: tuple[tuple[str, Any], ...] = ()
    tuned: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, norm: str, seed: int, phase: str = "compare", cell: dict[str, Any] | None = None,
           tuned: dict[str, Any] | None = None) -> RunId:
        return cls(norm, seed, phase, frozen(cell), frozen(tuned))

    @classmethod
    def of_run(cls, run: RunResult) -> RunId:
        return cls.of(run.norm, run.seed, run.phase, run.cell, run.tuned)

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> RunId:
        """The identity of a runs.jsonl row (rows written before phases existed are `compare`)."""
        return cls.of(row["norm"], row["seed"], row.get("phase") or "compare", row.get("cell"), row.get("tuned"))

    def key(self) -> str:
        """A stable text key: the same run always gives the same key."""
        return json.dumps(self.fields(), sort_keys=True)

    def slug(self) -> str:
        """A file-name-safe, unique name for this run's files (checkpoints, metrics), e.g.
        `compare-gn-pn-s0-3f2a9c01d4`: readable prefix, hash of the whole identity."""
        readable = re.sub(r"[^A-Za-z0-9._]+", "-", self.norm).strip("-.")[:40] or "norm"
        digest = hashlib.sha256(self.key().encode()).hexdigest()[:10]
        return f"{self.phase}-{readable}-s{self.seed}-{digest}"

    def label(self) -> str:
        """How progress lines name the run: `bn seed 0`, plus its cell and tuned values when it has them."""
        extra = ", ".join(f"{k}={v}" for k, v in (*self.cell, *self.tuned))
        return f"{self.norm} seed {self.seed}" + (f" [{extra}]" if extra else "")

    def fields(self) -> dict[str, Any]:
        """The identity as runs.jsonl columns."""
        return {"norm": self.norm, "seed": self.seed, "phase": self.phase, "cell": dict(self.cell),
                "tuned": dict(self.tuned)}

    def train_config(self, base: TrainConfig) -> TrainConfig:
        """`base` with this run's cell and tuned values applied; a swept model parameter (e.g. `placement`)
        goes into `model_params`."""
        values = {**dict(self.cell), **dict(self.tuned)}
        fields = {f.name for f in dataclasses.fields(base)}
        of_model = {k: v for k, v in values.items() if k not in fields}
        train = {k: v for k, v in values.items() if k in fields}
        if of_model:
            train["model_params"] = {**base.model_params, **of_model}
        return dataclasses.replace(base, **train)


@dataclass
class EpochRecord:
    """Measurements of one epoch.

    train_loss/train_acc: running means over the epoch's training batches (train mode, with
    label smoothing if set); val_loss/val_acc/val_top5: eval mode, plain cross-entropy, top-5
    only when there are more than 10 classes; test_loss/test_acc: the same on the test split,
    recorded every epoch for reporting and never read by anything that selects. Sequence models
    (logits N,T,V and targets N,T) count every token: losses and accuracies are per token.
    epoch_time_s: wall time of the training pass (data loading, forward, backward, step;
    evaluation excluded); throughput: training targets/s in that time (samples/s for
    classifiers, tokens/s for sequence models); peak_mem_mb: CUDA max_memory_allocated during
    the epoch, or on CPU/MPS the process's peak RSS so far (getrusage); lr: the learning rate at
    the epoch's first step. val_bpb/test_bpb: bits per byte of the val/test loss, for datasets
    that declare `bytes_per_token` in their metadata (byte-level text), else None. steps: the
    optimizer steps taken from the start of the run to the end of this epoch (the last epoch's is
    the run's total; a steps or examples budget may end its last epoch part-way through the data).
    cpu_time_s: the process's CPU time (every thread) during the training pass, which unlike
    epoch_time_s does not grow when other work shares the machine's cores. load_avg and cpu_cores:
    the machine's 1-minute load average at the end of the training pass and the cores this process
    may use, so a report can say when the wall times were measured on a machine busier than its cores.
    """

    epoch: int
    train_loss: float
    train_acc: float
    val_loss: float
    val_acc: float
    val_top5: float | None
    epoch_time_s: float
    throughput: float
    peak_mem_mb: float
    lr: float
    test_loss: float | None = None
    test_acc: float | None = None
    val_bpb: float | None = None
    test_bpb: float | None = None
    steps: int | None = None
    cpu_time_s: float | None = None
    load_avg: float | None = None
    cpu_cores: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RunResult:
    """One run: status "ok", "diverged" (non-finite loss; `epochs` then holds the finished epochs
    and extras["diverged_at"] the epoch and step) or "failed" (an exception while building or
    training; `error` holds its one line, `epochs` is empty), parameter count (None when the
    model was never built), callbacks' results by name, the CPU threads it ran with, and the rest
    of its identity (see `normkit_lab.records.RunId`)."""

    norm: str
    seed: int
    status: str
    epochs: list[EpochRecord]
    params: int | None
    extras: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    threads: int | None = None
    phase: str = "compare"
    cell: dict[str, Any] = field(default_factory=dict)
    tuned: dict[str, Any] = field(default_factory=dict)
    trainer: str = "builtin"  # normkit_lab.runs.trainer.TRAINER_KINDS; other trainers' epochs are ReportedEpochs


def failure_line(norm: str, exc: BaseException) -> str:
    """One line naming the norm and the error, e.g. "gn+pn failed: RuntimeError: shape mismatch"."""
    text = one_line(str(exc)) or "(no message)"
    text = text.removeprefix(f"{norm}: ")  # a StepError already names the spec
    kind = "" if isinstance(exc, normkit.NormkitError) else f"{type(exc).__name__}: "
    return one_line(f"{norm} failed: {kind}{text}")


def failed_run(norm: str, seed: int, exc: BaseException) -> RunResult:
    """The result of a run whose norm raised while building or training (status "failed").

    Recording it, instead of stopping, lets the comparison's other runs go on; resume retries it.
    """
    return RunResult(norm=normkit.parse(norm).text, seed=seed, status="failed", epochs=[], params=None,
                     error=failure_line(norm, exc))


def selected_epoch(epochs: list[EpochRecord], select: str) -> EpochRecord | None:
    """The epoch whose metrics a run reports: the final one, or the one with the best val accuracy
    (first on ties). Reads validation only, never test. None when the run has no epochs."""
    if not epochs:
        return None
    if select == "final":
        return epochs[-1]
    if select == "best-val":
        return max(epochs, key=lambda r: r.val_acc)  # max keeps the first of equal values
    raise ValueError(f"select must be one of {', '.join(SELECTIONS)}, not {select!r}")
