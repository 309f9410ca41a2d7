"""`digits`: scikit-learn's bundled 8x8 handwritten digits, the offline default (no download)."""

from __future__ import annotations

import torch

from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.tensors import ImageTensors

SPLIT_SEED = 0  # the split is part of the dataset, the same for every run seed


def digits(ctx: DatasetContext, val_fraction: float = 0.2) -> DatasetBundle:
    """1797 images 1x8x8, 10 classes; a fixed stratified train/validation split; standardized."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.05 <= val_fraction <= 0.5:
        raise SpecError(f"digits: val_fraction must be in [0.05, 0.5], got {val_fraction}")
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(data.target, dtype=torch.long)
    train_idx, val_idx = train_test_split(torch.arange(len(y)).numpy(), test_size=val_fraction,
                                          stratify=data.target, random_state=SPLIT_SEED)
    train_idx, val_idx = torch.as_tensor(train_idx), torch.as_tensor(val_idx)
    mean, std = x[train_idx].mean().view(1), x[train_idx].std().view(1)
    return DatasetBundle(
        "digits",
        ImageTensors(x[train_idx], y[train_idx], mean, std),
        ImageTensors(x[val_idx], y[val_idx], mean, std),
        num_classes=10, in_channels=1, image_size=8,
    )
