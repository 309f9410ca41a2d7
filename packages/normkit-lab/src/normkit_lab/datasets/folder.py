"""Any existing directory as an ImageFolder (one sub-directory per class).

A directory with `train/` and `val/` (or `test/`) sub-directories uses those splits; otherwise a
fixed stratified split (independent of the run seed) holds out `val_fraction` of the images.
Images are converted to RGB, resized and centre-cropped to `image_size`, scaled to [-1, 1].
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.tensors import MIN_AUGMENT_SIZE, random_crop_flip
from normkit_lab.limits import MAX_IMAGE_SIZE

SPLIT_SEED = 0


class FolderImages(Dataset):
    """A subset of an ImageFolder served as standardized float tensors (loaded lazily from disk)."""

    def __init__(self, folder: Any, indices: list[int], image_size: int, augment: bool) -> None:
        from torchvision import transforms

        self.folder = folder
        self.indices = indices
        self.augment = augment
        self.transform = transforms.Compose([
            transforms.Resize(image_size), transforms.CenterCrop(image_size), transforms.ToTensor(),
        ])

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        path, label = self.folder.samples[self.indices[index]]
        x = self.transform(self.folder.loader(path).convert("RGB"))
        if self.augment:
            x = random_crop_flip(x)
        return (x - 0.5) / 0.5, int(label)


def _image_folder(path: str) -> Any:
    from torchvision.datasets import ImageFolder

    try:
        return ImageFolder(path)
    except (FileNotFoundError, RuntimeError) as exc:
        raise SpecError(f"{path}: not an image folder (one sub-directory of images per class): "
                        f"{exc}") from exc


def image_folder(path: str, ctx: DatasetContext, image_size: int = 32, val_fraction: float = 0.2,
                 augment: bool = False) -> DatasetBundle:
    """Load directory `path` as an ImageFolder dataset."""
    if not 1 <= image_size <= MAX_IMAGE_SIZE:
        raise SpecError(f"{path}: image_size must be in [1, {MAX_IMAGE_SIZE}], got {image_size}")
    if augment and image_size < MIN_AUGMENT_SIZE:
        raise SpecError(f"{path}: augmentation needs images of at least {MIN_AUGMENT_SIZE} px, "
                        f"got {image_size}")
    splits = [os.path.join(path, d) for d in ("val", "test")]
    val_dir = next((d for d in splits if os.path.isdir(d)), None)
    if os.path.isdir(os.path.join(path, "train")) and val_dir:
        train_folder, val_folder = _image_folder(os.path.join(path, "train")), _image_folder(val_dir)
        if train_folder.classes != val_folder.classes:
            raise SpecError(f"{path}: train/ and {os.path.basename(val_dir)}/ have different class folders")
        train_idx, val_idx = list(range(len(train_folder))), list(range(len(val_folder)))
    else:
        if not 0.0 < val_fraction < 1.0:
            raise SpecError(f"{path}: val_fraction must be in (0, 1), got {val_fraction}")
        train_folder = val_folder = _image_folder(path)
        train_idx, val_idx = _stratified_split([t for _, t in train_folder.samples], val_fraction)
    return DatasetBundle(
        os.path.basename(os.path.normpath(path)),
        FolderImages(train_folder, train_idx, image_size, augment),
        FolderImages(val_folder, val_idx, image_size, False),
        num_classes=len(train_folder.classes), in_channels=3, image_size=image_size,
    )


def _stratified_split(labels: list[int], val_fraction: float) -> tuple[list[int], list[int]]:
    """Hold out `val_fraction` of each class (at least one image where a class has two or more)."""
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    train, val = [], []
    for cls in sorted(set(labels)):
        idx = [i for i, t in enumerate(labels) if t == cls]
        order = [idx[j] for j in torch.randperm(len(idx), generator=gen).tolist()]
        n_val = max(1, round(len(idx) * val_fraction)) if len(idx) > 1 else 0
        val += order[:n_val]
        train += order[n_val:]
    return sorted(train), sorted(val)
