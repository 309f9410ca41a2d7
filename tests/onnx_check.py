"""Shared by the real-model export tests: export with a dynamic batch, run in onnxruntime."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from torch import nn


def onnx_and_eager(model: nn.Module, inputs: Callable[[int], torch.Tensor], path: Path,
                   batches: Sequence[int] = (1, 3)) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(onnxruntime output, eager output) at each batch size, from one export at batch 2 whose batch
    dimension is dynamic (so the other sizes prove it)."""
    ort = pytest.importorskip("onnxruntime")
    logging.disable(logging.WARNING)  # the exporter logs each step
    try:
        torch.onnx.export(model, (inputs(2),), str(path), dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    finally:
        logging.disable(logging.NOTSET)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    pairs = []
    for n in batches:
        x = inputs(n)
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            pairs.append((torch.from_numpy(got), model(x)))
    return pairs
