"""Per-epoch checkpoints of one run, so an interrupted run resumes from its last finished epoch.

A checkpoint holds the model, optimizer, scheduler and AMP scaler states, every random generator a
run draws from (torch CPU and CUDA, numpy, random, the training loader's shuffling generator), the
finished epochs' records and the callbacks' state. Only tensors and plain values are stored, so it
loads with `torch.load(weights_only=True)`; resuming from it on CPU continues bit-identically to a
run that was never interrupted. Each save replaces the previous one atomically (only the last is
kept); the run's identity is stored with it and checked on load.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normkit_lab.atomic import atomic_replace_from
from normkit_lab.errors import ConfigError, one_line

FORMAT = 1


def rng_state(loader_generator: torch.Generator | None) -> dict[str, Any]:
    """Every generator a run draws from, as tensors and plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "random": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "loader": loader_generator.get_state() if loader_generator is not None else None,
    }


def restore_rng(state: dict[str, Any], loader_generator: torch.Generator | None) -> None:
    """Set every generator back to `state` (the inverse of `rng_state`)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    r = state["random"]
    random.setstate((r["version"], tuple(r["internal"]), r["gauss_next"]))
    if loader_generator is not None and state["loader"] is not None:
        loader_generator.set_state(state["loader"])


@dataclass(frozen=True)
class Checkpointing:
    """Where one run's checkpoint lives and whose it is (`identity`: plain values, checked on load).
    `save` False (DDP ranks other than 0) loads but never writes."""

    path: Path
    identity: dict[str, Any]
    save: bool = True

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when the run has none; a damaged or foreign file: one ConfigError."""
        if not self.path.is_file():
            return None
        hint = f"delete {str(self.path)!r} to restart that run from its first epoch"
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one line
            raise ConfigError(f"checkpoint {str(self.path)!r} cannot be read ({one_line(str(exc), 120)}); "
                              f"{hint}") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ConfigError(f"checkpoint {str(self.path)!r} is not a normkit checkpoint; {hint}")
        if state.get("identity") != json.dumps(self.identity, sort_keys=True):
            raise ConfigError(f"checkpoint {str(self.path)!r} belongs to another run or configuration; {hint}")
        return state

    def write(self, state: dict[str, Any]) -> None:
        """Replace the checkpoint with `state` in one step (a crash leaves the previous one)."""
        if not self.save:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        full = {**state, "format": FORMAT, "identity": json.dumps(self.identity, sort_keys=True)}
        with atomic_replace_from(self.path) as tmp:
            torch.save(full, tmp)

    def finish(self, keep_weights: Path | None) -> None:
        """The run ended: drop its checkpoint; with `keep_weights`, keep the final model weights there."""
        if not self.save:
            return
        if keep_weights is not None and self.path.is_file():
            state = torch.load(self.path, map_location="cpu", weights_only=True)
            with atomic_replace_from(keep_weights) as tmp:
                torch.save({"model": state["model"], "identity": state["identity"],
                            "epochs": len(state["records"]), "format": FORMAT}, tmp)
        self.path.unlink(missing_ok=True)
