"""One training run of one norm and one seed (the checks before any training: `normkit_lab.runs.checks`).

    from normkit_lab.runs.checks import check_config
    from normkit_lab.runs.training import train_run
    from normkit_lab.spec import TrainConfig
    cfg = TrainConfig(epochs=3)                     # small-cnn on digits
    check_config(cfg, ["bn", "bnn", "gn+pn"])
    result = train_run(cfg, "bnn", seed=0)

The seed fixes the initialization (set before the model is built), the data order (a seeded
generator for the DataLoader) and the norms' noise (torch's global RNG), so runs of different
norms with the same seed pair up.

Inside an initialized torch.distributed group of K > 1 processes (`normkit_lab.runs.distributed`
launches one per run with `nproc_per_node` K) the same call trains one DistributedDataParallel
run: batch_size stays the global batch (each process takes batch_size / K of it, drawn by a
DistributedSampler seeded by the seed), batch statistics are reduced across the processes
(`normkit.convert_sync`), every reported metric is reduced to its global value, and only rank 0
writes (checkpoint, loggers, callbacks, on_epoch). Every rank builds the same initialization
from the seed; afterwards ranks r > 0 re-seed torch's global RNG with seed + r * RANK_SEED_STRIDE,
so the norms' noise is independent across processes, as it is across the samples of one process
(rank 0 keeps the single-process stream).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, Subset

import normkit
from normkit_lab.datasets import DatasetBundle
from normkit_lab.datasets.tensors import collate
from normkit_lab.records import EpochRecord, RunResult
from normkit_lab.runs.checkpoints import Checkpointing, check_state, restore_rng, rng_state
from normkit_lab.runs.checks import build_run_model, check_device, check_divisible, run_dataset
from normkit_lab.runs.device import cpu_threads, peak_memory_mb, reset_peak_memory, synchronize
from normkit_lab.runs.environment import load_average, usable_cores
from normkit_lab.runs.lm_metrics import bits_per_byte
from normkit_lab.runs.optimizers import build_optimizer
from normkit_lab.runs.schedule import lr_factor
from normkit_lab.spec import TrainConfig

if TYPE_CHECKING:
    from normkit_lab.runs.loggers import RunLogger

EVAL_BATCH_SIZE = 512
CUDA_FINITE_CHECK_EVERY = 25  # steps between loss checks on GPU (each check waits for the GPU)
RANK_SEED_STRIDE = 1_000_003  # DDP rank r > 0 re-seeds torch with seed + r * this after building the model


class Callback(Protocol):
    """A read-only observer of a run (e.g. diagnostics); `on_end` returns JSON-able results.

    A callback that accumulates over epochs may also define `state() -> dict` and
    `load_state(dict)` (JSON-able), which checkpoints save and restore on a mid-run resume.
    """

    name: str

    def on_start(self, model: nn.Module, data: DatasetBundle, device: torch.device) -> None: ...

    def on_epoch_end(self, model: nn.Module, epoch: int) -> None: ...

    def on_end(self, model: nn.Module) -> dict[str, Any]: ...


# -- processes (DDP) ----------------------------------------------------------------------------


def _world() -> tuple[int, int]:
    """(rank, world size) of the initialized torch.distributed group; (0, 1) outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _rank_device(device: torch.device) -> torch.device:
    """A DDP rank's device: cuda without an index becomes this rank's GPU (LOCAL_RANK)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def _sum_over_ranks(values: Sequence[Tensor | float], device: torch.device) -> list[float]:
    """Every value summed over the processes, in one all_reduce (float64, exact for counts below 2**53)."""
    t = torch.stack([v.detach().to(device, torch.float64).reshape(()) if isinstance(v, Tensor)
                     else torch.tensor(float(v), dtype=torch.float64, device=device) for v in values])
    dist.all_reduce(t)
    return t.tolist()


def _finite(loss_sum: Tensor) -> bool:
    """Whether the loss is finite, on every process: all ranks must agree to stop, or one would hang."""
    if _world()[1] == 1:
        return bool(torch.isfinite(loss_sum))
    total = loss_sum.detach().clone()
    dist.all_reduce(total)  # a nan or inf anywhere makes the sum non-finite
    return bool(torch.isfinite(total))


@contextmanager
def _local_statistics(model: nn.Module) -> Iterator[None]:
    """The model with its synced layers computing on this process's batch alone (then synced again).

    Callbacks run on rank 0 only; a batch-statistics forward pass there must not wait for the others.
    """
    synced = [m for m in model.modules() if getattr(m, "sync", None) is not None]
    saved = [m.sync for m in synced]
    for m in synced:
        m.sync = None
    try:
        yield
    finally:
        for m, sync in zip(synced, saved, strict=True):
            m.sync = sync


def _ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _ranks_rng(loader: DataLoader) -> list[dict[str, Any]] | None:
    """Every rank's generators (a collective: all ranks call it), so a resume restores each one's own noise."""
    if _world()[1] == 1:
        return None
    states: list[Any] = [None] * _world()[1]
    dist.all_gather_object(states, rng_state(loader.generator))
    return states


# -- training -------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and random: the model's init and the norms' noise."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    groups = normkit.param_groups(model, cfg.resolved_weight_decay, norm_weight_decay=cfg.resolved_norm_weight_decay,
                                  plugin_policy=cfg.weight_decay_policy == "plugin")
    return build_optimizer(cfg.optimizer, groups, model, cfg.resolved_lr, cfg.momentum)


def _amp_dtype() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


@dataclass
class _Step:
    """What one training step needs: the (possibly compiled) model, loss, optimizer, AMP state."""

    model: nn.Module
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    device: torch.device
    amp_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    channels_last: bool
    loggers: tuple[RunLogger, ...] = ()
    steps: int = 0  # optimizer steps taken over the whole run (checkpointed)
    eval_model: nn.Module | None = None  # DDP: the unwrapped model, so evaluation never communicates

    def inputs(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        x = x.to(self.device, non_blocking=True)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def forward(self, x: Tensor, model: nn.Module | None = None) -> Tensor:
        model = self.model if model is None else model
        if self.amp_dtype is None:
            return model(x)
        with torch.autocast(self.device.type, dtype=self.amp_dtype):
            return model(x)

    def train(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.forward(x)
        loss = self.loss_fn(logits.float().flatten(0, -2), y.flatten())  # (N,T,V) sequences -> tokens
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.steps += 1
        if self.loggers:
            lr = self.optimizer.param_groups[0]["lr"]
            for logger in self.loggers:
                logger.on_step(self.steps, loss.detach(), lr)
        self.scheduler.step()
        return loss.detach(), logits.detach()


def _train_epoch(step: _Step, loader: DataLoader, limit: int) -> tuple[float, float, int, int | None]:
    """One pass over the training data, or its first `limit` steps (the end of a steps budget):
    (mean loss, accuracy, samples, failing step or None).

    Under DDP the loss, accuracy and samples are over all processes, and every process stops at the
    same failing step."""
    step.model.train()
    loss_sum = torch.zeros((), device=step.device)
    correct = torch.zeros((), device=step.device, dtype=torch.long)
    seen = 0
    check_every = CUDA_FINITE_CHECK_EVERY if step.device.type == "cuda" else 1
    for i, (x, y) in enumerate(loader):
        if i == limit:
            break
        x, y = step.inputs(x, y)
        loss, logits = step.train(x, y)
        loss_sum += loss * y.numel()
        correct += (logits.argmax(dim=-1) == y).sum()
        seen += y.numel()
        if (i + 1) % check_every == 0 and not _finite(loss_sum):
            return math.nan, math.nan, seen, i
    if not _finite(loss_sum):
        return math.nan, math.nan, seen, min(len(loader), limit) - 1
    if _world()[1] > 1:
        total_loss, total_correct, total = _sum_over_ranks([loss_sum, correct, seen], step.device)
        return total_loss / total, total_correct / total, int(total), None
    return loss_sum.item() / seen, correct.item() / seen, seen, None


@torch.no_grad()
def _evaluate(step: _Step, loader: DataLoader, top5: bool) -> tuple[float, float, float | None]:
    """Mean loss, accuracy and top-5 accuracy in eval mode; under DDP each process evaluates its shard
    of `loader`'s split and the sums are reduced (running statistics are the same on every rank)."""
    model = step.model if step.eval_model is None else step.eval_model
    model.eval()
    loss_sum = torch.zeros((), device=step.device, dtype=torch.float64)
    correct = torch.zeros((), device=step.device, dtype=torch.long)
    correct5 = torch.zeros((), device=step.device, dtype=torch.long)
    seen = 0
    for x, y in loader:
        x, y = step.inputs(x, y)
        logits, y = step.forward(x, model).float().flatten(0, -2), y.flatten()  # sequences count per token
        loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(dim=1) == y).sum()
        if top5:
            correct5 += (logits.topk(5, dim=1).indices == y[:, None]).any(dim=1).sum()
        seen += y.shape[0]
    if _world()[1] > 1:
        total_loss, total_correct, total_correct5, total = _sum_over_ranks(
            [loss_sum, correct, correct5, seen], step.device)
        return total_loss / total, total_correct / total, (total_correct5 / total if top5 else None)
    return loss_sum.item() / seen, correct.item() / seen, (correct5.item() / seen if top5 else None)


def _loaders(cfg: TrainConfig, data: DatasetBundle, seed: int,
             device: torch.device) -> tuple[DataLoader, DataLoader, DataLoader]:
    pin = device.type == "cuda"
    if _world()[1] > 1:
        return _rank_loaders(cfg, data, seed, pin)
    train = DataLoader(data.train, batch_size=cfg.batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(seed),
                       drop_last=len(data.train) > cfg.batch_size,  # a last batch of 1 breaks BN
                       num_workers=cfg.num_workers, pin_memory=pin, collate_fn=collate,
                       persistent_workers=cfg.num_workers > 0)
    val, test = (DataLoader(split, batch_size=max(cfg.batch_size, EVAL_BATCH_SIZE), shuffle=False,
                            num_workers=cfg.num_workers, pin_memory=pin, collate_fn=collate)
                  for split in (data.val, data.test))
    return train, val, test


def _rank_loaders(cfg: TrainConfig, data: DatasetBundle, seed: int,
                  pin: bool) -> tuple[DataLoader, DataLoader, DataLoader]:
    """This DDP rank's loaders: its share of every global batch (a DistributedSampler seeded by `seed`,
    reshuffled per epoch by `set_epoch`, the same number of batches on every rank) and every K-th
    validation and test sample. The generator only seeds loader workers; it is kept for checkpoints."""
    rank, world = _world()
    per_rank = cfg.batch_size // world
    sampler = DistributedSampler(data.train, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    train = DataLoader(data.train, batch_size=per_rank, sampler=sampler, generator=torch.Generator().manual_seed(seed),
                       drop_last=len(sampler) > per_rank,  # as one process: drop a last partial batch
                       num_workers=cfg.num_workers, pin_memory=pin, collate_fn=collate,
                       persistent_workers=cfg.num_workers > 0)
    val, test = (DataLoader(Subset(split, range(rank, len(split), world)),
                            batch_size=max(per_rank, EVAL_BATCH_SIZE), shuffle=False,
                            num_workers=cfg.num_workers, pin_memory=pin, collate_fn=collate)
                  for split in (data.val, data.test))
    return train, val, test


def train_run(cfg: TrainConfig, norm: str, seed: int, *,
              on_epoch: Callable[[EpochRecord], None] | None = None,
              callbacks: Sequence[Callback] = (), checkpoint: Checkpointing | None = None,
              loggers: Sequence[RunLogger] = ()) -> RunResult:
    """Train `cfg.model` with every norm built from `norm`, seeded by `seed`; evaluate every epoch.

    Stops with status "diverged" when the training or validation loss is not finite.
    `on_epoch(record)` is called after each finished epoch; callbacks see the model at the
    start, after each epoch and at the end (their `on_end` results go to `extras[name]`).
    With `checkpoint`, every finished epoch is saved there and a run that finds a checkpoint
    continues after its last epoch (bit-identical on CPU to an uninterrupted run). `loggers`
    receive every step's loss and learning rate and every epoch's record.

    Under torch.distributed with K > 1 processes it trains one DDP run (see the module docstring);
    the caller passes hooks to rank 0 only and a `Checkpointing(save=False)` to the others, which
    still load it on resume. Rank 0's per-step logger losses are its own shard's; epoch records
    are global (peak memory and epoch time are rank 0's).
    """
    device = check_device(cfg)
    rank, world = _world()
    if world > 1:
        check_divisible(cfg.batch_size, world)
        device = _rank_device(device)
    data = run_dataset(cfg)
    seed_everything(seed)
    model = build_run_model(cfg, norm, data).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if world > 1:
        normkit.convert_sync(model)  # before DDP wraps it; the same init on every rank (DDP also broadcasts)
        if rank > 0:
            torch.manual_seed(seed + RANK_SEED_STRIDE * rank)  # independent noise per process
    result = RunResult(normkit.parse(norm).text, seed, "ok", [], sum(p.numel() for p in model.parameters()))
    if data.metadata:
        result.extras["dataset"] = data.metadata  # e.g. the corpus's content hash
    with cpu_threads(device, cfg.cpu_threads, result.params) as threads:
        result.threads = threads
        _fit(cfg, model, data, device, result, _Hooks(on_epoch, tuple(callbacks), checkpoint, tuple(loggers)))
    return result


@dataclass(frozen=True)
class _Hooks:
    """Everything outside the training arithmetic that a run reports to or restores from."""

    on_epoch: Callable[[EpochRecord], None] | None = None
    callbacks: tuple[Callback, ...] = ()
    checkpoint: Checkpointing | None = None
    loggers: tuple[RunLogger, ...] = ()


def add_bits_per_byte(record: EpochRecord, data: DatasetBundle) -> None:
    """Fill val_bpb (and test_bpb where the record has a test loss) for byte-level datasets."""
    per_token = data.metadata.get("bytes_per_token")
    if per_token is None:
        return
    record.val_bpb = bits_per_byte(record.val_loss, per_token)
    if record.test_loss is not None:
        record.test_bpb = bits_per_byte(record.test_loss, per_token)


def _fit(cfg: TrainConfig, model: nn.Module, data: DatasetBundle, device: torch.device, result: RunResult,
         hooks: _Hooks) -> None:
    train_loader, val_loader, test_loader = _loaders(cfg, data, result.seed, device)
    distributed = _world()[1] > 1
    optimizer = _optimizer(cfg, model)
    per_epoch = len(train_loader)
    total_steps, epochs = cfg.total_steps(per_epoch), cfg.run_epochs(per_epoch)
    factor = lr_factor(cfg.schedule, total_steps=total_steps, steps_per_epoch=per_epoch,
                       warmup_epochs=cfg.warmup_epochs, step_size=cfg.step_size, gamma=cfg.gamma)
    amp_dtype = _amp_dtype() if cfg.amp else None
    trained = _ddp(model, device) if distributed else model
    step = _Step(
        model=torch.compile(trained) if cfg.compile else trained,
        loss_fn=nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, factor),
        device=device, amp_dtype=amp_dtype,
        scaler=torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None,
        channels_last=cfg.channels_last,
        loggers=hooks.loggers,
    )
    if distributed:
        step.eval_model = torch.compile(model) if cfg.compile else model
    with _local_statistics(model):
        for cb in hooks.callbacks:
            cb.on_start(model, data, device)
    start_epoch = _resume(hooks, model, step, train_loader, result, epochs, total_steps)
    for epoch in range(start_epoch, epochs):
        if isinstance(train_loader.sampler, DistributedSampler):
            train_loader.sampler.set_epoch(epoch)
        lr = optimizer.param_groups[0]["lr"]
        reset_peak_memory(device)
        synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        train_loss, train_acc, seen, failed_step = _train_epoch(step, train_loader, total_steps - step.steps)
        synchronize(device)
        elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
        if failed_step is not None:
            result.status, result.extras["diverged_at"] = "diverged", {"epoch": epoch, "step": failed_step}
            break
        val_loss, val_acc, val_top5 = _evaluate(step, val_loader, top5=data.num_classes > 10)
        if not math.isfinite(val_loss):
            result.status, result.extras["diverged_at"] = "diverged", {"epoch": epoch, "step": None}
            break
        test_loss, test_acc, _ = _evaluate(step, test_loader, top5=False)
        record = EpochRecord(epoch, train_loss, train_acc, val_loss, val_acc, val_top5, elapsed,
                             seen / elapsed, peak_memory_mb(device), lr, test_loss=test_loss, test_acc=test_acc,
                             steps=step.steps, cpu_time_s=cpu_time, load_avg=load_average()[0],
                             cpu_cores=usable_cores())
        add_bits_per_byte(record, data)
        result.epochs.append(record)
        for logger in hooks.loggers:
            logger.on_epoch(record)
        if hooks.on_epoch is not None:
            hooks.on_epoch(record)
        with _local_statistics(model):
            for cb in hooks.callbacks:
                cb.on_epoch_end(model, epoch)
        if hooks.checkpoint is not None:
            ranks_rng = _ranks_rng(train_loader)  # DDP: a collective, before the rank-0-only write
            if hooks.checkpoint.save:
                state = _checkpoint_state(model, step, train_loader, result, hooks.callbacks)
                if ranks_rng is not None:
                    state["ranks_rng"] = ranks_rng
                hooks.checkpoint.write(state)
    with _local_statistics(model):
        for cb in hooks.callbacks:
            result.extras[cb.name] = cb.on_end(model)


def _checkpoint_state(model: nn.Module, step: _Step, loader: DataLoader, result: RunResult,
                      callbacks: Sequence[Callback]) -> dict[str, Any]:
    """What a run needs to continue after this epoch exactly as if it had not stopped."""
    return {
        "model": model.state_dict(),
        "optimizer": step.optimizer.state_dict(),
        "scheduler": step.scheduler.state_dict(),
        "scaler": step.scaler.state_dict() if step.scaler is not None else None,
        "rng": rng_state(loader.generator),
        "records": [r.as_dict() for r in result.epochs],
        "steps": step.steps,
        "extras": json.dumps(result.extras),
        "callbacks": json.dumps({cb.name: cb.state() for cb in callbacks if hasattr(cb, "state")}),
    }


def _resume(hooks: _Hooks, model: nn.Module, step: _Step, loader: DataLoader, result: RunResult,
            epochs: int, total_steps: int) -> int:
    """Load the run's checkpoint, if it has one, after checking every part of it against this run
    (`checkpoints.check_state`; anything off is DamagedRunFile); returns the first epoch still to train."""
    state = hooks.checkpoint.load() if hooks.checkpoint is not None else None
    if state is None:
        for logger in hooks.loggers:  # a fresh start: drop what an earlier attempt logged
            logger.on_resume([], 0)
        return 0
    params = [p for group in step.optimizer.param_groups for p in group["params"]]
    check_state(hooks.checkpoint, state, _checkpoint_state(model, step, loader, result, hooks.callbacks), params,
                [f.name for f in dataclasses.fields(EpochRecord)], epochs, len(loader), total_steps)
    model.load_state_dict(state["model"])
    step.optimizer.load_state_dict(state["optimizer"])
    step.scheduler.load_state_dict(state["scheduler"])
    if step.scaler is not None and state["scaler"] is not None:
        step.scaler.load_state_dict(state["scaler"])
    restore_rng(state["rng"], loader.generator)
    rank, world = _world()
    if rank > 0:  # rank 0's generators are "rng"; the others resume their own noise streams
        ranks_rng = state.get("ranks_rng")
        if isinstance(ranks_rng, list) and len(ranks_rng) == world:
            restore_rng(ranks_rng[rank], loader.generator)
        else:
            torch.manual_seed(result.seed + RANK_SEED_STRIDE * rank + len(state["records"]))
    result.epochs = [EpochRecord(**r) for r in state["records"]]
    result.extras.update(json.loads(state["extras"]))
    step.steps = int(state["steps"])
    saved = json.loads(state["callbacks"])
    for cb in hooks.callbacks:
        if cb.name in saved and hasattr(cb, "load_state"):
            cb.load_state(saved[cb.name])
    for logger in hooks.loggers:
        logger.on_resume(list(result.epochs), step.steps)
    return len(result.epochs)
