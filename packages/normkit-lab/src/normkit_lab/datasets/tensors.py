"""An in-memory image dataset: whole tensors, per-channel standardization, optional crop+flip."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import Dataset, default_collate

MIN_AUGMENT_SIZE = 32
CROP_PADDING = 4


def channel_stats(images: Tensor, scale: float, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std of `images * scale` (N, C, H, W), accumulated in float64 chunks."""
    c = images.shape[1]
    total, sq, count = torch.zeros(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64), 0
    for start in range(0, images.shape[0], chunk):
        x = images[start:start + chunk].to(torch.float64) * scale
        total += x.sum(dim=(0, 2, 3))
        sq += (x * x).sum(dim=(0, 2, 3))
        count += x.numel() // c
    mean = total / count
    std = (sq / count - mean * mean).clamp_min(1e-12).sqrt()
    return mean.float(), std.float()


class ImageTensors(Dataset):
    """Images (N, C, H, W) of any dtype and integer labels, served standardized as float32.

    Values are `images * scale` standardized with the given per-channel mean/std (computed on the
    training split, also used for validation). With `augment`, training images get a random
    crop (zero padding 4) and a random horizontal flip, drawn from torch's global RNG, which the
    training loop seeds.
    """

    def __init__(self, images: Tensor, labels: Tensor, mean: Tensor, std: Tensor, *, scale: float = 1.0,
                 augment: bool = False) -> None:
        self.images = images
        self.labels = labels.long()
        self.mean = mean.view(-1, 1, 1)
        self.std = std.view(-1, 1, 1)
        self.scale = scale
        self.augment = augment

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        x = self.images[index].float() * self.scale
        if self.augment:
            x = random_crop_flip(x)
        return (x - self.mean) / self.std, int(self.labels[index])

    def __getitems__(self, indices: list[int]) -> list[tuple[Tensor, int]]:
        """A DataLoader batch in one indexing, with the values `__getitem__` gives (elementwise arithmetic):
        fetching image by image cost as much as the forward passes that evaluate 12,000 images.
        Augmented images draw their crops one by one, in order, as `__getitem__` does."""
        if self.augment:
            return [self[i] for i in indices]
        x = (self.images[indices].float() * self.scale - self.mean) / self.std
        return Batch(x, self.labels[indices])


class Batch(list):
    """The samples of one batch (a list of `(image, label)`, as a DataLoader expects) that also keeps them
    stacked, so `collate` hands the stacked tensors on instead of stacking the samples again (for the
    12,000 images a digit-blends run evaluates, the stacking cost a quarter of a second)."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        super().__init__(zip(x.unbind(0), y.tolist(), strict=True))
        self.stacked = [x, y]


def collate(samples: list) -> list[Tensor]:
    """`default_collate` with the same values, but a `Batch` passes on its stacked tensors as they are."""
    if isinstance(samples, Batch):
        return list(samples.stacked)
    return default_collate(samples)


def random_crop_flip(x: Tensor) -> Tensor:
    """A random crop of the zero-padded image (padding 4) and a random horizontal flip."""
    _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (CROP_PADDING,) * 4)
    top, left = (int(v) for v in torch.randint(0, 2 * CROP_PADDING + 1, (2,)))
    x = padded[:, top:top + h, left:left + w]
    if torch.rand(()) < 0.5:
        x = x.flip(-1)
    return x
