"""`digit-blends`: a generated 8x8 digit set large enough to resolve a comparison, offline.

Every image blends two handwritten digits of one class from scikit-learn's bundled set (1797 images,
17 grey levels), at a random ratio, shifted by up to one pixel, with integer noise. The source
images are split first (the `digits` split: test sources held out first, then val), so no test
image shares a source with a training image: a model is tested on blends of writers it never saw.

Generation is integer arithmetic on numpy's PCG64 integer draws (whose streams numpy keeps stable),
so every machine builds the same bytes (`metadata["sha256"]` records them) in well under a second;
standardization uses exact integer sums. The default 8,000 test images make one image 0.0125
points and the per-run binomial noise at 95 % accuracy sqrt(0.95 * 0.05 / 8000) = 0.24 points.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.splits import train_val_test
from normkit_lab.datasets.tensors import ImageTensors

LEVELS = 16  # the bundled digits' grey levels are 0..16
WEIGHTS = 4  # blend a * w + b * (4 - w), w in 1..3
NOISE = 12  # integer noise in [-12, 12] on the 0..64 scale
MAX_IMAGES = 200_000


def digit_blends(ctx: DatasetContext, train: int = 16_000, val: int = 4_000, test: int = 8_000) -> DatasetBundle:
    """Generated 1x8x8 images in 10 balanced classes (train / val / test sizes as given)."""
    from sklearn.datasets import load_digits

    for key, value in (("train", train), ("val", val), ("test", test)):
        if not 10 <= value <= MAX_IMAGES:
            raise SpecError(f"digit-blends: {key} must be between 10 and {MAX_IMAGES:,} images, got {value}")
    data = load_digits()
    images = data.images.astype(np.int64)  # exact small integers stored as floats by scikit-learn
    labels = data.target.astype(np.int64)
    pools = train_val_test(labels.tolist(), 0.2, 0.2)
    parts = [_blend(images, labels, np.asarray(pool), n, salt)
             for salt, (pool, n) in enumerate(zip(pools, (train, val, test), strict=True))]
    digest = hashlib.sha256(b"".join(x.tobytes() + y.tobytes() for x, y in parts)).hexdigest()
    train_x = parts[0][0].astype(np.int64)
    count = train_x.size
    total, squares = int(train_x.sum()), int((train_x * train_x).sum())  # exact: int64
    mean = total / count
    std = (squares / count - mean * mean) ** 0.5
    mean_t, std_t = torch.tensor([mean], dtype=torch.float32), torch.tensor([std], dtype=torch.float32)
    splits = [ImageTensors(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y), mean_t, std_t) for x, y in parts]
    return DatasetBundle("digit-blends", *splits, num_classes=10, in_channels=1, image_size=8,
                         metadata={"sha256": digest, "sizes": [train, val, test]})


def _blend(images: np.ndarray, labels: np.ndarray, pool: np.ndarray, n: int,
           salt: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` blended images (uint8, 0..64) and their labels from the source images `pool`."""
    rng = np.random.Generator(np.random.PCG64(1000 + salt))
    y = rng.permutation(np.arange(n) % 10)
    by_class = pool[np.argsort(labels[pool], kind="stable")]  # the pool's sources, class by class
    sizes = np.bincount(labels[pool], minlength=10)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    a = images[by_class[starts[y] + rng.integers(0, sizes[y])]]
    b = images[by_class[starts[y] + rng.integers(0, sizes[y])]]
    w = rng.integers(1, WEIGHTS, size=(n, 1, 1))
    mixed = a * w + b * (WEIGHTS - w)  # 0..64
    padded = np.pad(mixed, ((0, 0), (1, 1), (1, 1)))
    top, left = rng.integers(0, 3, size=n), rng.integers(0, 3, size=n)
    rows = top[:, None] + np.arange(8)[None, :]
    cols = left[:, None] + np.arange(8)[None, :]
    shifted = padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
    noisy = shifted + rng.integers(-NOISE, NOISE + 1, size=shifted.shape)
    return np.clip(noisy, 0, LEVELS * WEIGHTS).astype(np.uint8), y.astype(np.int64)
