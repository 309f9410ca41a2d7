"""`digit-blends`: generated offline, the same bytes on every machine, balanced, large enough to resolve,
and its test images made from source digits no training image uses."""

from __future__ import annotations

import pytest
import torch

import normkit
from normkit_lab.datasets import load_dataset
from normkit_lab.datasets.splits import train_val_test

# The bytes of the default splits (numpy PCG64 integer draws and integer arithmetic only): a change to
# the generator or to numpy's stream shows here, on any machine.
SHA256 = "7b585c58494ed819fe8611bcc4f758ea303fd6eadbb7fae6b93ee2863d27b32b"


@pytest.fixture(scope="module")
def blends():
    return load_dataset("digit-blends")


def test_the_default_splits_are_fixed_bytes_sized_to_resolve_a_comparison(blends):
    assert blends.metadata == {"sha256": SHA256, "sizes": [16_000, 4_000, 8_000]}
    assert (len(blends.train), len(blends.val), len(blends.test)) == (16_000, 4_000, 8_000)
    assert (0.95 * 0.05 / len(blends.test)) ** 0.5 * 100 <= 0.3  # binomial noise at 95 % accuracy, in points
    for split in (blends.train, blends.val, blends.test):
        assert torch.bincount(split.labels, minlength=10).tolist() == [len(split) // 10] * 10
        assert split.images.dtype == torch.uint8 and int(split.images.max()) <= 64


def test_standardization_uses_the_exact_integer_moments_of_train(blends):
    x = blends.train.images.double()
    assert abs(float(blends.train.mean) - x.mean().item()) < 1e-5
    assert abs(float(blends.train.std) - x.std(unbiased=False).item()) < 1e-5
    image, label = blends.test[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32 and 0 <= label < 10


def test_test_images_come_from_source_digits_that_no_training_image_uses():
    import numpy as np
    from sklearn.datasets import load_digits

    from normkit_lab.datasets.digit_blends import NOISE, _blend

    data = load_digits()
    images, labels = data.images.astype(np.int64), data.target.astype(np.int64)
    train_pool, _, test_pool = train_val_test(labels.tolist(), 0.2, 0.2)
    assert not set(train_pool) & set(test_pool)
    # blanks the test pool's sources and saturates every other: a blend reading only its pool is noise
    marked = np.full_like(images, 16)
    marked[test_pool] = 0
    x, y = _blend(marked, labels, np.asarray(test_pool), 500, salt=2)
    assert x.shape == (500, 8, 8) and int(x.max()) <= NOISE and sorted(set(y.tolist())) == list(range(10))


def test_sizes_are_parameters_and_bad_ones_fail_in_one_line():
    small = load_dataset("digit-blends", train=100, val=20, test=30)
    assert (len(small.train), len(small.val), len(small.test)) == (100, 20, 30)
    assert small.metadata["sha256"] != SHA256
    with pytest.raises(normkit.SpecError, match="digit-blends: test must be between 10 and 200,000 images"):
        load_dataset("digit-blends", test=5)
