"""Per-epoch checkpoints of one run, so an interrupted run resumes from its last finished epoch.

A checkpoint holds the model, optimizer, scheduler and AMP scaler states, every random generator a
run draws from (torch CPU and CUDA, numpy, random, the training loader's shuffling generator), the
finished epochs' records and the callbacks' state. Only tensors and plain values are stored, so it
loads with `torch.load(weights_only=True)`; resuming from it on CPU continues bit-identically to a
run that was never interrupted. Each save replaces the previous one atomically (only the last is
kept); the run's identity is stored with it and checked on load, and `check_state` compares every
part with the run about to use it (tensor shapes and dtypes, optimizer state, records against the
configured epochs, step counts, generator states): a file that does not fit is refused as damaged
(DamagedRunFile), never loaded. A write that fails (full disk, denied) is the machine's failure
(MachineFailure) and leaves the previous checkpoint in place.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normkit_lab.errors import DamagedRunFile, MachineFailure, one_line, os_error_text
from normkit_lab.store.atomic import atomic_replace_from
from normkit_lab.store.safe_paths import make_dirs, refuse_links

FORMAT = 1
STATE_KEYS = ("model", "optimizer", "scheduler", "scaler", "rng", "records", "steps", "extras", "callbacks")


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

    def damaged(self, problem: str) -> DamagedRunFile:
        """The one-line refusal of this run's checkpoint (kept on disk, nothing recorded)."""
        return DamagedRunFile(f"checkpoint {str(self.path)!r} {problem}; delete it to restart that run from its "
                              f"first epoch")

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when the run has none; a damaged or foreign file: one DamagedRunFile.

        Only the file's own structure is checked here; `check_state` checks it against the model."""
        try:
            if not self.path.exists() and not self.path.is_symlink():
                return None
            size = self.path.stat().st_size
        except OSError as exc:  # e.g. a symbolic link loop
            raise self.damaged(f"cannot be opened ({os_error_text(exc)})") from None
        if not self.path.is_file() or self.path.is_symlink():
            raise self.damaged("is not a regular file")
        if size == 0:
            raise self.damaged("is empty (a write was cut short)")
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one line
            raise self.damaged(f"cannot be read ({type(exc).__name__}: {one_line(str(exc), 120)})") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise self.damaged("is not a normkit checkpoint")
        if state.get("identity") != json.dumps(self.identity, sort_keys=True):
            raise self.damaged("belongs to another run or configuration")
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise self.damaged(f"lacks {', '.join(missing)}")
        return state

    def write(self, state: dict[str, Any]) -> None:
        """Replace the checkpoint with `state` in one step (a crash or a full disk leaves the previous one).

        An OSError (disk full, permissions) is the machine's failure: MachineFailure, naming the cause."""
        if not self.save:
            return
        full = {**state, "format": FORMAT, "identity": json.dumps(self.identity, sort_keys=True)}
        store = self.path.parent.parent  # <store>/checkpoints/<run>.pt
        try:
            make_dirs(store, self.path.parent)
            refuse_links(store, self.path)
            with atomic_replace_from(self.path) as tmp:
                torch.save(full, tmp)
        except OSError as exc:
            raise MachineFailure(f"cannot write checkpoint {str(self.path)!r}: {os_error_text(exc)}") from None
        except RuntimeError as exc:  # torch.save reports a failed write (e.g. a full disk) as RuntimeError
            raise MachineFailure(f"cannot write checkpoint {str(self.path)!r}: {one_line(str(exc), 160)}") from None

    def finish(self, keep_weights: Path | None) -> None:
        """The run ended: drop its checkpoint; with `keep_weights`, keep the final model weights there."""
        if not self.save:
            return
        if keep_weights is not None and self.path.is_file():
            refuse_links(keep_weights.parent.parent, keep_weights)
            state = torch.load(self.path, map_location="cpu", weights_only=True)
            with atomic_replace_from(keep_weights) as tmp:
                torch.save({"model": state["model"], "identity": state["identity"],
                            "epochs": len(state["records"]), "format": FORMAT}, tmp)
        self.path.unlink(missing_ok=True)


def _layout_problem(saved: Any, fresh: Any, where: str) -> str | None:
    """Where `saved` differs from `fresh` in structure: tensor shapes and dtypes, mapping keys, list lengths."""
    if isinstance(fresh, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            return f"{where} is not a tensor"
        if saved.shape != fresh.shape or saved.dtype != fresh.dtype:
            return (f"{where} is {saved.dtype} {tuple(saved.shape)}, the run needs {fresh.dtype} "
                    f"{tuple(fresh.shape)}")
        return None
    if isinstance(fresh, dict):
        if not isinstance(saved, dict) or set(saved) != set(fresh):
            return f"{where} has other entries than the run's"
        for key, value in fresh.items():
            problem = _layout_problem(saved[key], value, f"{where}.{key}")
            if problem:
                return problem
        return None
    if isinstance(fresh, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(fresh):
            return f"{where} has another length than the run's"
        for i, (a, b) in enumerate(zip(saved, fresh, strict=True)):
            problem = _layout_problem(a, b, f"{where}[{i}]")
            if problem:
                return problem
    return None


def _optimizer_problem(saved: Any, fresh: dict[str, Any], params: list[torch.Tensor]) -> str | None:
    """The optimizer's per-parameter state must match each parameter's shape and dtype."""
    if not isinstance(saved, dict) or set(saved) != {"state", "param_groups"}:
        return "optimizer is not an optimizer state"
    groups = saved["param_groups"]
    if not isinstance(groups, list) or [g.get("params") if isinstance(g, dict) else None for g in groups] != [
            g["params"] for g in fresh["param_groups"]]:
        return "optimizer holds other parameter groups than the run's"
    state = saved["state"]
    if not isinstance(state, dict):
        return "optimizer state is not a mapping"
    for index, entry in state.items():
        if not (isinstance(index, int) and 0 <= index < len(params)) or not isinstance(entry, dict):
            return f"optimizer state has an entry for unknown parameter {index!r}"
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                p = params[index]
                if value.shape != p.shape or value.dtype != p.dtype:
                    return (f"optimizer.state[{index}].{name} is {value.dtype} {tuple(value.shape)}, its parameter "
                            f"is {p.dtype} {tuple(p.shape)}")
    return None


def check_state(checkpoint: Checkpointing, saved: dict[str, Any], fresh: dict[str, Any],
                params: list[torch.Tensor], record_fields: list[str], epochs: int, steps_per_epoch: int,
                total_steps: int | None = None) -> None:
    """Refuse (DamagedRunFile) a checkpoint that does not fit the run about to use it, before anything is loaded.

    `fresh` is the state the run would save now (same model, optimizer, generators); `params` the optimizer's
    parameters in order. The records must be epochs 0..n-1 with n <= `epochs`, and the step counts must
    agree with n epochs of `steps_per_epoch` steps (at most `total_steps`, a run's budget), so edited
    records are caught."""
    problems = [_layout_problem(saved["model"], fresh["model"], "model")]
    rng, fresh_rng = saved["rng"], fresh["rng"]
    if isinstance(rng, dict):  # CUDA generators exist only where CUDA does (restored only there)
        problems.append(_layout_problem({**rng, "cuda": []}, {**fresh_rng, "cuda": []}, "rng"))
        cuda = rng.get("cuda")
        if not (isinstance(cuda, list) and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda)):
            problems.append("rng.cuda is not a list of generator states")
    else:
        problems.append("rng is not a mapping of generator states")
    problems.append(_optimizer_problem(saved["optimizer"], fresh["optimizer"], params))
    problems.append(_layout_problem(saved["scheduler"], fresh["scheduler"], "scheduler"))
    if (saved["scaler"] is None) != (fresh["scaler"] is None):
        problems.append("scaler does not match the run's mixed precision")
    records = saved["records"]
    if not isinstance(records, list) or not 1 <= len(records) <= epochs:
        count = len(records) if isinstance(records, list) else "no list of"
        problems.append(f"records hold {count} epochs, the run has {epochs}")
    elif any(not isinstance(r, dict) or sorted(r) != sorted(record_fields) or r.get("epoch") != i
             for i, r in enumerate(records)):
        problems.append("records are not the epochs 0, 1, ... in order with the run's measurements")
    else:
        steps = saved["steps"]
        last = saved["scheduler"].get("last_epoch") if isinstance(saved["scheduler"], dict) else None
        expected = len(records) * steps_per_epoch
        if total_steps is not None:
            expected = min(expected, total_steps)
        if not (isinstance(steps, int) and steps == expected and last == expected):
            problems.append(f"steps ({steps!r}, scheduler {last!r}) do not match {len(records)} epochs of "
                            f"{steps_per_epoch} steps")
    for key in ("extras", "callbacks"):
        try:
            ok = isinstance(json.loads(saved[key]), dict)
        except (TypeError, ValueError, RecursionError):
            ok = False
        if not ok:
            problems.append(f"{key} is not a JSON object")
    found = next((p for p in problems if p), None)
    if found:
        raise checkpoint.damaged(f"does not fit the run: {one_line(found, 200)}")
