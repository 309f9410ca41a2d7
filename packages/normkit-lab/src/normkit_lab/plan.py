"""What a comparison runs: run identities, the tuning and comparison plans, and epoch selection.

A run is identified by its norm spec text, seed, phase (`tune` or `compare`), cell (the swept
training values) and tuned values (on `tune` runs the candidate tried, on `compare` runs the
value chosen by tuning). `RunId.key()` is the one identity used everywhere: resume skips the
identities already in runs.jsonl, and a results store can be keyed by it.

    tune_plan(cfg)                  # every (cell, tune seed, norm, candidate): phase "tune"
    chosen = choose(cfg, runs)      # per (cell, norm): the candidate with the best val metric
    compare_plan(cfg, chosen)       # every (cell, seed, norm) at its chosen values: phase "compare"

Nothing here reads a test metric: selection and tuning see validation only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normkit_lab.training import EpochRecord, RunResult, TrainConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from normkit_lab.config import CompareConfig

    Score = Callable[[CompareConfig, RunResult | None, "RunId"], float]

PHASES = ("tune", "compare")
SELECTIONS = ("final", "best-val")

# Config keys that change where or how fast runs execute, not what they compute: they may change on
# resume and differ between merged directories.
RUNTIME_KEYS = frozenset({"device", "data_dir", "download", "num_workers", "diagnostics", "timeout"})
# Keys that choose which runs exist and how they are summarized; each run's own identity (norm, seed,
# cell, tuned) says where it belongs, so they are not part of the config hash either.
PLAN_KEYS = frozenset({"norms", "seeds", "baseline", "select", "metric", "margin"})
# cpu_threads is resolved per machine and split between parallel jobs; it changes speed, not results
# beyond float rounding, and is recorded in every row (`threads`).
# command_dir: where a --command runs (an absolute path, so a copied store still compares equal).
_UNHASHED = RUNTIME_KEYS | PLAN_KEYS | {"cpu_threads", "command_dir"}


def config_identity(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config.yaml mapping that decides what every run computes (model, data, epochs, ...)."""
    return {k: v for k, v in sorted(config.items()) if k not in _UNHASHED}


def config_hash(config: dict[str, Any]) -> str:
    """A short stable hash of `config_identity(config)`: part of every run's identity in a store."""
    text = json.dumps(config_identity(config), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _frozen(values: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
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
        return cls(norm, seed, phase, _frozen(cell), _frozen(tuned))

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
        """`base` with this run's cell and tuned values applied."""
        return dataclasses.replace(base, **dict(self.cell), **dict(self.tuned))


def grid(values: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of `values` (key -> list), in the order given; [{}] for no keys."""
    keys = list(values)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(values[k] for k in keys))]


def tune_plan(cfg: CompareConfig) -> list[RunId]:
    """The tuning runs: each cell, tune seed, norm and candidate (none without `tune`)."""
    if not cfg.tune:
        return []
    return [RunId.of(norm, seed, "tune", cell, candidate) for cell in grid(cfg.sweep)
            for seed in cfg.tune_seeds for norm in cfg.norms for candidate in grid(cfg.tune)]


def compare_plan(cfg: CompareConfig, chosen: dict[tuple[Any, str], dict[str, Any]] | None = None) -> list[RunId]:
    """The comparison runs, seed-major within each cell so an interruption keeps full pairs.

    `chosen` maps (frozen cell, norm) to the tuned values (from `choose`); required with `tune`.
    """
    if cfg.tune and chosen is None:
        raise ValueError("compare_plan needs the values chosen by tuning")
    chosen = chosen or {}
    return [RunId.of(norm, seed, "compare", cell, chosen.get((_frozen(cell), norm)))
            for cell in grid(cfg.sweep) for seed in cfg.seeds for norm in cfg.norms]


def run_count(cfg: CompareConfig) -> tuple[int, int]:
    """(tuning runs, comparison runs): the cost, known before anything runs."""
    return len(tune_plan(cfg)), len(grid(cfg.sweep)) * len(cfg.seeds) * len(cfg.norms)


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


def val_accuracy_score(cfg: CompareConfig, run: RunResult | None, run_id: RunId) -> float:
    """A tuning run's val accuracy at the selected epoch; -inf when it diverged or is incomplete (the
    built-in trainer's score; other trainers pass their own to `choose`)."""
    epochs = run_id.train_config(cfg.train).epochs
    if run is None or run.status != "ok" or len(run.epochs) < epochs:
        return -math.inf
    record = selected_epoch(run.epochs, cfg.select)
    return record.val_acc if record is not None else -math.inf


def choose(cfg: CompareConfig, runs: list[RunResult], score: Score | None = None,
           column: tuple[str, float] | None = None) -> tuple[dict[tuple[Any, str], dict[str, Any]],
                                                              list[dict[str, Any]]]:
    """Per (cell, norm), the candidate with the best mean val accuracy over the tune seeds (`score`:
    a trainer's own validation score of a run, higher is better; default the built-in one; `column`:
    then the table's (field name, sign that turns the score back into that field's value)).

    Returns (chosen, table): `chosen[(frozen cell, norm)]` = values; `table` one row per cell,
    norm and candidate with the mean val accuracy, its runs and whether it was chosen (the
    tuning.json content). A candidate with a diverged tuning run scores -inf (null in JSON).
    """
    by_id = {RunId.of_run(r): r for r in runs if r.phase == "tune"}
    chosen: dict[tuple[Any, str], dict[str, Any]] = {}
    table: list[dict[str, Any]] = []
    for cell in grid(cfg.sweep):
        for norm in cfg.norms:
            rows = []
            for candidate in grid(cfg.tune):
                ids = [RunId.of(norm, seed, "tune", cell, candidate) for seed in cfg.tune_seeds]
                scores = [(score or val_accuracy_score)(cfg, by_id.get(run_id), run_id) for run_id in ids]
                mean = sum(scores) / len(scores)
                row = {"cell": cell, "norm": norm, "values": candidate, "val_acc": mean,
                       "seeds": list(cfg.tune_seeds), "chosen": False}
                if column is not None:
                    row = {"cell": cell, "norm": norm, "values": candidate, "score_field": column[0],
                           column[0]: column[1] * mean if math.isfinite(mean) else None, "score": mean,
                           "seeds": list(cfg.tune_seeds), "chosen": False}
                rows.append(row)
            best = max(range(len(rows)), key=lambda i: rows[i]["score" if column is not None else "val_acc"])
            rows[best]["chosen"] = True
            chosen[(_frozen(cell), norm)] = rows[best]["values"]
            table += rows
    return chosen, table
