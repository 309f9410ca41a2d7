"""The training loop: it learns, repeats exactly for a seed, records divergence, calls callbacks,
and check_config refuses bad configurations before any training."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import normkit
from normkit_lab.errors import DatasetMissing
from normkit_lab.records import EpochRecord, RunResult
from normkit_lab.runs.checks import check_config
from normkit_lab.runs.schedule import lr_factor
from normkit_lab.runs.training import train_run
from normkit_lab.spec import TrainConfig

TIMING_FIELDS = {"epoch_time_s", "cpu_time_s", "load_avg", "throughput", "peak_mem_mb"}
DIGITS = TrainConfig(dataset="digits", epochs=2, batch_size=64, model_params={"width": 16})
# resnet18 ends at 1x1 on 8x8 images, so its last BatchNorms fail on a training batch of one.
FAKE = TrainConfig(model="resnet18", model_params={"width": 4}, dataset="fake",
                   dataset_params={"size": 9, "image_size": 8, "num_classes": 12}, epochs=1, batch_size=4)


def _measured(result: RunResult) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(r).items() if k not in TIMING_FIELDS} for r in result.epochs]


def test_small_cnn_learns_digits_in_two_epochs():
    result = train_run(DIGITS, "bn", seed=0)
    assert result.status == "ok" and result.norm == "bn" and result.seed == 0
    assert [r.epoch for r in result.epochs] == [0, 1]
    last = result.epochs[-1]
    assert last.val_acc > 0.6 and last.train_acc > 0.3  # chance is 0.1
    assert last.val_top5 is None  # only reported for more than 10 classes
    assert last.epoch_time_s > 0 and last.throughput > 0 and last.peak_mem_mb > 0
    assert result.params == sum(p.numel() for p in _small_cnn(16).parameters())


def _small_cnn(width: int) -> torch.nn.Module:
    from normkit_lab.models import build_model

    return build_model("small-cnn", "bn", num_classes=10, in_channels=1, image_size=8, width=width)


def test_a_seed_repeats_exactly_and_another_seed_differs():
    first, again = train_run(DIGITS, "bn", seed=1), train_run(DIGITS, "bn", seed=1)
    assert _measured(first) == _measured(again)
    assert _measured(train_run(DIGITS, "bn", seed=2)) != _measured(first)


def test_noisy_norm_repeats_exactly_for_a_seed():
    pytest.importorskip("normkit_normalnorm")
    cfg = dataclasses.replace(DIGITS, epochs=1)
    assert _measured(train_run(cfg, "bnn", seed=0)) == _measured(train_run(cfg, "bnn", seed=0))


def test_huge_learning_rate_is_recorded_as_diverged():
    result = train_run(dataclasses.replace(DIGITS, lr=1e6), "bn", seed=0)
    assert result.status == "diverged"
    assert result.extras["diverged_at"]["epoch"] == 0
    assert all(math.isfinite(r.train_loss) for r in result.epochs)


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_start(self, model, data, device) -> None:
        self.calls.append(("start", data.name, device.type))

    def on_epoch_end(self, model, epoch) -> None:
        self.calls.append(("epoch", epoch))

    def on_end(self, model) -> dict:
        self.calls.append(("end",))
        return {"epochs_seen": sum(1 for c in self.calls if c[0] == "epoch")}


def test_callbacks_and_on_epoch_are_called_in_order():
    recorder, records = Recorder(), []
    result = train_run(DIGITS, "bn", seed=0, on_epoch=records.append, callbacks=[recorder])
    assert recorder.calls == [("start", "digits", "cpu"), ("epoch", 0), ("epoch", 1), ("end",)]
    assert records == result.epochs and all(isinstance(r, EpochRecord) for r in records)
    assert result.extras["recorder"] == {"epochs_seen": 2}


def test_top5_is_reported_above_ten_classes_and_a_last_batch_of_one_is_dropped():
    # 9 images in batches of 4 would leave a batch of one, which BatchNorm cannot train on.
    result = train_run(FAKE, "bn", seed=0)
    assert result.status == "ok"
    assert 0.0 <= result.epochs[0].val_top5 <= 1.0


def test_adamw_with_warmup_step_schedule_and_label_smoothing_runs():
    cfg = dataclasses.replace(FAKE, epochs=2, optimizer="adamw", schedule="step", step_size=1, gamma=0.5,
                              warmup_epochs=1, label_smoothing=0.1)
    result = train_run(cfg, "bn", seed=0)
    assert result.status == "ok"
    assert result.epochs[0].lr == pytest.approx(1e-3 / 2)  # first step of a 2-step warm-up
    assert result.epochs[1].lr == pytest.approx(1e-3 * 0.5)


def test_schedules():
    cosine = lr_factor("cosine", total_steps=10, steps_per_epoch=5)
    assert cosine(0) == 1.0 and cosine(5) == pytest.approx(0.5) and cosine(9) < 0.03
    warm = lr_factor("cosine", total_steps=20, steps_per_epoch=5, warmup_epochs=2)
    assert [warm(i) for i in range(3)] == pytest.approx([0.1, 0.2, 0.3]) and warm(10) == 1.0
    step = lr_factor("step", total_steps=18, steps_per_epoch=2, step_size=3, gamma=0.1)
    assert (step(5), step(6), step(12)) == pytest.approx((1.0, 0.1, 0.01))
    assert lr_factor("none", total_steps=6, steps_per_epoch=2)(5) == 1.0


def test_check_config_accepts_the_default_comparison():
    check_config(TrainConfig(dataset="digits"), ["bn", "gn+pn"])


@pytest.mark.parametrize(("changes", "norms", "message"), [
    ({"model": "resnet19"}, ["bn"], "unknown model 'resnet19'"),
    ({"dataset": "digitz"}, ["bn"], "unknown dataset 'digitz'"),
    ({}, ["bn", "bogus"], "unknown norm or stage 'bogus'"),
    ({}, [], "at least one norm"),
    ({"epochs": 0}, ["bn"], r"epochs must be an integer in \[1, 10,000\]"),
    ({"batch_size": 2.5}, ["bn"], "batch_size"),
    ({"lr": -1.0}, ["bn"], "lr must be a number > 0"),
    ({"optimizer": "adam"}, ["bn"], "optimizer must be one of sgd, adamw"),
    ({"schedule": "linear"}, ["bn"], "schedule must be one of"),
    ({"warmup_epochs": 9}, ["bn"], "warmup_epochs"),
    ({"momentum": 1.0}, ["bn"], "momentum"),
    ({"label_smoothing": 1.0}, ["bn"], "label_smoothing"),
    ({"device": "tpu"}, ["bn"], "device"),
    ({"model_params": {"widht": 3}}, ["bn"], "no parameter 'widht'"),
    ({"dataset_params": {"val_fraction": "x"}}, ["bn"], "val_fraction"),
    ({"augment": True}, ["bn"], "no augmentation.*drop --augment"),
    ({"model": "resnet18", "model_params": {"width": 32}}, ["bn", "gn+pn"], "cannot host 'gn\\+pn'.*preact"),
])
def test_check_config_refuses_with_one_line(changes, norms, message):
    with pytest.raises(normkit.NormkitError, match=message) as info:
        check_config(dataclasses.replace(TrainConfig(dataset="digits"), **changes), norms)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_amp_without_cuda_is_refused():
    with pytest.raises(normkit.NormkitError, match="amp needs a CUDA device"):
        check_config(dataclasses.replace(TrainConfig(dataset="digits"), amp=True), ["bn"])


def test_check_config_reports_a_missing_dataset(tmp_path):
    cfg = TrainConfig(dataset="cifar10", data_dir=str(tmp_path))
    with pytest.raises(DatasetMissing, match="--download"):
        check_config(cfg, ["bn"])


@pytest.mark.slow
def test_compiled_model_trains():
    result = train_run(dataclasses.replace(DIGITS, compile=True, epochs=1), "bn", seed=0)
    assert result.status == "ok" and result.epochs[0].val_acc > 0.3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("norm", ["bn", "gn+pn", "bnn"])
def test_amp_and_channels_last_train_on_cuda(norm):
    if norm == "bnn":
        pytest.importorskip("normkit_normalnorm")
    cfg = dataclasses.replace(DIGITS, device="cuda", amp=True, channels_last=True)
    check_config(cfg, [norm])
    result = train_run(cfg, norm, seed=0)
    assert result.status == "ok" and result.epochs[-1].val_acc > 0.6
    assert all(r.peak_mem_mb > 0 for r in result.epochs)
