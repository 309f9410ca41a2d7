"""Option defaults shown in `normkit compare --help`, without importing the lab (torch) at start-up.

A copy of `normkit_lab.spec.defaults()`; tests/test_cli_startup.py checks the two agree, so a
new or changed config key fails the tests until it is added here too.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "seeds": [0, 1, 2, 3, 4], "baseline": None, "diagnostics": False, "select": "final",
    "metric": "test_acc", "margin": None,
    "tune": {}, "tune_seeds": None, "sweep": {}, "ablate": False, "looks": None, "max_seeds": None,
    "max_cpu_minutes": None,
    "model": "small-cnn", "model_params": {}, "dataset": "digit-blends", "dataset_params": {},
    "data_dir": None, "download": False, "epochs": 5, "batch_size": 128, "lr": None, "optimizer": "sgd",
    "momentum": 0.9, "weight_decay": None, "norm_weight_decay": None, "weight_decay_policy": "uniform",
    "schedule": "cosine", "warmup_epochs": 0, "step_size": 30,
    "gamma": 0.1, "label_smoothing": 0.0, "augment": False, "amp": False, "channels_last": False,
    "compile": False, "device": "auto", "num_workers": 0, "cpu_threads": None,
    "nproc_per_node": 1, "budget": None, "norm_batch": None,
    "command": None, "command_dir": None, "timeout": None, "train_function": None, "code_files": None,
}

# Keys that may change when resuming (a copy of normkit_lab.records.RUNTIME_KEYS, checked by the same test).
RUNTIME_KEYS = frozenset({"device", "data_dir", "download", "num_workers", "diagnostics", "timeout"})

# The primary metrics and epoch selections `normkit report` offers (copies of normkit_lab.metrics', checked
# by the same test).
METRIC_NAMES = ("test_acc", "test_loss", "val_acc", "val_loss", "test_bpb", "val_bpb", "test_bpb_last3",
                "val_bpb_last3")
DEFAULT_METRIC = "test_acc"
SELECTS = ("final", "best-val")
