"""Fixed, stratified, seed-independent held-out parts of a dataset (validation and test).

The split is part of the dataset, not of the run: every run seed, every norm and every tuning
run sees the same train / val / test images, so nothing that selects (best epoch, tuning)
can drift with the seed, and the test images are never in train or val.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

SPLIT_SEED = 0


def stratified_split(labels: Sequence[int], fraction: float, *, salt: int = 0) -> tuple[list[int], list[int]]:
    """(kept, held-out) indices: `fraction` of each class held out (at least one image of every class
    that has two or more). `salt` gives an independent split of the same labels (val vs test)."""
    gen = torch.Generator().manual_seed(SPLIT_SEED + salt)
    by_class: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        by_class.setdefault(int(label), []).append(i)
    kept, held = [], []
    for cls in sorted(by_class):
        idx = by_class[cls]
        order = [idx[j] for j in torch.randperm(len(idx), generator=gen).tolist()]
        n_held = max(1, round(len(idx) * fraction)) if len(idx) > 1 else 0
        held += order[:n_held]
        kept += order[n_held:]
    return sorted(kept), sorted(held)


def train_val_test(labels: Sequence[int], val_fraction: float,
                   test_fraction: float) -> tuple[list[int], list[int], list[int]]:
    """Indices of train, val and test: test held out first, then val from what is left."""
    rest, test = stratified_split(labels, test_fraction, salt=1)
    kept, val = stratified_split([labels[i] for i in rest], val_fraction)
    return [rest[i] for i in kept], [rest[i] for i in val], test
