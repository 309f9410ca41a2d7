"""Run the suite: every workload (and with `holdout` each held-out variant) as an ordinary comparison.

    plan = SuitePlan.make(["bn", "gn+pn"], seeds=3, workloads=None, scale="cpu", holdout=False)
    suite = create_suite(plan, out=None)        # runs/<timestamp>-suite with suite.json
    run_suite(suite, executor=...)              # one results directory per task inside it
    suite = open_suite("runs/...-suite")        # --resume: the saved plan; finished runs are skipped

Each task is `normkit compare`'s own path (config -> check -> store -> run_compare) with the
workload's recipe, the norms it can host, the suite's seeds and the workload's tuning budget on
tuning seeds after them, so `normkit report DIR/<task>` reads it and a resume continues it. A norm a
workload cannot host (a batch norm in a causal language model) is left out of that task with its
one-line reason, recorded in suite.json; it counts as a miss in the scores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import normkit
from normkit_lab.analysis.report import write_summary
from normkit_lab.errors import ConfigError, one_line
from normkit_lab.executors import Executor
from normkit_lab.spec import CompareConfig
from normkit_lab.store.results import atomic_write_text, json_text, new_results_dir
from normkit_lab.study import config as lab_config
from normkit_lab.study.compare import check, create_store, open_store, run_compare
from normkit_lab.study.plan import run_count
from normkit_lab.study.progress import Progress
from normkit_lab.suite.workloads import SCALES, Workload, available, load_workload

SUITE_JSON = "suite.json"
DEFAULT_SEEDS = 3  # the fewest pairs that get a verdict; the scorecard's MDE says when more are needed
TUNE_SEEDS = 1  # tuning seeds per candidate: the budget is the workload's candidates x this, alike for every norm


@dataclass(frozen=True)
class Task:
    """One comparison of the suite: a workload, or one of its held-out variants (`variant`)."""

    workload: Workload
    variant: str | None = None

    @property
    def name(self) -> str:
        """The task's directory name: `cnn`, or `cnn@narrow` for a held-out variant."""
        return self.workload.name + (f"@{self.variant}" if self.variant else "")


@dataclass
class SuitePlan:
    """What a suite runs: its norms (the first is every workload's baseline where it runs), comparison
    seeds, workloads, scale and whether held-out variants run; saved as suite.json."""

    norms: list[str]
    seeds: list[int]
    workloads: list[str]
    scale: str = "cpu"
    holdout: bool = False
    runtime: dict[str, Any] = field(default_factory=dict)  # data_dir, device: where, not what, runs compute
    excluded: dict[str, dict[str, str]] = field(default_factory=dict)  # task -> norm -> why it cannot run

    @classmethod
    def make(cls, norms: str | list[str], seeds: Any = DEFAULT_SEEDS, workloads: list[str] | None = None,
             scale: str = "cpu", holdout: bool = False, runtime: dict[str, Any] | None = None) -> SuitePlan:
        """A checked plan: norms and seeds as `normkit compare` reads them, workloads by name (None: all)."""
        if scale not in SCALES:
            raise ConfigError(f"--scale must be one of {', '.join(SCALES)}, not {scale!r}")
        if holdout and scale == "paper":
            raise ConfigError("held-out variants are defined at CPU scale; drop --holdout with --scale paper")
        parsed = lab_config.parse_norms(norms)
        if workloads is not None and not workloads:
            raise ConfigError("--workloads names no workload; give names separated by commas (see normkit suite "
                              "--list), or drop it to run them all")
        names = [w.name for w in available()] if workloads is None else [load_workload(n).name for n in workloads]
        if not names:
            raise ConfigError("no workloads are registered (plugins register them; see docs/suite.md)")
        if len(set(names)) != len(names):
            raise ConfigError("a workload is listed twice in --workloads; list each once")
        return cls(norms=parsed, seeds=lab_config.parse_seeds(seeds), workloads=names, scale=scale, holdout=holdout,
                   runtime=dict(runtime or {}))

    def tasks(self) -> list[Task]:
        """The visible workloads, then (with holdout) every held-out variant of each."""
        loaded = [load_workload(name) for name in self.workloads]
        held = [Task(w, v) for w in loaded for v in w.variants] if self.holdout else []
        return [Task(w) for w in loaded] + held

    def task_values(self, task: Task, norms: list[str]) -> dict[str, Any]:
        """The comparison keys of `task` for `norms`: the workload's recipe, the suite's seeds, the tuning budget."""
        config, tune, _ = task.workload.resolved(self.scale, task.variant)
        return {**config, **self.runtime, "norms": norms, "seeds": list(self.seeds), "tune": tune,
                "tune_seeds": TUNE_SEEDS}


@dataclass
class Suite:
    """A suite directory and its plan."""

    path: Path
    plan: SuitePlan

    def save(self) -> None:
        atomic_write_text(self.path / SUITE_JSON, json_text({"format": 1, **asdict(self.plan)}))

    def task_dir(self, task: Task) -> Path:
        return self.path / task.name


def create_suite(plan: SuitePlan, out: str | Path | None) -> Suite:
    """A fresh suite directory (`out`, or runs/<timestamp>-suite) holding suite.json."""
    suite = Suite(new_results_dir(out, "suite"), plan)
    suite.save()
    return suite


def open_suite(path: str | Path) -> Suite:
    """The suite saved in `path`, to resume or score it."""
    path = Path(path)
    try:
        data = json.loads((path / SUITE_JSON).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{str(path)!r} has no {SUITE_JSON}; give a directory written by `normkit suite`") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {str(path / SUITE_JSON)!r}: {one_line(str(exc))}") from None
    try:
        data.pop("format", None)
        return Suite(path, SuitePlan(**data))
    except (AttributeError, TypeError):
        raise ConfigError(f"{str(path / SUITE_JSON)!r} is not a suite plan written by `normkit suite` (edited or "
                          f"damaged); start a new suite") from None


def hosted(plan: SuitePlan, task: Task, parallel: int = 1) -> tuple[CompareConfig, dict[str, str]]:
    """The task's checked config over the norms its model can host, and why each other norm cannot run.
    When no norm can run, the first norm's error is the workload's own problem and is raised."""
    excluded: dict[str, str] = {}
    for norm in plan.norms:
        try:
            check(lab_config.build_config(plan.task_values(task, [norm])), parallel=parallel)
        except normkit.SpecError as exc:
            excluded[norm] = one_line(str(exc))
    norms = [n for n in plan.norms if n not in excluded]
    if not norms:
        raise ConfigError(f"workload {task.name!r}: {excluded[plan.norms[0]]}")
    cfg = lab_config.build_config(plan.task_values(task, norms))
    check(cfg, parallel=parallel)
    return cfg, excluded


def planned_runs(plan: SuitePlan) -> int:
    """Runs the whole suite trains (every norm on every task, unhostable ones included): its cost."""
    total = 0
    for task in plan.tasks():
        cfg = lab_config.build_config(plan.task_values(task, plan.norms[:1]))
        n_tune, n_compare = run_count(cfg)
        total += (n_tune + n_compare) * len(plan.norms)
    return total


TaskStart = Callable[[Task, CompareConfig, dict[str, str]], None]


def run_suite(suite: Suite, *, executor: Executor | None = None, progress: Callable[[], Progress] | None = None,
              on_task: TaskStart | None = None, parallel: int = 1, allow_version_change: bool = False) -> None:
    """Train every task's runs that its directory does not hold yet (a resume continues where it stopped).
    `on_task(task, cfg, excluded)` is told as each task starts; `progress()` makes each task's progress;
    `allow_version_change` lets a resume continue under other versions, as `normkit compare --resume`."""
    for task in suite.plan.tasks():
        where = suite.task_dir(task)
        if (where / "config.yaml").is_file():
            cfg, store = open_store(where, suite.plan.runtime, allow_version_change=allow_version_change)
            check(cfg, parallel=parallel)
            excluded = suite.plan.excluded.get(task.name, {})
        else:
            cfg, excluded = hosted(suite.plan, task, parallel)
            suite.plan.excluded[task.name] = excluded
            suite.save()
            store = create_store(cfg, where)
        if on_task is not None:
            on_task(task, cfg, excluded)
        results = run_compare(cfg, store, executor=executor, progress=progress() if progress else None)
        write_summary(store, results, figures=True)  # the task's report.html with its figures, as compare draws them
