"""Datasets for experiments: each a factory `factory(ctx: DatasetContext, **params) -> DatasetBundle`.

    from normkit_lab.datasets import load_dataset
    data = load_dataset("digits")              # offline default
    data = load_dataset("cifar10", data_dir="~/data", download=True)
    data = load_dataset("./my-images")         # a path (./, /, ~/ or with a /): an ImageFolder
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from normkit import plugins
from normkit.errors import SpecError
from normkit_lab.datasets.bundle import DatasetBundle, DatasetContext
from normkit_lab.datasets.digits import digits
from normkit_lab.datasets.fake import fake
from normkit_lab.datasets.folder import image_folder
from normkit_lab.datasets.text import hf, pysrc, text
from normkit_lab.datasets.torchvision_sets import torchvision_loader
from normkit_lab.errors import one_line
from normkit_lab.item_params import typed_params

__all__ = ["DatasetBundle", "DatasetContext", "dataset_params", "load_dataset", "register_builtin_datasets"]

_TV_CITATIONS = {
    "mnist": "LeCun, Bottou, Bengio & Haffner, Gradient-based learning applied to document recognition, 1998",
    "fashion-mnist": "Xiao, Rasul & Vollgraf, Fashion-MNIST, arXiv:1708.07747, 2017",
    "cifar10": "Krizhevsky, Learning Multiple Layers of Features from Tiny Images, 2009",
    "cifar100": "Krizhevsky, Learning Multiple Layers of Features from Tiny Images, 2009",
    "svhn": "Netzer et al., Reading Digits in Natural Images with Unsupervised Feature Learning, 2011",
    "stl10": "Coates, Lee & Ng, An Analysis of Single-Layer Networks in Unsupervised Feature Learning, 2011",
}


# The default design (`normkit compare --norms bn,bnn,gn+pn`): every norm at SGD lr 0.02, at a batch
# of 2 and of 16 images, each cell trained for the same 500 optimizer steps, so the interaction test
# asks whether a norm's gap to the baseline depends on the batch without the confound of training
# length (docs/experiments.md, "The default"). The sweep and the budget are a design: they apply only
# when none of epochs, budget, batch_size and sweep is given (then one epoch at a batch of 2).
DIGITS_TRAIN = {"epochs": 1, "batch_size": 2, "lr": 0.02, "budget": "steps=500", "sweep": {"batch_size": [2, 16]}}


def register_builtin_datasets(register: Callable[..., Any]) -> None:
    """Register the lab's datasets (called from the `normkit_register_datasets` hook)."""
    register("digits", digits, skip=1, offline=True, train_defaults=DIGITS_TRAIN,
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


def is_path_form(name: str) -> bool:
    """True when `name` is written as a path (`./x`, `../x`, `/abs`, `~/x`, or holding a `/`).

    Only path forms load image folders; a bare name always means a registered dataset, so a
    directory called `digits` in the working directory never shadows the built-in `digits`.
    """
    return name.startswith(("~", ".")) or "/" in name or os.sep in name


def is_folder(name: str) -> bool:
    """True when `name` is in path form (see `is_path_form`); it must then be an existing directory."""
    if not is_path_form(name):
        return False
    path = os.path.expanduser(name)
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise SpecError(f"dataset path {name!r} {what}; give an image folder (one sub-directory per "
                        f"class) or a dataset name from `normkit list`")
    return True


def _registered(name: str) -> Any:
    """The registry entry of dataset `name`, with a hint when a same-named directory exists."""
    try:
        return plugins.registry().lookup_item("dataset", name)
    except SpecError as exc:
        if os.path.isdir(name):
            raise SpecError(f"{one_line(str(exc))}; to load the directory {name!r} as an image folder, "
                            f"write it as a path: ./{name}") from None
        raise


def dataset_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Type-check `params` against the dataset's declared parameters; unknown keys raise SpecError."""
    if is_folder(name):
        return typed_params(f"dataset {name!r}", _folder_params(), params)
    entry = _registered(name)
    return typed_params(f"dataset {entry.name!r}", entry.params, params)


def _folder_params() -> tuple[Any, ...]:
    from normkit.params import signature_params

    return signature_params(image_folder, skip=2)


def load_dataset(name: str, *, data_dir: str | None = None, download: bool = False, seed: int = 0,
                 **params: Any) -> DatasetBundle:
    """Load a registered dataset by name, or a directory written as a path as an ImageFolder.

    Raises normkit_lab.errors.DatasetMissing when the data is not on disk (nothing is downloaded
    unless `download=True`) and normkit.SpecError for an unknown name or bad parameters.
    """
    typed = dataset_params(name, params)
    ctx = DatasetContext(data_dir, download, seed)
    if is_folder(name):
        return image_folder(os.path.expanduser(name), ctx, **typed)
    entry = _registered(name)
    return entry.factory(ctx, **typed)
