"""What runs before any training: `check_config` refuses, in one line, a configuration or norm a run
would fail on, and the run's device, data and model are made the same way for the check and the run.

    from normkit_lab.runs.checks import check_config
    from normkit_lab.spec import TrainConfig
    check_config(TrainConfig(epochs=3), ["bn", "bnn", "gn+pn"])

Split from the training loop (`normkit_lab.runs.training`), which imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import torch
from torch import nn

import normkit
from normkit_lab.datasets import DatasetBundle, dataset_params, load_dataset
from normkit_lab.errors import ConfigError, short_repr
from normkit_lab.limits import (
    MAX_BATCH_SIZE,
    MAX_CPU_THREADS,
    MAX_EPOCHS,
    MAX_MODEL_PARAMS,
    MAX_NPROC_PER_NODE,
    MAX_NUM_WORKERS,
    MAX_STEPS,
)
from normkit_lab.models import build_model, model_params
from normkit_lab.runs.device import cpu_threads, resolve_device
from normkit_lab.runs.optimizers import OPTIMIZERS
from normkit_lab.runs.schedule import SCHEDULES
from normkit_lab.spec import TrainConfig

# "uniform": every norm parameter of every arm decays by norm_weight_decay (default: weight_decay,
# the proxy-norm paper's ResNet recipe); "plugin": the norms' own declared policies (normkit.param_groups).
WEIGHT_DECAY_POLICIES = ("uniform", "plugin")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_numbers(cfg: TrainConfig) -> None:
    def at_least(v: Any, low: int, high: int | None = None) -> bool:
        return _is_int(v) and v >= low and (high is None or v <= high)

    def within(v: Any, low: float, high: float) -> bool:
        return _is_number(v) and low <= v < high

    checks = [
        ("epochs", at_least(cfg.epochs, 1, MAX_EPOCHS), f"an integer in [1, {MAX_EPOCHS:,}]"),
        ("batch_size", at_least(cfg.batch_size, 1, MAX_BATCH_SIZE), f"an integer in [1, {MAX_BATCH_SIZE:,}]"),
        ("optimizer", cfg.optimizer in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}"),
        ("lr", cfg.lr is None or (_is_number(cfg.lr) and cfg.lr > 0), "a number > 0"),
        ("momentum", within(cfg.momentum, 0, 1), "in [0, 1)"),
        ("weight_decay", cfg.weight_decay is None or within(cfg.weight_decay, 0, math.inf),
         "a number >= 0"),
        ("norm_weight_decay", cfg.norm_weight_decay is None or within(cfg.norm_weight_decay, 0, math.inf),
         "a number >= 0 (or unset: the weight decay)"),
        ("weight_decay_policy", cfg.weight_decay_policy in WEIGHT_DECAY_POLICIES,
         f"one of {', '.join(WEIGHT_DECAY_POLICIES)}"),
        ("schedule", cfg.schedule in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
        ("budget", cfg.budget is None or (isinstance(cfg.budget, str) and re.fullmatch(
            r"(steps|examples)=[1-9][0-9]{0,11}", cfg.budget) is not None and cfg.budget_unit[1] <= (
            MAX_STEPS * (cfg.batch_size if cfg.budget.startswith("examples") else 1))),
         f"steps=N (N at most {MAX_STEPS:,}), examples=N or unset (the epochs)"),
        ("warmup_epochs", at_least(cfg.warmup_epochs, 0)  # under a budget: checked against its steps
         and (cfg.budget is not None or cfg.warmup_epochs <= cfg.epochs), f"an integer in [0, epochs={cfg.epochs}]"),
        ("step_size", at_least(cfg.step_size, 1, MAX_EPOCHS), f"an integer in [1, {MAX_EPOCHS:,}]"),
        ("gamma", _is_number(cfg.gamma) and 0 < cfg.gamma <= 1, "in (0, 1]"),
        ("label_smoothing", within(cfg.label_smoothing, 0, 1), "in [0, 1)"),
        ("num_workers", at_least(cfg.num_workers, 0, MAX_NUM_WORKERS), f"an integer in [0, {MAX_NUM_WORKERS}]"),
        ("cpu_threads", cfg.cpu_threads is None or at_least(cfg.cpu_threads, 1, MAX_CPU_THREADS),
         f"an integer in [1, {MAX_CPU_THREADS}] (or unset)"),
        ("nproc_per_node", at_least(cfg.nproc_per_node, 1, MAX_NPROC_PER_NODE),
         f"an integer in [1, {MAX_NPROC_PER_NODE}]"),
        *((key, isinstance(getattr(cfg, key), str), "a name") for key in ("model", "dataset")),
        *((key, isinstance(getattr(cfg, key), bool), "true or false")
          for key in ("download", "augment", "amp", "channels_last", "compile")),
        *((key, isinstance(getattr(cfg, key), dict), "a mapping of name to value")
          for key in ("model_params", "dataset_params")),
    ]
    for key, ok, expected in checks:
        _require(ok, f"{key} must be {expected}, got {short_repr(getattr(cfg, key))}")
    check_divisible(cfg.batch_size, cfg.nproc_per_node)
    check_norm_batch(cfg)


def check_norm_batch(cfg: TrainConfig) -> None:
    """norm_batch: ghost batches that split every process's share of the batch evenly."""
    n, local = cfg.norm_batch, cfg.batch_size // cfg.nproc_per_node
    _require(n is None or (_is_int(n) and 1 <= n <= local and local % n == 0),
             f"norm_batch must divide the batch each process normalizes ({local} samples: batch_size "
             f"{cfg.batch_size} / nproc_per_node {cfg.nproc_per_node}), or be unset, got {short_repr(n)}")


def steps_per_epoch(cfg: TrainConfig, train_size: int) -> int:
    """Optimizer steps of one pass over `train_size` training examples, as the run's loader makes them
    (a last partial batch dropped when there is more than one batch; under DDP per process)."""
    world = cfg.nproc_per_node
    per_rank, shard = cfg.batch_size // world, train_size // world if world > 1 else train_size
    return shard // per_rank if shard > per_rank else 1


def planned_epochs(cfg: TrainConfig) -> int:
    """The passes over the training data a run of `cfg` makes: `epochs`, or under a steps or examples
    budget as many as its steps need (the dataset is loaded to count them)."""
    if cfg.budget is None:
        return cfg.epochs
    return cfg.run_epochs(steps_per_epoch(cfg, len(run_dataset(cfg).train)))


def planned_steps(cfg: TrainConfig) -> int:
    """The optimizer steps a run of `cfg` takes (the dataset is loaded to count one pass's)."""
    return cfg.total_steps(steps_per_epoch(cfg, len(run_dataset(cfg).train)))


def _check_budget(cfg: TrainConfig, train_size: int) -> None:
    """A steps or examples budget that the batch size can meet exactly, with the warmup inside it."""
    unit, amount = cfg.budget_unit
    if unit == "examples":
        _require(amount % cfg.batch_size == 0,
                 f"budget examples={amount} is not a multiple of batch_size {cfg.batch_size}, so runs could not "
                 f"train exactly that many; use a multiple of every swept batch size, e.g. examples="
                 f"{math.ceil(amount / cfg.batch_size) * cfg.batch_size}")
    per_epoch = steps_per_epoch(cfg, train_size)
    total = cfg.total_steps(per_epoch)
    _require(total >= 1, f"budget {cfg.budget} gives no optimizer step at batch_size {cfg.batch_size}")
    _require(cfg.warmup_epochs * per_epoch <= total,
             f"warmup_epochs {cfg.warmup_epochs} ({cfg.warmup_epochs * per_epoch} steps at batch_size "
             f"{cfg.batch_size}) is longer than the budget's {total} steps; shorten the warmup")


def check_divisible(batch_size: int, processes: int) -> None:
    """A DDP run splits the global batch evenly: every process takes batch_size / processes samples."""
    _require(batch_size % processes == 0,
             f"batch_size {batch_size} is not divisible by nproc_per_node {processes} (each process takes an "
             f"equal share of the global batch); use a multiple of {processes}")


def check_device(cfg: TrainConfig) -> torch.device:
    _require(isinstance(cfg.device, str),
             f"device must be auto, cpu, cuda, cuda:N or mps; got {cfg.device!r}")
    device = resolve_device(cfg.device)
    for key in ("amp", "channels_last"):
        flag = key.replace("_", "-")
        _require(not getattr(cfg, key) or device.type == "cuda",
                 f"{key} needs a CUDA device, but the run would use {device.type}; drop --{flag}")
    return device


def _check_processes(cfg: TrainConfig, device: torch.device) -> None:
    """A DDP run has one process per GPU (nccl) or per CPU share (gloo): not MPS, and not one named GPU."""
    n = cfg.nproc_per_node
    if n == 1:
        return
    _require(device.type in ("cpu", "cuda"),
             f"nproc_per_node {n} runs on CUDA GPUs or the CPU, not on {device.type}; use --device cpu")
    _require(device.type != "cuda" or device.index is None,
             f"device {cfg.device!r} names one GPU, but nproc_per_node {n} runs one process per GPU; use --device "
             f"cuda (the run takes {n} GPUs of CUDA_VISIBLE_DEVICES)")


def _data_params(cfg: TrainConfig) -> dict[str, Any]:
    """The dataset's parameters, with `augment` from the config routed to datasets that declare it."""
    params = dict(cfg.dataset_params)
    if cfg.augment:
        dataset_params(cfg.dataset, {})  # an unknown dataset fails here, with its own message
        try:
            dataset_params(cfg.dataset, {"augment": True})
        except normkit.SpecError:
            raise ConfigError(f"dataset {cfg.dataset!r} has no augmentation (random crop + flip needs "
                              "images of at least 32 px); drop --augment") from None
        params["augment"] = True
    return params


@functools.lru_cache(maxsize=2)
def _cached_dataset(name: str, params: tuple[tuple[str, Any], ...], data_dir: str | None,
                    download: bool) -> DatasetBundle:
    return load_dataset(name, data_dir=data_dir, download=download, seed=0, **dict(params))


def run_dataset(cfg: TrainConfig) -> DatasetBundle:
    """The run's data, the same for every norm and seed (loaded once per configuration)."""
    params = tuple(sorted(dataset_params(cfg.dataset, _data_params(cfg)).items()))  # typed, hashable
    return _cached_dataset(cfg.dataset, params, cfg.data_dir, cfg.download)


def build_run_model(cfg: TrainConfig, norm: str, data: DatasetBundle) -> nn.Module:
    model = build_model(cfg.model, norm, **_shape(data), **cfg.model_params)
    if cfg.norm_batch is not None:
        set_norm_batch(model, cfg.norm_batch)
    return model


def set_norm_batch(model: nn.Module, size: int) -> int:
    """Make every normkit layer of `model` whose statistics pool over the batch normalize over ghost
    batches of `size` samples (as if built with `ghost=size`); returns how many layers changed."""
    changed = 0
    for module in model.modules():
        partition = getattr(module, "partition", None)
        if isinstance(module, normkit.NormLayer) and partition is not None and partition.uses_batch:
            partition = dataclasses.replace(partition, ghost=size)
            partition.check(module.num_channels, module.spec)
            module.partition = partition
            changed += 1
    return changed


def norm_batch_changes(cfg: TrainConfig, norm: str) -> bool:
    """Whether `norm_batch` can change a run of `norm`: its model (built on the meta device) holds a layer
    whose statistics pool over the batch. False proves the run the same at every norm_batch (gn+pn, ln);
    a model that cannot be built this way counts as changed (it is trained, never assumed equal)."""
    shape = _shape(run_dataset(cfg))
    key = (cfg.model, norm, tuple(shape.items()), repr(sorted(cfg.model_params.items())))
    if key not in _POOLS_OVER_BATCH:  # a comparison asks for every run at every look: build each model once
        _POOLS_OVER_BATCH[key] = _pools_over_batch(cfg, norm, shape)
    return _POOLS_OVER_BATCH[key]


_POOLS_OVER_BATCH: dict[tuple, bool] = {}


def _pools_over_batch(cfg: TrainConfig, norm: str, shape: dict[str, int]) -> bool:
    try:
        with torch.device("meta"):
            model = build_model(cfg.model, norm, **shape, **cfg.model_params)
    except Exception:  # noqa: BLE001 - unprovable: train it
        return True
    return any(isinstance(module, normkit.NormLayer) and getattr(module.partition, "uses_batch", False)
               for module in model.modules())


def _shape(data: DatasetBundle) -> dict[str, int]:
    return {"num_classes": data.num_classes, "in_channels": data.in_channels, "image_size": data.image_size}


def _check_size(cfg: TrainConfig, norms: list[str], data: DatasetBundle) -> None:
    """Refuse a model over MAX_MODEL_PARAMS, counted on the meta device (no memory).

    Built with norm `none` where installed (the model's own size), else with the first norm. A
    model that cannot be built this way is left to the hosting check, which names the reason.
    """
    probe = "none" if any(e["name"] == "none" for e in normkit.available()) else norms[0]
    try:
        with torch.device("meta"):
            model = build_run_model(cfg, probe, data)
    except Exception:  # noqa: BLE001 - reported by _check_hosting, or at run time as a failed run
        return
    count = sum(p.numel() for p in model.parameters())
    _require(count <= MAX_MODEL_PARAMS,
             f"model {cfg.model!r} with {cfg.model_params or 'its defaults'} would have {count:,} parameters; "
             f"at most {MAX_MODEL_PARAMS:,} (see Limits in docs/experiments.md); use a smaller width or depth")


def _check_hosting(cfg: TrainConfig, norm: str, data: DatasetBundle) -> None:
    """Build the model once for `norm` (without memory on the meta device where the norm allows).

    A NormkitError (a norm the model cannot host, a bad parameter) stops the comparison here;
    any other exception is a bug of the norm and is recorded as that norm's failed runs instead.
    """
    try:
        with torch.device("meta"):
            build_run_model(cfg, norm, data)
    except normkit.NormkitError:
        raise
    except Exception:  # noqa: BLE001 - some plugin computes constants at init, which needs real tensors
        try:
            build_run_model(cfg, norm, data)
        except normkit.NormkitError:
            raise
        except Exception:  # noqa: BLE001 - recorded as a failed run by `train_or_fail`
            return


def resolved_threads(cfg: TrainConfig, norm: str) -> int:
    """The CPU thread count runs of `norm` use (cfg.cpu_threads, or the automatic choice)."""
    if cfg.cpu_threads is not None:
        return cfg.cpu_threads
    data = run_dataset(cfg)
    with torch.device("meta"):
        params = sum(p.numel() for p in build_run_model(cfg, norm, data).parameters())
    with cpu_threads(check_device(cfg), None, params) as threads:
        return threads


def check_config(cfg: TrainConfig, norms: list[str]) -> None:
    """Validate a configuration and norms before any training; raises one-line NormkitErrors.

    Checks numbers, choices and limits (batch_size divisible by nproc_per_node), the device (and
    that amp/channels_last have CUDA, and a DDP run a device it can use), that the model, dataset
    and every norm exist with valid parameters, that the dataset is on disk (DatasetMissing
    otherwise), that the model's size is within MAX_MODEL_PARAMS and that it can host every norm.
    """
    _check_numbers(cfg)
    _check_processes(cfg, check_device(cfg))
    _require(isinstance(norms, (list, tuple)) and len(norms) > 0,
             "give at least one norm, e.g. --norms bn,bnn")
    for norm in norms:
        normkit.parse(norm)
    model_params(cfg.model, cfg.model_params)
    data = run_dataset(cfg)
    _check_size(cfg, list(norms), data)
    _check_budget(cfg, len(data.train))
    _require(len(data.val) > 0 and len(data.test) > 0,
             f"dataset {cfg.dataset!r} leaves no validation or test images (too few per class); "
             "use a larger dataset or a larger val_fraction")
    for norm in norms:
        _check_hosting(cfg, norm, data)
