"""A fixed, seeded sample of input batches from a dataset (the same for every norm and run seed)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

MIN_LAST_BATCH = 8  # a shorter tail batch is dropped (too few values for batch statistics)


@contextmanager
def untouched_rng() -> Iterator[None]:
    """Restore torch's, numpy's and Python's CPU generators afterwards (augmenting transforms draw
    from them, and the training run must not see a different random stream)."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def sample_batches(dataset: Dataset, *, count: int, batch_size: int, seed: int = 0,
                   device: torch.device | str = "cpu") -> list[Tensor]:
    """Up to `count` input batches of `batch_size` from a seeded permutation of `dataset`."""
    if count < 1 or batch_size < 1:
        raise ValueError(f"sample_batches needs count >= 1 and batch_size >= 1, got {count}, {batch_size}")
    size = len(dataset)  # type: ignore[arg-type]
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
    batches = []
    for start in range(0, min(size, count * batch_size), batch_size):
        idx = order[start:start + batch_size]
        if len(idx) < min(batch_size, MIN_LAST_BATCH):
            break
        with untouched_rng():
            batches.append(torch.stack([dataset[int(i)][0] for i in idx]).to(device))
    if not batches:
        raise ValueError(f"dataset has {size} samples, too few for a diagnostics batch")
    return batches
