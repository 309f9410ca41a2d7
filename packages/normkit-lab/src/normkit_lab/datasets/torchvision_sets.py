"""torchvision datasets (MNIST, Fashion-MNIST, CIFAR-10/100, SVHN, STL-10), loaded into memory.

Never downloaded unless asked: a missing dataset raises DatasetMissing naming the directory and
the `--download` flag. Images are kept as uint8 tensors and standardized per channel with
statistics of the training split. The dataset's own test split is `test`; `val` is a fixed,
stratified VAL_FRACTION of its training split (the rest trains).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.splits import stratified_split
from normkit_lab.datasets.tensors import MIN_AUGMENT_SIZE, ImageTensors, channel_stats
from normkit_lab.errors import DatasetMissing

DATA_DIR_ENV = "NORMKIT_DATA_DIR"
VAL_FRACTION = 0.1


def data_root(ctx: DatasetContext) -> str:
    """`data_dir`, else $NORMKIT_DATA_DIR, else ./data."""
    return os.path.abspath(os.path.expanduser(ctx.data_dir or os.environ.get(DATA_DIR_ENV) or "data"))


@dataclass(frozen=True)
class TorchvisionSpec:
    name: str
    cls_name: str
    split_arg: str  # "train" (a bool) or "split" ("train"/"test")
    num_classes: int


SPECS = {
    "mnist": TorchvisionSpec("mnist", "MNIST", "train", 10),
    "fashion-mnist": TorchvisionSpec("fashion-mnist", "FashionMNIST", "train", 10),
    "cifar10": TorchvisionSpec("cifar10", "CIFAR10", "train", 10),
    "cifar100": TorchvisionSpec("cifar100", "CIFAR100", "train", 100),
    "svhn": TorchvisionSpec("svhn", "SVHN", "split", 10),
    "stl10": TorchvisionSpec("stl10", "STL10", "split", 10),
}


def _open(spec: TorchvisionSpec, root: str, train: bool, download: bool) -> Any:
    import torchvision.datasets as tvd

    cls = getattr(tvd, spec.cls_name)
    split = {"train": train} if spec.split_arg == "train" else {"split": "train" if train else "test"}
    try:
        return cls(root, download=download, **split)
    except RuntimeError as exc:
        if download:
            raise DatasetMissing(f"could not download {spec.name} into {root}: {exc}") from exc
        raise DatasetMissing(f"dataset {spec.name!r} not found in {root}; rerun with --download "
                             f"(download=True) to fetch it there, or pass --data-dir where it is") from exc
    except OSError as exc:
        raise DatasetMissing(f"could not read or download {spec.name} in {root}: {exc}") from exc


def _tensors(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, C, H, W) and int64 labels from a torchvision dataset's arrays."""
    data = ds.data if isinstance(ds.data, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(ds.data))
    if data.dim() == 3:  # MNIST-like: N, H, W
        data = data.unsqueeze(1)
    elif data.shape[-1] == 3 and data.shape[1] != 3:  # CIFAR: N, H, W, C
        data = data.permute(0, 3, 1, 2)
    labels = getattr(ds, "targets", None)
    if labels is None:
        labels = ds.labels
    return data.contiguous(), torch.as_tensor(np.asarray(labels), dtype=torch.long)


def torchvision_loader(name: str, *, augmentable: bool) -> Callable[..., DatasetBundle]:
    """A dataset factory for one torchvision dataset (with an `augment` parameter when >= 32 px)."""
    spec = SPECS[name]

    def load(ctx: DatasetContext, augment: bool = False) -> DatasetBundle:
        root = data_root(ctx)
        all_x, all_y = _tensors(_open(spec, root, True, ctx.download))
        test_x, test_y = _tensors(_open(spec, root, False, ctx.download))
        train_idx, val_idx = (torch.as_tensor(i, dtype=torch.long)
                              for i in stratified_split(all_y.tolist(), VAL_FRACTION))
        train_x, train_y = all_x[train_idx], all_y[train_idx]
        mean, std = channel_stats(train_x, 1 / 255)
        return DatasetBundle(
            spec.name,
            ImageTensors(train_x, train_y, mean, std, scale=1 / 255, augment=augment),
            ImageTensors(all_x[val_idx], all_y[val_idx], mean, std, scale=1 / 255),
            ImageTensors(test_x, test_y, mean, std, scale=1 / 255),
            num_classes=spec.num_classes, in_channels=train_x.shape[1], image_size=train_x.shape[-1],
        )

    def load_plain(ctx: DatasetContext) -> DatasetBundle:
        return load(ctx)

    if not augmentable:
        load_plain.__doc__ = f"{spec.cls_name} from torchvision (in memory, standardized per channel)."
        return load_plain
    load.__doc__ = (f"{spec.cls_name} from torchvision (in memory, standardized per channel); "
                    f"augment: random crop + flip (images >= {MIN_AUGMENT_SIZE} px).")
    return load

