"""Any existing directory as an ImageFolder (one sub-directory per class).

A directory with `train/` plus `val/` and/or `test/` sub-directories uses those splits (a missing
`val/` is a fixed stratified `val_fraction` of `train/`; a missing `test/` takes `val/`'s place as the
test split); otherwise fixed stratified splits (independent of the run seed) hold out
`test_fraction` of the images as test and then `val_fraction` of the rest as val.
Images are converted to RGB, resized and centre-cropped to `image_size`, scaled to [-1, 1].
"""

from __future__ import annotations

import os
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset

from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.splits import stratified_split, train_val_test
from normkit_lab.datasets.tensors import MIN_AUGMENT_SIZE, random_crop_flip
from normkit_lab.limits import MAX_IMAGE_SIZE


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
                 test_fraction: float = 0.2, augment: bool = False) -> DatasetBundle:
    """Load directory `path` as an ImageFolder dataset."""
    if not 1 <= image_size <= MAX_IMAGE_SIZE:
        raise SpecError(f"{path}: image_size must be in [1, {MAX_IMAGE_SIZE}], got {image_size}")
    if augment and image_size < MIN_AUGMENT_SIZE:
        raise SpecError(f"{path}: augmentation needs images of at least {MIN_AUGMENT_SIZE} px, "
                        f"got {image_size}")
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise SpecError(f"{path}: {key} must be in (0, 1), got {value}")
    held = [d for d in ("val", "test") if os.path.isdir(os.path.join(path, d))]
    if os.path.isdir(os.path.join(path, "train")) and held:
        train_folder = _image_folder(os.path.join(path, "train"))
        test_folder = _image_folder(os.path.join(path, held[-1]))
        for name in held:
            if _image_folder(os.path.join(path, name)).classes != train_folder.classes:
                raise SpecError(f"{path}: train/ and {name}/ have different class folders")
        test_idx = list(range(len(test_folder)))
        if len(held) == 2:
            val_folder = _image_folder(os.path.join(path, "val"))
            train_idx, val_idx = list(range(len(train_folder))), list(range(len(val_folder)))
        else:
            val_folder = train_folder
            train_idx, val_idx = stratified_split([t for _, t in train_folder.samples], val_fraction)
    else:
        train_folder = val_folder = test_folder = _image_folder(path)
        train_idx, val_idx, test_idx = train_val_test([t for _, t in train_folder.samples], val_fraction,
                                                      test_fraction)
    return DatasetBundle(
        os.path.basename(os.path.normpath(path)),
        FolderImages(train_folder, train_idx, image_size, augment),
        FolderImages(val_folder, val_idx, image_size, False),
        FolderImages(test_folder, test_idx, image_size, False),
        num_classes=len(train_folder.classes), in_channels=3, image_size=image_size,
    )
