"""What a comparison runs: its configuration (`CompareConfig`), the training values every run shares
(`TrainConfig`) and their defaults.

Plain data at the bottom of the lab: the study parses and checks these (`normkit_lab.study.config`),
trainers train from them (`normkit_lab.runs`), the store hashes them into each run's identity
(`normkit_lab.records.config_hash`). Nothing here imports a layer above.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from normkit import plugins
from normkit.errors import NormkitError
from normkit_lab.ablations import ablation_arms
from normkit_lab.metrics import metric_named, reports_percent

# sgd and adamw: the ResNet/WRN and ViT recipes of the normality paper; muon takes AdamW-sized steps
# (runs/optimizers.py), so it starts from AdamW's values
DEFAULT_LR = {"sgd": 0.1, "adamw": 1e-3, "muon": 1e-3}
DEFAULT_WEIGHT_DECAY = {"sgd": 5e-4, "adamw": 0.05, "muon": 0.05}

# Defaults for every model and dataset that register none (`registered_train_defaults`); the
# default design of `normkit compare --norms bn,bnn,gn+pn` is the generated digit-blends dataset's
# (datasets/__init__.py, measured in docs/experiments.md). Other keys keep TrainConfig's defaults.
TRAIN_DEFAULTS: dict[str, Any] = {"epochs": 5, "batch_size": 128}
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
DEFAULT_MAX_SEEDS = 12  # `seeds: auto`: looks after 3, 5, 8 and 12 seeds (normkit_lab.sequential.plan_looks)
DEFAULT_TUNE_SEEDS = 2  # tuning seeds when tuning and none are given: the next ones after `seeds`
# How long a run trains: `epochs` (passes over the training data, the default), or a number of optimizer
# `steps` or training `examples` that every cell of a batch-size sweep trains alike.
BUDGET_UNITS = ("epochs", "steps", "examples")


@dataclass
class TrainConfig:
    """Everything about a run except the norm and the seed (shared by every run of a comparison).

    lr and weight_decay None mean the optimizer's default (sgd: 0.1 and 5e-4, adamw: 1e-3 and
    0.05). norm_weight_decay None means weight_decay: under weight_decay_policy "uniform" every
    norm parameter (affines and e.g. proxy norm's extra parameters) of every norm decays by it,
    so arms differ only in the norm; "plugin" applies what each norm declares instead.
    amp (bf16 where supported, else fp16) and channels_last need a CUDA device.
    cpu_threads: torch's CPU threads during a run; None = 1 for models under a million
    parameters on CPU (much faster for small-cnn), torch's default otherwise.
    nproc_per_node: processes (GPUs) per run; above 1 each run is launched with torchrun as
    DistributedDataParallel, batch_size staying the global batch (see normkit_lab.runs.distributed).
    norm_batch: None normalizes over the whole batch; N makes every norm with batch statistics (bn,
    bnn, ...) normalize over ghost batches of N samples (`normkit.ghost`) while the gradient batch
    stays batch_size, so sweeping it varies the normalization batch alone; other norms ignore it.
    budget: None trains `epochs` passes over the data; "steps=N" or "examples=N" trains exactly N
    optimizer steps (N examples, N / batch_size steps) whatever the batch size, the schedule spread
    over them, evaluating after each pass over the data and at the end (`epochs` is then unused).
    """

    model: str = "small-cnn"
    model_params: dict[str, Any] = field(default_factory=dict)
    dataset: str = "digit-blends"
    dataset_params: dict[str, Any] = field(default_factory=dict)
    data_dir: str | None = None
    download: bool = False
    epochs: int = 5
    batch_size: int = 128
    lr: float | None = None
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float | None = None
    norm_weight_decay: float | None = None
    weight_decay_policy: str = "uniform"
    schedule: str = "cosine"
    warmup_epochs: int = 0
    step_size: int = 30
    gamma: float = 0.1
    label_smoothing: float = 0.0
    augment: bool = False
    amp: bool = False
    channels_last: bool = False
    compile: bool = False
    device: str = "auto"
    num_workers: int = 0
    cpu_threads: int | None = None
    nproc_per_node: int = 1
    budget: str | None = None
    norm_batch: int | None = None

    @property
    def budget_unit(self) -> tuple[str, int]:
        """(unit, amount) of the training budget: ("epochs", epochs), ("steps", N) or ("examples", N)."""
        if self.budget is None:
            return "epochs", self.epochs
        unit, _, amount = self.budget.partition("=")
        return unit, int(amount)

    def total_steps(self, steps_per_epoch: int) -> int:
        """The optimizer steps a run takes, given the steps of one pass over its training data."""
        unit, amount = self.budget_unit
        if unit == "steps":
            return amount
        if unit == "examples":
            return amount // self.batch_size
        return amount * steps_per_epoch

    def run_epochs(self, steps_per_epoch: int) -> int:
        """Passes over the training data (the last one partial under a steps or examples budget)."""
        return math.ceil(self.total_steps(steps_per_epoch) / steps_per_epoch)

    @property
    def resolved_lr(self) -> float:
        return DEFAULT_LR[self.optimizer] if self.lr is None else self.lr

    @property
    def resolved_weight_decay(self) -> float:
        return DEFAULT_WEIGHT_DECAY[self.optimizer] if self.weight_decay is None else self.weight_decay

    @property
    def resolved_norm_weight_decay(self) -> float:
        return self.resolved_weight_decay if self.norm_weight_decay is None else self.norm_weight_decay


@dataclass
class CompareConfig:
    """Everything a comparison needs; `train` is shared by every run, except the values of its
    cell (`sweep`: training key -> values) and those chosen by tuning (`tune`, on `tune_seeds`).
    `select`: which epoch a run reports (`final` or `best-val`); `metric`: the primary metric
    (`normkit_lab.metrics.METRICS`; test accuracy, test bits per byte for language models);
    `margin`: the equivalence margin in the metric's unit (None = the metric's default, 0.5
    points of accuracy); `further_metrics`: the others of `--metric a,b,...`, read from the same runs
    (config.yaml keeps them all in `metric`). `looks`: sequential seeds (`seeds: auto`,
    normkit_lab.sequential): the seeds after each look, `seeds` then being every seed the budget allows;
    None runs every seed (fixed n). `max_cpu_minutes`: with looks, no further round starts once the runs'
    training CPU time plus the next round's estimate would exceed it. The runs are listed by
    `normkit_lab.study.plan`."""

    norms: list[str]
    train: TrainConfig
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    baseline: str | None = None
    diagnostics: bool = False
    select: str = "final"
    metric: str = "test_acc"
    margin: float | None = None
    tune: dict[str, list[Any]] = field(default_factory=dict)
    tune_seeds: list[int] = field(default_factory=list)
    sweep: dict[str, list[Any]] = field(default_factory=dict)
    ablate: bool = False
    looks: list[int] | None = None
    max_cpu_minutes: float | None = None
    further_metrics: list[str] = field(default_factory=list)
    # the user's own training code (normkit_lab.runs.trainer): a program run once per run, or the
    # "module:name" of a Python function; code_files: hashes of the files they name (set by check)
    command: str | None = None
    command_dir: str | None = None
    timeout: float | None = None
    train_function: str | None = None
    code_files: dict[str, str] | None = None

    @property
    def external(self) -> bool:
        """True when runs are the user's code (a command or a function), not normkit's own loop."""
        return self.command is not None or self.train_function is not None

    @property
    def arms(self) -> list[str]:
        """Every norm that trains: the compared norms, then with `ablate` each one's stage ablations
        (`normkit_lab.ablations`), which are analyzed apart and never enter the comparison's Holm family."""
        return [*self.norms, *(ablation_arms(self.norms) if self.ablate else ())]

    @property
    def baseline_norm(self) -> str:
        """The norm every other norm is compared to (the first one unless chosen)."""
        return self.baseline or self.norms[0]

    @property
    def accuracies_in_percent(self) -> bool:
        """True when the user's program reports its accuracies in percent: said by `:percent` on any of the
        metrics (`--metric test_loss,test_acc:percent`), since one program reports them all."""
        return any(reports_percent(m) for m in (self.metric, *self.further_metrics))

    def to_dict(self) -> dict[str, Any]:
        """The flat mapping saved as config.yaml (and accepted by `--config`), every default resolved."""
        train = dataclasses.asdict(self.train)
        if self.external:  # normkit's own recipe never ran: only the keys the user's code gets are recorded
            train = {key: train[key] for key in own_code_train_keys(self.command is not None)}
        else:
            train.update(lr=self.train.resolved_lr, weight_decay=self.train.resolved_weight_decay,
                         norm_weight_decay=self.train.resolved_norm_weight_decay)
            # one length: an epoch budget writes `epochs` (and no budget key, so its config hash is as before
            # budgets existed), a steps or examples budget writes `budget` and no unused `epochs`
            train.pop("epochs" if self.train.budget is not None else "budget")
        own = {key: getattr(self, key) for key in (*SEQUENTIAL_KEYS, *EXTERNAL_KEYS) if getattr(self, key) is not None}
        return {"norms": list(self.norms), "seeds": list(self.seeds), "baseline": self.baseline_norm,
                "diagnostics": self.diagnostics, "select": self.select,
                "metric": ",".join([self.metric, *self.further_metrics]),
                "margin": metric_named(self.metric).default_margin if self.margin is None else self.margin,
                "tune": {k: list(v) for k, v in self.tune.items()}, "tune_seeds": list(self.tune_seeds),
                "sweep": {k: list(v) for k, v in self.sweep.items()}, "ablate": self.ablate, **own, **train}


def own_code_train_keys(command: bool) -> tuple[str, ...]:
    """The training keys the user's own code still gets: where its runs go (device, CPU threads, processes
    per run for its GPU slots) and, for a command, `epochs` (its `{epochs}` and NORMKIT_EPOCHS; a train
    function is given none). The rest of `TrainConfig` is normkit's own loop's recipe (model, data, lr,
    ...), which never runs for it: refused as options and left out of config.yaml."""
    return ("device", "cpu_threads", "nproc_per_node", *(("epochs",) if command else ()))


# written to config.yaml only when set, so a built-in comparison's config (and its hash) is as before
EXTERNAL_KEYS = ("command", "command_dir", "timeout", "train_function", "code_files")
SEQUENTIAL_KEYS = ("looks", "max_cpu_minutes")  # `max_seeds` is read with `seeds: auto` and saved as the looks
COMPARE_KEYS = ("norms", "seeds", "baseline", "diagnostics", "select", "metric", "margin", "tune", "tune_seeds",
                 "sweep", "ablate", *SEQUENTIAL_KEYS, "max_seeds", *EXTERNAL_KEYS)


def grid(values: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of `values` (key -> list), in the order given; [{}] for no keys."""
    keys = list(values)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(values[k] for k in keys))]


def defaults() -> dict[str, Any]:
    """Default value of every key except `norms`, which has none."""
    out: dict[str, Any] = {"seeds": list(DEFAULT_SEEDS), "baseline": None, "diagnostics": False,
                           "select": "final", "metric": "test_acc", "margin": None, "tune": {}, "tune_seeds": None,
                           "sweep": {}, "ablate": False, "looks": None, "max_seeds": None, "max_cpu_minutes": None,
                           **dict.fromkeys(EXTERNAL_KEYS)}
    for f in dataclasses.fields(TrainConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    out.update(TRAIN_DEFAULTS)
    return out


def registered_train_defaults(kind: str, name: Any) -> dict[str, Any]:
    """The training values a model or dataset registers as its defaults (`train_defaults=` at
    registration).

    They sit between the global defaults and the user's values, a model's over its dataset's: e.g.
    the GPT models train with AdamW at batch 32, the generated digit-blends dataset (the default) carries
    the default design, which varies only the normalization batch (a batch of 16 for 300 steps, normalizing
    over ghost batches of 2 or the whole batch), and the bundled digits one batch 2 and 16 at 500 steps
    each, docs/experiments.md; a registered sweep and budget stand only while the user gives
    no length or batch of their own, see `study.config.DESIGN_KEYS` (a budget registered without a sweep,
    a recipe's length, stays until the user gives a length). An
    unknown name has none (check() names it).
    """
    if not isinstance(name, str):
        return {}
    try:
        entry = plugins.registry().lookup_item(kind, name)
    except NormkitError:
        return {}
    return dict(entry.meta.get("train_defaults") or {})
