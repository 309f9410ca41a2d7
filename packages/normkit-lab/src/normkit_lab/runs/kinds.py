"""Which trainer a comparison's runs use: its `command`, a Python function, or the built-in loop.

Kept apart from the `Trainer` protocol (`normkit_lab.runs.trainer`) because it imports every
implementation, and every implementation imports the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from normkit_lab.errors import ConfigError
from normkit_lab.runs.builtin import BuiltinTrainer
from normkit_lab.runs.command import CommandTrainer
from normkit_lab.runs.function import FunctionTrainer
from normkit_lab.runs.trainer import Trainer
from normkit_lab.spec import CompareConfig


def make_trainer(cfg: CompareConfig, function: Callable[..., Any] | None = None) -> Trainer:
    """The trainer of `cfg`: its `command`, else the `function` given, else the built-in loop."""
    if cfg.command is not None:
        return CommandTrainer.of(cfg)
    if function is not None:
        return FunctionTrainer.of(cfg, function)
    if cfg.train_function is not None:
        raise ConfigError(f"this comparison trains the Python function {cfg.train_function}; resume it from Python "
                          f"with compare_norms(..., train={cfg.train_function.rpartition(':')[2]}, resume=DIR)")
    return BuiltinTrainer()
