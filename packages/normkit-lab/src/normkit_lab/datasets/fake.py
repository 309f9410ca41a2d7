"""`fake`: torchvision FakeData (random images and labels) for smoke tests; nothing to learn."""

from __future__ import annotations

import torch

from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.tensors import MIN_AUGMENT_SIZE, ImageTensors, channel_stats
from normkit_lab.limits import MAX_DATASET_BYTES, MAX_DATASET_SIZE, MAX_IMAGE_SIZE


def _materialize(size: int, shape: tuple[int, int, int], num_classes: int, offset: int):
    from torchvision.datasets import FakeData
    from torchvision.transforms import PILToTensor

    data = FakeData(size=size, image_size=shape, num_classes=num_classes, transform=PILToTensor(),
                    random_offset=offset)
    pairs = [data[i] for i in range(size)]
    images = torch.stack([img.reshape(shape) for img, _ in pairs])
    labels = torch.tensor([int(label) for _, label in pairs])
    return images, labels


def fake(ctx: DatasetContext, size: int = 256, image_size: int = 32, num_classes: int = 10,
         channels: int = 3, augment: bool = False) -> DatasetBundle:
    """`size` training, size/4 validation and size/4 test images (channels x image_size^2), deterministic per seed."""
    if size < 2 or image_size < 1 or num_classes < 2 or channels not in (1, 3):
        raise SpecError(f"fake: need size >= 2, image_size >= 1, num_classes >= 2, channels 1 or 3; "
                        f"got size={size}, image_size={image_size}, num_classes={num_classes}, "
                        f"channels={channels}")
    if image_size > MAX_IMAGE_SIZE or size > MAX_DATASET_SIZE or num_classes > MAX_DATASET_SIZE:
        raise SpecError(f"fake: need image_size <= {MAX_IMAGE_SIZE}, size <= {MAX_DATASET_SIZE:,} and "
                        f"num_classes <= {MAX_DATASET_SIZE:,}; got image_size={image_size}, size={size}, "
                        f"num_classes={num_classes} (see Limits in docs/experiments.md)")
    nbytes = size * 5 // 4 * channels * image_size**2
    if nbytes > MAX_DATASET_BYTES:
        raise SpecError(f"fake: {size:,} images of {channels}x{image_size}x{image_size} need "
                        f"{nbytes / 2**30:.1f} GiB; at most {MAX_DATASET_BYTES / 2**30:.0f} GiB "
                        f"(lower size or image_size)")
    if augment and image_size < MIN_AUGMENT_SIZE:
        raise SpecError(f"fake: augmentation needs images of at least {MIN_AUGMENT_SIZE} px, "
                        f"got {image_size}")
    shape = (channels, image_size, image_size)
    base = ctx.seed * 10 * size
    train_x, train_y = _materialize(size, shape, num_classes, base)
    held = max(size // 4, 1)
    val_x, val_y = _materialize(held, shape, num_classes, base + size)
    test_x, test_y = _materialize(held, shape, num_classes, base + size + held)
    mean, std = channel_stats(train_x, 1 / 255)
    return DatasetBundle(
        "fake",
        ImageTensors(train_x, train_y, mean, std, scale=1 / 255, augment=augment),
        ImageTensors(val_x, val_y, mean, std, scale=1 / 255),
        ImageTensors(test_x, test_y, mean, std, scale=1 / 255),
        num_classes=num_classes, in_channels=channels, image_size=image_size,
    )
