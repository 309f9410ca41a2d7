"""The dataset context a factory receives and the bundle it returns."""

from __future__ import annotations

from dataclasses import dataclass

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
    """

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    in_channels: int
    image_size: int
