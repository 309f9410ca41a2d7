"""The training callback: representation measures at initialization and after training.

    from normkit_lab.diagnostics import DiagnosticsCallback
    result = train_run(cfg, "bnn", seed=0, callbacks=[DiagnosticsCallback()])
    result.extras["diagnostics"]     # {"init": ..., "init_noise_robustness": ..., "final": ..., "lambda": ...,
                                     #  "noise_robustness": ...}

At initialization the measures use batch statistics (running statistics hold nothing yet) with the
training noise off; after training, eval mode. A measure's change from initialization (final minus
init, paired by seed) separates what training did from what a norm does by construction.

Every measure runs without gradients on a fixed sample of validation batches, in eval mode or on a
deep copy, with the random generators untouched, so the training run is the same with or without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from normkit_lab.diagnostics.lambdas import estimated_lambdas, running_lambdas
from normkit_lab.diagnostics.measures import QQ_BATCHES, QQ_CHANNELS, measure_layers
from normkit_lab.diagnostics.robustness import DELTA, DRAWS, noise_robustness
from normkit_lab.diagnostics.sampling import sample_batches

SAMPLE_SEED = 0  # the sample of batches and channels is the same for every norm and run seed


@dataclass(frozen=True)
class DiagnosticsSettings:
    """How much to measure: Q-Q channels and batches (paper: 20 and 10), noise factor, draws, sources."""

    channels: int = QQ_CHANNELS
    batches: int = QQ_BATCHES
    batch_size: int = 64
    delta: float = DELTA
    draws: int = DRAWS
    sources: int | None = 6


class DiagnosticsCallback:
    """`train_run` callback: init measures in `on_start`, lambdas each epoch, the rest in `on_end`."""

    name = "diagnostics"

    def __init__(self, settings: DiagnosticsSettings | None = None) -> None:
        self.settings = settings or DiagnosticsSettings()
        self._val: list[Tensor] = []
        self._scale: list[Tensor] = []
        self._result: dict[str, Any] = {}

    def on_start(self, model: nn.Module, data: Any, device: torch.device) -> None:
        s = self.settings
        self._val = sample_batches(data.val, count=s.batches, batch_size=s.batch_size, seed=SAMPLE_SEED,
                                   device=device)
        self._scale = sample_batches(data.train, count=min(s.batches, 4), batch_size=s.batch_size,
                                     seed=SAMPLE_SEED, device=device)
        self._result = {
            "settings": asdict(s),
            "init": measure_layers(model, self._val, mode="batch", channels=s.channels, seed=SAMPLE_SEED),
            "init_noise_robustness": noise_robustness(
                model, self._val, scale_batches=self._scale, delta=s.delta, draws=s.draws, sources=s.sources,
                seed=SAMPLE_SEED, mode="batch"),
            "lambda": [],
        }
        self._record_lambdas(model, epoch=-1)

    def on_epoch_end(self, model: nn.Module, epoch: int) -> None:
        self._record_lambdas(model, epoch)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (the measures so far), so a resumed run reports every epoch's lambdas."""
        return self._result

    def load_state(self, state: dict[str, Any]) -> None:
        self._result = state

    def on_end(self, model: nn.Module) -> dict[str, Any]:
        s, result = self.settings, self._result
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            result["final"] = None
            result["noise_robustness"] = None
            result["skipped"] = "parameters are not finite (the run diverged)"
        else:
            result["final"] = measure_layers(model, self._val, mode="eval", channels=s.channels,
                                             seed=SAMPLE_SEED)
            result["noise_robustness"] = noise_robustness(
                model, self._val, scale_batches=self._scale, delta=s.delta, draws=s.draws, sources=s.sources,
                seed=SAMPLE_SEED)
        self._val, self._scale = [], []
        return result

    def _record_lambdas(self, model: nn.Module, epoch: int) -> None:
        """Lambdas after `epoch` (0-based; -1 is the initialization), when the model has any: running
        lambdas, and for per-sample/token layers (lnn) those estimated on the first sample batch."""
        layers = running_lambdas(model) + estimated_lambdas(model, self._val[:1])
        if layers:
            self._result["lambda"].append({"epoch": epoch + 1, "layers": layers})


def callbacks_for(enabled: bool) -> Callable[[], tuple[DiagnosticsCallback, ...]]:
    """The per-run callback factory `run_compare` takes: a fresh DiagnosticsCallback per run, or none."""
    if not enabled:
        return tuple
    return lambda: (DiagnosticsCallback(),)
