"""The dataset context a factory receives and the bundle it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset


@dataclass(frozen=True)
class DatasetContext:
    """Where datasets live, whether a factory may download, and a seed for random generation.

    The training loop passes seed 0 for every run, so every norm and seed sees the same data.
    """

    data_dir: str | None
    download: bool
    seed: int


@dataclass
class DatasetBundle:
    """Train, validation and test splits yielding (float tensor C,H,W, int label), and their shape.

    `val` is a fixed, stratified part of the training data (anything that selects reads it);
    `test` is the dataset's own test split or a fixed held-out part, only ever reported.
    Token datasets (language models) yield (int64 ids (T,), int64 next ids (T,)) instead, with
    num_classes the vocabulary, in_channels 0 (no channels: token ids) and image_size the
    sequence length T. `metadata` holds JSON-able facts the results should record (e.g. a
    corpus's content hash).
    """

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    in_channels: int
    image_size: int
    metadata: dict[str, Any] = field(default_factory=dict)
