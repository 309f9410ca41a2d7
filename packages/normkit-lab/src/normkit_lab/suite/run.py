"""Run the suite: every workload (and with `holdout` each held-out variant) as an ordinary comparison.

    plan = SuitePlan.make(["bn", "gn+pn"], seeds="auto", workloads=None, scale="cpu", holdout=False)
    suite = create_suite(plan, out=None)        # checks every task, then runs/<timestamp>-suite
    run_suite(suite, executor=...)              # one results directory per task inside it
    suite = open_suite("runs/...-suite")        # --resume: the saved plan, checked; finished runs are skipped

Each task is `normkit compare`'s own path (config -> check -> store -> run_compare) with the
workload's recipe, the norms it can host, the suite's seeds and the workload's tuning budget on
tuning seeds after them, so `normkit report DIR/<task>` reads it and a resume continues it. With
`seeds="auto"` each task is a comparison with sequential seeds (compare's `study/rounds.py`): its own
looks.json, its own rounds for the comparisons still undecided, and `max_cpu_minutes` as its budget. A norm a
workload cannot host (a batch norm in a causal language model) is left out of that task with its
one-line reason, recorded in suite.json; it counts as a miss in the scores. When no norm given can
run a task, each is marked so there and the suite goes on.

The suite trusts nothing it did not write: suite.json records at creation the hash of what the suite
runs (its identity), so an edited plan is refused as an edited config.yaml is; a task directory is
adopted only when its config.yaml is the one this plan makes for it; and the task directories are
opened or created (all of them, every check passed, before anything trains) under the suite's lock,
so two resumes at once share each workload's store, whose run locks train each run once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import normkit
from normkit_lab import safe_yaml
from normkit_lab.analysis.report import write_summary
from normkit_lab.errors import ConfigError, one_line, short_repr
from normkit_lab.executors import Executor, ExecutorOptions, make_executor
from normkit_lab.records import RUNTIME_KEYS
from normkit_lab.spec import CompareConfig
from normkit_lab.store import locks
from normkit_lab.store.results import ResultsDir, atomic_write_text, json_text, new_results_dir, refuse_symlinks
from normkit_lab.study import config as lab_config
from normkit_lab.study.compare import check, create_store, open_store, record_version_change, run_compare
from normkit_lab.study.plan import run_count
from normkit_lab.study.progress import Progress
from normkit_lab.suite.workloads import SCALES, Workload, available, load_workload

SUITE_JSON = "suite.json"
LOCK_FILE = "suite.lock"  # held while the plan is checked and task directories are opened or created
FORMAT = 3  # 3: sequential seeds (looks); 2: suite.json records its identity (format 1 did not)
DEFAULT_SEEDS = 3  # the fewest pairs that get a verdict; the scorecard's MDE says when more are needed
TUNE_SEEDS = 1  # tuning seeds per candidate: the budget is the workload's candidates x this, alike for every norm
IDENTITY_KEYS = ("norms", "seeds", "workloads", "scale", "holdout")  # what the suite's runs are
SEQUENTIAL_KEYS = ("looks", "max_cpu_minutes")  # part of the identity of a suite with sequential seeds
RUNTIME = ("data_dir", "device")  # where, not what, runs compute: a resume may change them
PROBE_NORM = "none"  # a norm every model hosts: tells a workload's own problem from its norms'
# config.yaml keys that do not decide which runs a task holds or what they compute
_LOCAL_KEYS = RUNTIME_KEYS | {"cpu_threads", "command_dir"}


@dataclass(frozen=True)
class Task:
    """One comparison of the suite: a workload, or one of its held-out variants (`variant`)."""

    workload: Workload
    variant: str | None = None

    @property
    def name(self) -> str:
        """The task's directory name: `cnn`, or `cnn@narrow` for a held-out variant (both checked at
        registration to be plain names, so a task directory is always inside the suite's)."""
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
    looks: list[int] | None = None  # sequential seeds: the cumulative seeds at each look of every task
    max_cpu_minutes: float | None = None  # sequential seeds: each task starts no round past this CPU time
    runtime: dict[str, Any] = field(default_factory=dict)  # data_dir, device: where, not what, runs compute
    excluded: dict[str, dict[str, str]] = field(default_factory=dict)  # task -> norm -> why it cannot run

    @classmethod
    def make(cls, norms: str | list[str], seeds: Any = DEFAULT_SEEDS, workloads: list[str] | None = None,
             scale: str = "cpu", holdout: bool = False, runtime: dict[str, Any] | None = None, *,
             max_seeds: int | None = None, looks: list[int] | None = None,
             max_cpu_minutes: float | None = None) -> SuitePlan:
        """A checked plan: norms and seeds as `normkit compare` reads them (`"auto"` with max_seeds and
        max_cpu_minutes: sequential seeds, planned as compare plans them), workloads by name (None: all)."""
        if scale not in SCALES:
            raise ConfigError(f"--scale must be one of {', '.join(SCALES)}, not {short_repr(scale)}")
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
        sequential = {key: value for key, value in (("max_seeds", max_seeds), ("looks", looks),
                                                    ("max_cpu_minutes", max_cpu_minutes)) if value is not None}
        planned = lab_config.build_config({"norms": PROBE_NORM, "seeds": seeds, **sequential})  # compare's rules
        return cls(norms=parsed, seeds=planned.seeds, workloads=names, scale=scale, holdout=holdout,
                   looks=planned.looks, max_cpu_minutes=planned.max_cpu_minutes, runtime=dict(runtime or {}))

    def identity(self) -> dict[str, Any]:
        """What the suite's runs are (not where they run, nor what was found out while checking); the looks
        and budget only with sequential seeds, so a fixed-seed suite keeps the identity it was created with."""
        keys = IDENTITY_KEYS + (SEQUENTIAL_KEYS if self.looks is not None else ())
        return {key: getattr(self, key) for key in keys}

    def tasks(self) -> list[Task]:
        """The visible workloads, then (with holdout) every held-out variant of each."""
        loaded = [load_workload(name) for name in self.workloads]
        held = [Task(w, v) for w in loaded for v in w.variants] if self.holdout else []
        return [Task(w) for w in loaded] + held

    def task_values(self, task: Task, norms: list[str]) -> dict[str, Any]:
        """The comparison keys of `task` for `norms`: the workload's recipe, the suite's seeds, the tuning budget."""
        config, tune, _ = task.workload.resolved(self.scale, task.variant)
        sequential = {"looks": list(self.looks), "max_cpu_minutes": self.max_cpu_minutes} if self.looks else {}
        return {**config, **self.runtime, "norms": norms, "seeds": list(self.seeds), **sequential, "tune": tune,
                "tune_seeds": TUNE_SEEDS}

    def hosted_norms(self, task: Task) -> list[str]:
        """The suite's norms that `task` runs (those not recorded as unable to run there)."""
        return [n for n in self.norms if n not in self.excluded.get(task.name, {})]


def _hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Ready:
    """A task checked and ready to train: its config and store, or (cfg None) no norm given can run it."""

    task: Task
    cfg: CompareConfig | None
    store: ResultsDir | None
    excluded: dict[str, str]


@dataclass
class Suite:
    """A suite directory and its plan; `ready` holds its tasks once `prepare` has opened them."""

    path: Path
    plan: SuitePlan
    identity_hash: str | None = None
    ready: list[Ready] | None = None

    def save(self) -> None:
        if self.identity_hash is None:
            self.identity_hash = _hash(self.plan.identity())
        identity = {"hash": self.identity_hash, **self.plan.identity()}
        refuse_symlinks(self.path)
        atomic_write_text(self.path / SUITE_JSON, json_text({"format": FORMAT, **asdict(self.plan),
                                                             "identity": identity}))

    def task_dir(self, task: Task) -> Path:
        return self.path / task.name

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """The suite's lock: the plan is checked, and task directories opened or created, under it."""
        refuse_symlinks(self.path)
        return locks.exclusive(self.path / LOCK_FILE)


def check_plan(plan: SuitePlan, parallel: int = 1) -> list[tuple[Task, CompareConfig | None, dict[str, str]]]:
    """Every task's checked config and the norms it cannot host (recorded in `plan.excluded`): every bad
    input (a device, a dataset, a workload's own problem) fails here, before a directory or a run."""
    checked = []
    for task in plan.tasks():
        cfg, excluded = hosted(plan, task, parallel)
        plan.excluded[task.name] = excluded
        checked.append((task, cfg, excluded))
    return checked


def create_suite(plan: SuitePlan, out: str | Path | None, parallel: int = 1) -> Suite:
    """Check every task (see `check_plan`), then a fresh suite directory (`out`, or runs/<timestamp>-suite)
    holding suite.json and a results directory per task that some norm can run."""
    checked = check_plan(plan, parallel)
    suite = Suite(new_results_dir(out, "suite"), plan)
    with suite.lock():
        suite.save()
        suite.ready = [Ready(task, cfg, None if cfg is None else create_store(cfg, suite.task_dir(task)), excluded)
                       for task, cfg, excluded in checked]
    return suite


def _damaged(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{str(path)!r} {why}; it is not a suite plan written by `normkit suite` (edited or "
                       f"damaged), so restore it or start a new suite")


def _plan_of(data: Any, path: Path) -> tuple[SuitePlan, str | None]:
    """The plan in suite.json's mapping, every value checked as `SuitePlan.make` checks the command line's,
    and its identity against the one recorded at creation (None for a format-1 suite, which had none)."""
    if not isinstance(data, dict):
        raise _damaged(path, f"holds a JSON {type(data).__name__}, not an object")
    known = {"format", "identity", *IDENTITY_KEYS, *SEQUENTIAL_KEYS, "runtime", "excluded"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise _damaged(path, f"has unknown key {unknown[0]!r}")
    missing = [key for key in IDENTITY_KEYS if key not in data]
    if missing:
        raise _damaged(path, f"lacks {', '.join(missing)}")
    if data.get("format") not in (1, 2, FORMAT):
        raise _damaged(path, f"has format {short_repr(data.get('format'))}, not one this normkit writes")
    norms, seeds, workloads = data["norms"], data["seeds"], data["workloads"]
    if not (isinstance(norms, list) and norms and all(isinstance(n, str) for n in norms)):
        raise _damaged(path, f"has norms {short_repr(norms, 40)}; they must be a list of norm specs")
    if not (isinstance(workloads, list) and all(isinstance(w, str) for w in workloads)):
        raise _damaged(path, f"has workloads {short_repr(workloads, 40)}; they must be a list of workload names")
    if not (isinstance(seeds, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise _damaged(path, f"has seeds {short_repr(seeds, 40)}; they must be a list of integers")
    if not isinstance(data["holdout"], bool):
        raise _damaged(path, f"has holdout {short_repr(data['holdout'])}; it must be true or false")
    runtime = data.get("runtime", {})
    if not (isinstance(runtime, dict) and set(runtime) <= set(RUNTIME) and all(isinstance(v, str)
                                                                                for v in runtime.values())):
        raise _damaged(path, f"has runtime {short_repr(runtime, 40)}; it may set only "
                             f"{' and '.join(RUNTIME)}, as texts")
    excluded = data.get("excluded", {})
    if not (isinstance(excluded, dict) and all(isinstance(by, dict) and all(
            isinstance(n, str) and isinstance(why, str) for n, why in by.items()) for by in excluded.values())):
        raise _damaged(path, f"has excluded {short_repr(excluded, 40)}; it must map each workload to the norms "
                             f"that cannot run there and why")
    looks, budget = data.get("looks"), data.get("max_cpu_minutes")
    if data["format"] < FORMAT and (looks is not None or budget is not None):
        raise _damaged(path, f"has format {data['format']} with looks, which only format {FORMAT} has")
    try:
        plan = SuitePlan.make(norms, seeds, workloads, data["scale"], data["holdout"], runtime, looks=looks,
                              max_cpu_minutes=budget)
    except normkit.NormkitError as exc:  # a plugin uninstalled since, or an edit
        raise ConfigError(f"{str(path)!r} holds a plan this installation cannot run ({one_line(str(exc), 200)}); "
                          f"install the plugin it needs, or restore the file if it was edited") from None
    keys = list(plan.identity())
    if plan.identity() != {key: data.get(key) for key in keys}:
        raise _damaged(path, "holds a plan in another spelling than the one it was created with")
    plan.excluded = {task: dict(by) for task, by in excluded.items()}
    identity = data.get("identity")
    if data["format"] == 1:
        return plan, None  # older suites: their tasks' config.yaml files still check what ran
    if not (isinstance(identity, dict) and isinstance(identity.get("hash"), str)
            and set(identity) == {"hash", *keys} and _hash({k: identity[k] for k in keys})
            == identity["hash"]):
        raise _damaged(path, "has a missing or damaged identity (the record of what the suite runs)")
    changed = [f"{key}: {short_repr(identity[key], 40)} -> {short_repr(data[key], 40)}" for key in keys
               if identity[key] != data[key]]
    if changed:
        raise ConfigError(f"{str(path)!r} was edited after the suite was created ({'; '.join(changed)}); its "
                          f"runs follow the original plan, so restore it, or start a new suite for the new plan")
    return plan, identity["hash"]


def open_suite(path: str | Path, runtime: dict[str, Any] | None = None) -> Suite:
    """The suite saved in `path`, its plan checked (see `_plan_of`), to resume or score it; `runtime`
    (data_dir, device) replaces where its runs compute for this session."""
    path = Path(path)
    try:
        refuse_symlinks(path)
        data = json.loads((path / SUITE_JSON).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{str(path)!r} has no {SUITE_JSON}; give a directory written by `normkit suite`") from None
    except NotADirectoryError:
        raise ConfigError(f"{str(path)!r} is not a directory; give a directory written by `normkit suite`") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"cannot read {str(path / SUITE_JSON)!r}: {one_line(str(exc), 200)}; restore it or start "
                          f"a new suite") from None
    plan, identity_hash = _plan_of(data, path / SUITE_JSON)
    if runtime:
        plan.runtime = {**plan.runtime, **runtime}
    return Suite(path, plan, identity_hash)


def hosted(plan: SuitePlan, task: Task, parallel: int = 1) -> tuple[CompareConfig | None, dict[str, str]]:
    """The task's checked config over the norms its model can host, and why each other norm cannot run.
    When no norm given can run it, the config is None, unless the workload itself is at fault (a norm
    every model hosts fails there too): then that error is raised."""
    excluded: dict[str, str] = {}
    for norm in plan.norms:
        try:
            check(lab_config.build_config(plan.task_values(task, [norm])), parallel=parallel)
        except normkit.SpecError as exc:
            excluded[norm] = one_line(str(exc))
    norms = [n for n in plan.norms if n not in excluded]
    if not norms:
        try:
            check(lab_config.build_config(plan.task_values(task, [PROBE_NORM])), parallel=parallel)
        except normkit.SpecError:
            raise ConfigError(f"workload {task.name!r}: {excluded[plan.norms[0]]}") from None
        return None, excluded
    cfg = lab_config.build_config(plan.task_values(task, norms))
    check(cfg, parallel=parallel)
    return cfg, excluded


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _LOCAL_KEYS}


def _check_own(suite: Suite, task: Task, store: ResultsDir) -> None:
    """Refuse a task directory whose config.yaml is not the one this suite's plan makes for the task
    (another suite's or comparison's, copied in, or suite.json edited): one line naming what differs."""
    saved = _comparable(lab_config.load_yaml(store.config_path))
    made = lab_config.save_yaml(lab_config.build_config(suite.plan.task_values(task, suite.plan.hosted_norms(task))))
    expected = _comparable(lab_config.normalize_keys(safe_yaml.loads(made, "config"), "config"))
    changed = [f"{k}: {short_repr(saved.get(k), 30)} there, {short_repr(expected.get(k), 30)} in the plan"
               for k in sorted(set(saved) | set(expected)) if json.dumps(saved.get(k), sort_keys=True, default=repr)
               != json.dumps(expected.get(k), sort_keys=True, default=repr)]
    if changed:
        raise ConfigError(f"{str(store.path)!r} is not the {task.name!r} workload of this suite's plan ("
                          f"{'; '.join(changed[:3])}{'; ...' if len(changed) > 3 else ''}): suite.json, the "
                          f"workload or the directory changed since its runs were made; move the directory away "
                          f"or start a new suite")


_ABANDONED = ("config.yaml", "store.json", "environment.json")  # what creating a store writes (atomically)


def _adopt_or_create(suite: Suite, task: Task, cfg: CompareConfig) -> ResultsDir:
    """The task's store, created in its directory. A directory left without config.yaml by a crash while
    it was created (empty, or holding only the temporary files of the writes) is this suite's own: it is
    removed and created again; one holding anything else is refused."""
    where = suite.task_dir(task)
    if where.is_symlink() or where.exists():
        if where.is_symlink() or not where.is_dir():
            raise ConfigError(f"{str(where)!r} is not a directory this suite made (a file or a link); move it "
                              f"away and resume again")
        left = list(where.iterdir())
        if not all(p.is_file() and not p.is_symlink() and p.name.endswith(".tmp")
                   and any(p.name.startswith(f".{name}.") for name in _ABANDONED) for p in left):
            raise ConfigError(f"{str(where)!r} has no config.yaml but holds other files, so it is not a task "
                              f"directory this suite left unfinished; move it away and resume again")
        for p in left:
            p.unlink()
        where.rmdir()
    return create_store(cfg, where)


def prepare(suite: Suite, parallel: int = 1, allow_version_change: bool = False,
            warn: Callable[[str], None] | None = None) -> list[Ready]:
    """Open every task of a saved suite (or create the stores a crash or an older suite left missing),
    every check passed before anything trains, under the suite's lock: the plan again (another process
    may have rewritten suite.json), each store's config and versions, that each directory is this
    plan's, what each task can host. An allowed version change is recorded in every store (so the
    next plain resume is accepted), only once everything else passed."""
    with suite.lock():
        if (suite.path / SUITE_JSON).is_file():  # re-read under the lock: the plan a concurrent suite saved
            again = open_suite(suite.path, suite.plan.runtime)
            suite.plan.excluded = again.plan.excluded
        opened: list[tuple[Task, CompareConfig | None, ResultsDir | None, dict[str, str]]] = []
        for task in suite.plan.tasks():
            where = suite.task_dir(task)
            if (where / "config.yaml").is_file():
                cfg, store = open_store(where, suite.plan.runtime, allow_version_change=allow_version_change,
                                        warn=warn)
                _check_own(suite, task, store)
                check(cfg, parallel=parallel)
                opened.append((task, cfg, store, suite.plan.excluded.get(task.name, {})))
            else:
                cfg, excluded = hosted(suite.plan, task, parallel)
                suite.plan.excluded[task.name] = excluded
                opened.append((task, cfg, None, excluded))
        suite.save()
        if allow_version_change:
            for _, cfg, store, _ in opened:
                if cfg is not None and store is not None:
                    record_version_change(cfg, store)
        suite.ready = [Ready(task, cfg, store if store is not None or cfg is None
                             else _adopt_or_create(suite, task, cfg), excluded)
                       for task, cfg, store, excluded in opened]
    return suite.ready


def planned_runs(plan: SuitePlan) -> int:
    """Runs the whole suite trains (every norm on every task, unhostable ones included): its cost."""
    total = 0
    for task in plan.tasks():
        cfg = lab_config.build_config(plan.task_values(task, plan.norms[:1]))
        n_tune, n_compare = run_count(cfg)
        total += (n_tune + n_compare) * len(plan.norms)
    return total


TaskStart = Callable[[Task, "CompareConfig | None", dict[str, str]], None]


def run_suite(suite: Suite, *, executor: Executor | None = None, progress: Callable[[], Progress] | None = None,
              on_task: TaskStart | None = None, parallel: int = 1, allow_version_change: bool = False) -> None:
    """Train every task's runs that its directory does not hold yet (a resume continues where it stopped).
    The tasks are those `create_suite` or `prepare` opened (prepared here when not yet). `on_task(task,
    cfg, excluded)` is told as each task starts (cfg None: no norm given can run it); `progress()` makes
    each task's progress; `allow_version_change` lets a resume continue under other versions, as
    `normkit compare --resume`."""
    ready = suite.ready if suite.ready is not None else prepare(suite, parallel, allow_version_change)
    executor = executor or make_executor(ExecutorOptions())
    with executor.session():  # one pool of workers (--jobs N) for every workload and round
        for item in ready:
            if on_task is not None:
                on_task(item.task, item.cfg, item.excluded)
            if item.cfg is None or item.store is None:
                continue
            results = run_compare(item.cfg, item.store, executor=executor,
                                  progress=progress() if progress else None)
            write_summary(item.store, results, figures=True)  # the task's report.html with its figures, as compare
