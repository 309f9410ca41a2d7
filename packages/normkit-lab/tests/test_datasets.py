"""Datasets: the offline digits default, fake data, torchvision sets that are never downloaded
unless asked, and image folders."""

from __future__ import annotations

import collections

import pytest
import torch

import normkit
from normkit import plugins
from normkit_lab.datasets import load_dataset
from normkit_lab.datasets.torchvision_sets import SPECS
from normkit_lab.errors import DatasetMissing


def _labels(dataset) -> list[int]:
    return [dataset[i][1] for i in range(len(dataset))]


def test_digits_has_fixed_stratified_disjoint_train_val_and_test():
    data = load_dataset("digits", seed=0)
    assert len(data.train) + len(data.val) + len(data.test) == 1797
    assert (len(data.train), len(data.val), len(data.test)) == (1151, 287, 359)
    assert (data.num_classes, data.in_channels, data.image_size) == (10, 1, 8)
    x, y = data.train[0]
    assert x.dtype == torch.float32 and x.shape == (1, 8, 8) and isinstance(y, int)
    counts = [collections.Counter(_labels(split)) for split in (data.train, data.val, data.test)]
    for cls in range(10):  # every class keeps its share: test 20% of all, val 20% of the rest
        total = sum(c[cls] for c in counts)
        assert abs(counts[2][cls] / total - 0.2) < 0.02
        assert abs(counts[1][cls] / (counts[0][cls] + counts[1][cls]) - 0.2) < 0.02
    train = torch.stack([data.train[i][0] for i in range(len(data.train))])
    assert abs(train.mean().item()) < 1e-4 and abs(train.std().item() - 1) < 1e-3


def test_digits_split_does_not_depend_on_the_seed():
    a, b = load_dataset("digits", seed=0), load_dataset("digits", seed=7)
    assert torch.equal(a.val.images, b.val.images) and torch.equal(a.train.labels, b.train.labels)
    assert torch.equal(a.test.images, b.test.images)


def test_train_val_test_indices_are_disjoint_and_cover_everything():
    from normkit_lab.datasets.splits import train_val_test

    labels = [i % 3 for i in range(60)]
    train, val, test = train_val_test(labels, 0.25, 0.2)
    assert sorted(train + val + test) == list(range(60))
    assert [sum(labels[i] == c for i in test) for c in range(3)] == [4, 4, 4]
    assert [sum(labels[i] == c for i in val) for c in range(3)] == [4, 4, 4]
    assert train_val_test(labels, 0.25, 0.2) == (train, val, test)


def test_digits_rejects_a_silly_validation_fraction():
    with pytest.raises(normkit.SpecError, match="val_fraction"):
        load_dataset("digits", val_fraction=0.9)


def test_fake_data_has_the_requested_shape():
    data = load_dataset("fake", size=12, image_size=16, num_classes=3, channels=1)
    x, y = data.train[0]
    assert x.shape == (1, 16, 16) and 0 <= y < 3
    assert (len(data.train), len(data.val), data.num_classes, data.in_channels) == (12, 3, 3, 1)
    assert len(data.test) == 3 and not torch.equal(data.val.images, data.test.images)
    again = load_dataset("fake", size=12, image_size=16, num_classes=3, channels=1)
    assert torch.equal(data.train.images, again.train.images)


def test_fake_augmentation_crops_and_flips_but_keeps_the_shape():
    data = load_dataset("fake", size=4, image_size=32, augment=True)
    torch.manual_seed(0)
    views = [data.train[0][0] for _ in range(6)]
    assert all(v.shape == (3, 32, 32) for v in views)
    assert any(not torch.equal(views[0], v) for v in views[1:])
    assert not data.val.augment


def test_augmentation_refuses_small_images():
    with pytest.raises(normkit.SpecError, match="at least 32 px"):
        load_dataset("fake", size=4, image_size=8, augment=True)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_missing_torchvision_dataset_says_where_and_how_to_download(name, tmp_path):
    with pytest.raises(DatasetMissing) as info:
        load_dataset(name, data_dir=str(tmp_path))
    message = str(info.value)
    assert str(tmp_path) in message and "--download" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # nothing was downloaded or created


def _write_idx(path, magic: int, array) -> None:
    import numpy as np

    header = np.array([magic, *array.shape], dtype=">i4").tobytes()
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_mnist_on_disk_is_loaded_into_memory_and_standardized(tmp_path):
    import numpy as np

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 4)):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", 2051, rng.integers(0, 256, (n, 28, 28)))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", 2049, np.arange(n) % 10)
    data = load_dataset("mnist", data_dir=str(tmp_path))
    shape = (len(data.train), len(data.test), data.num_classes, data.in_channels, data.image_size)
    assert shape == (6, 4, 10, 1, 28) and len(data.val) == 0  # one image per class: nothing to hold out
    train = torch.stack([data.train[i][0] for i in range(6)])
    assert train.shape == (6, 1, 28, 28) and abs(train.mean().item()) < 1e-4
    assert _labels(data.test) == [0, 1, 2, 3]


def test_dataset_missing_is_a_normkit_error():
    assert issubclass(DatasetMissing, normkit.NormkitError)


def test_unknown_dataset_and_parameter_are_spec_errors():
    with pytest.raises(normkit.SpecError, match="unknown dataset 'digit'.*digits"):
        load_dataset("digit")
    with pytest.raises(normkit.SpecError, match="no parameter 'sise'.*size"):
        load_dataset("fake", sise=3)


def test_all_datasets_are_registered_through_the_plugin_hook():
    entries = {e.name: e for e in plugins.registry().of_kind("dataset") if e.plugin == "lab"}
    # byte corpora: test_text_datasets.py
    assert set(entries) == {"digit-blends", "digits", "fake", "pysrc", "text", "hf", *SPECS}


def _write_images(folder, classes=("cat", "dog"), per_class=5, size=10):
    from PIL import Image

    for cls in classes:
        (folder / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (size, size), (i * 40, 0, 0)).save(folder / cls / f"{i}.png")


def test_a_directory_is_loaded_as_an_image_folder_with_a_stratified_split(tmp_path):
    _write_images(tmp_path)
    data = load_dataset(str(tmp_path), image_size=8, val_fraction=0.4)
    assert (data.num_classes, data.in_channels, data.image_size) == (2, 3, 8)
    assert sorted(_labels(data.test)) == [0, 1]  # 20% of each class's 5 images
    assert sorted(_labels(data.val)) == [0, 0, 1, 1] and len(data.train) == 4
    x, _ = data.train[0]
    assert x.shape == (3, 8, 8) and x.min() >= -1 and x.max() <= 1


def test_a_directory_with_train_and_val_uses_them(tmp_path):
    _write_images(tmp_path / "train", per_class=3)
    _write_images(tmp_path / "val", per_class=1)
    data = load_dataset(str(tmp_path), image_size=8)
    assert (len(data.train), len(data.val), len(data.test)) == (4, 2, 2)  # val/ is the test split
    _write_images(tmp_path / "test", per_class=2)
    data = load_dataset(str(tmp_path), image_size=8)
    assert (len(data.train), len(data.val), len(data.test)) == (6, 2, 4)


def test_a_directory_without_class_folders_is_a_clear_error(tmp_path):
    with pytest.raises(normkit.SpecError, match="not an image folder"):
        load_dataset(str(tmp_path))
