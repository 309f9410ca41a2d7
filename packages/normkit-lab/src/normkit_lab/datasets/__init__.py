"""Datasets for experiments: each a factory `factory(ctx: DatasetContext, **params) -> DatasetBundle`.

    from normkit_lab.datasets import load_dataset
    data = load_dataset("digits")              # offline default
    data = load_dataset("cifar10", data_dir="~/data", download=True)
    data = load_dataset("/path/to/folder")     # any directory: an ImageFolder
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from normkit import plugins
from normkit.errors import SpecError, did_you_mean
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.digits import digits
from normkit_lab.datasets.fake import fake
from normkit_lab.datasets.folder import image_folder
from normkit_lab.datasets.text import hf, pysrc, text
from normkit_lab.datasets.torchvision_sets import torchvision_loader

__all__ = ["DatasetBundle", "DatasetContext", "dataset_params", "load_dataset", "register_builtin_datasets"]

_TV_CITATIONS = {
    "mnist": "LeCun, Bottou, Bengio & Haffner, Gradient-based learning applied to document recognition, 1998",
    "fashion-mnist": "Xiao, Rasul & Vollgraf, Fashion-MNIST, arXiv:1708.07747, 2017",
    "cifar10": "Krizhevsky, Learning Multiple Layers of Features from Tiny Images, 2009",
    "cifar100": "Krizhevsky, Learning Multiple Layers of Features from Tiny Images, 2009",
    "svhn": "Netzer et al., Reading Digits in Natural Images with Unsupervised Feature Learning, 2011",
    "stl10": "Coates, Lee & Ng, An Analysis of Single-Layer Networks in Unsupervised Feature Learning, 2011",
}


def register_builtin_datasets(register: Callable[..., Any]) -> None:
    """Register the lab's datasets (called from the `normkit_register_datasets` hook)."""
    register("digits", digits, skip=1, offline=True,
             summary="scikit-learn's bundled 8x8 digits (1797 images, 10 classes); offline default",
             citation="UCI Optical Recognition of Handwritten Digits (scikit-learn load_digits)")
    register("fake", fake, skip=1, offline=True,
             summary="torchvision FakeData: random images and labels, for smoke tests")
    register("pysrc", pysrc, skip=1, offline=True,
             summary="bytes of the Python standard library's source, split by file; offline LM default "
                     "(its hash changes with the Python version)")
    register("text", text, skip=1, offline=True,
             summary="bytes of a local text file or folder (--dataset-param path=...), split by 16 KiB chunk")
    register("hf", hf, skip=1, offline=False,
             summary="bytes of a Hugging Face corpus (optional 'datasets' package; --download), e.g. TinyStories")
    for name, citation in _TV_CITATIONS.items():
        augmentable = name not in ("mnist", "fashion-mnist")
        register(name, torchvision_loader(name, augmentable=augmentable), skip=1, offline=False,
                 citation=citation, summary=f"torchvision {name} (needs --data-dir; --download to fetch)")


def is_folder(name: str) -> bool:
    """True when `name` is an existing directory (loaded as an ImageFolder)."""
    return os.path.isdir(os.path.expanduser(name))


def dataset_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Type-check `params` against the dataset's declared parameters; unknown keys raise SpecError."""
    if is_folder(name):
        entry_name, declared = name, {p.name: p for p in _folder_params()}
    else:
        entry = plugins.registry().lookup_item("dataset", name)
        entry_name, declared = entry.name, {p.name: p for p in entry.params}
    typed = {}
    for key, value in params.items():
        if key not in declared:
            raise SpecError(f"dataset {entry_name!r} has no parameter {key!r}{did_you_mean(key, declared)};"
                            f" valid: {', '.join(declared) or 'none'}")
        typed[key] = declared[key].coerce(value, f"dataset {entry_name!r}")
    return typed


def _folder_params() -> tuple[Any, ...]:
    from normkit.params import signature_params

    return signature_params(image_folder, skip=2)


def load_dataset(name: str, *, data_dir: str | None = None, download: bool = False, seed: int = 0,
                 **params: Any) -> DatasetBundle:
    """Load a registered dataset, or an existing directory as an ImageFolder.

    Raises normkit_lab.errors.DatasetMissing when the data is not on disk (nothing is downloaded
    unless `download=True`) and normkit.SpecError for an unknown name or bad parameters.
    """
    typed = dataset_params(name, params)
    ctx = DatasetContext(data_dir, download, seed)
    if is_folder(name):
        return image_folder(os.path.expanduser(name), ctx, **typed)
    entry = plugins.registry().lookup_item("dataset", name)
    return entry.factory(ctx, **typed)
