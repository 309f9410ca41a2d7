"""Launch settings of the Triton kernels (module-level so tests can shrink them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KernelConfig:
    """row_max: largest group (elements) one program holds in registers (row path); larger groups
    take the split path with tiles of `chunk` elements. pointwise_block: elements per program of
    the eval kernel. interpreter_programs: program budget of one backward launch on CPU, where
    the interpreter runs programs one after another."""

    row_max: int = 8192
    chunk: int = 4096
    pointwise_block: int = 1024
    interpreter_programs: int = 4

    def backward_programs(self, device: torch.device) -> int:
        """Programs for the row backward: a few per SM on a GPU (partials stay small)."""
        if device.type == "cuda":
            return 4 * torch.cuda.get_device_properties(device).multi_processor_count
        return self.interpreter_programs


config = KernelConfig()
