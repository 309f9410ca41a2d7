"""Launch settings of the Triton kernels (module-level so tests can shrink them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KernelConfig:
    """row_max: largest group (elements) one program holds in registers (row path); larger groups
    take the split path with tiles of `chunk` elements. backward_row_max: the same for the
    backward, which keeps more values per element live (it is never above row_max). Both are
    the largest blocks that compile without register spills on sm_80/sm_90 at the launcher's
    warp counts (`python -m normkit_normalnorm.triton_kernels.aot`; docs/performance.md); a
    smaller backward_row_max pairs the row forward with the split backward, which regenerate the
    same noise. pointwise_block: elements per program of
    the eval kernel. interpreter_programs: program budget of one backward launch on CPU, where
    the interpreter runs programs one after another. version: counts changes of these settings (the
    launcher's per-shape plans are rebuilt after one)."""

    row_max: int = 4096
    backward_row_max: int = 4096
    chunk: int = 2048
    pointwise_block: int = 1024
    interpreter_programs: int = 4

    version: int = 0

    def __setattr__(self, name: str, value: object) -> None:
        """Any change of a setting (tests shrink them) bumps `version`, which keys the launch plans."""
        super().__setattr__(name, value)
        if name != "version":
            super().__setattr__("version", getattr(self, "version", 0) + 1)

    def backward_programs(self, device: torch.device) -> int:
        """Programs for the row backward: a few per SM on a GPU (partials stay small); without a device
        (fake CUDA tensors traced on a machine without a GPU) the interpreter's budget."""
        if device.type == "cuda" and torch.cuda.is_available():
            return 4 * torch.cuda.get_device_properties(device).multi_processor_count
        return self.interpreter_programs


config = KernelConfig()
