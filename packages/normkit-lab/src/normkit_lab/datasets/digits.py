"""`digits`: scikit-learn's bundled 8x8 handwritten digits, the offline default (no download)."""

from __future__ import annotations

import torch

from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.splits import train_val_test
from normkit_lab.datasets.tensors import ImageTensors


def digits(ctx: DatasetContext, val_fraction: float = 0.2, test_fraction: float = 0.2) -> DatasetBundle:
    """1797 images 1x8x8, 10 classes; fixed stratified test (held out first), then val; standardized."""
    from sklearn.datasets import load_digits

    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.05 <= value <= 0.5:
            raise SpecError(f"digits: {key} must be in [0.05, 0.5], got {value}")
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(data.target, dtype=torch.long)
    train_idx, val_idx, test_idx = (torch.as_tensor(i, dtype=torch.long) for i in
                                    train_val_test(data.target.tolist(), val_fraction, test_fraction))
    mean, std = x[train_idx].mean().view(1), x[train_idx].std().view(1)
    return DatasetBundle(
        "digits",
        ImageTensors(x[train_idx], y[train_idx], mean, std),
        ImageTensors(x[val_idx], y[val_idx], mean, std),
        ImageTensors(x[test_idx], y[test_idx], mean, std),
        num_classes=10, in_channels=1, image_size=8,
    )
