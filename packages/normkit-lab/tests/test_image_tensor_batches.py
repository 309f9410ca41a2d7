"""ImageTensors serves a DataLoader batch in one indexing (`__getitems__`) with exactly the values of
image-by-image fetching, so evaluating digit-blends' 12,000 images no longer costs as much as the model."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Subset, default_collate

from normkit_lab.datasets.tensors import ImageTensors


def _images(augment: bool = False) -> ImageTensors:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (37, 3, 8, 8), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (37,), generator=g)
    return ImageTensors(images, labels, torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.2, 0.25, 0.3]),
                        scale=1 / 255, augment=augment)


def test_a_batch_equals_the_images_fetched_one_by_one():
    data = _images()
    for dataset in (data, Subset(data, list(range(36, -1, -3)))):
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1)).tolist()
        batches = list(DataLoader(dataset, batch_size=5, sampler=order))
        for k, (x, y) in enumerate(batches):
            one_by_one = default_collate([dataset[i] for i in order[5 * k:5 * k + 5]])
            assert torch.equal(x, one_by_one[0]) and torch.equal(y, one_by_one[1]) and x.dtype == torch.float32


def test_augmented_batches_draw_their_crops_in_order_as_before():
    data = _images(augment=True)
    torch.manual_seed(3)
    batched = data.__getitems__([4, 1, 30])
    torch.manual_seed(3)
    one_by_one = [data[i] for i in (4, 1, 30)]
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(batched, one_by_one, strict=True))


def test_collate_passes_a_batch_on_stacked_with_default_collates_values():
    from normkit_lab.datasets.tensors import collate

    for augment in (False, True):
        data = _images(augment=augment)
        for dataset in (data, Subset(data, list(range(36, -1, -3)))):
            order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1)).tolist()
            torch.manual_seed(2)
            ours = list(DataLoader(dataset, batch_size=5, sampler=order, collate_fn=collate))
            torch.manual_seed(2)
            theirs = list(DataLoader(dataset, batch_size=5, sampler=order))
            for (x, y), (x0, y0) in zip(ours, theirs, strict=True):
                assert torch.equal(x, x0) and torch.equal(y, y0) and (x.dtype, y.dtype) == (x0.dtype, y0.dtype)
    batch = _images().__getitems__([3, 0, 7])
    assert collate(batch)[0] is batch.stacked[0]  # handed on, not stacked again
