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
    """Train and validation splits yielding (float tensor C,H,W, int label), and their shape."""

    name: str
    train: Dataset
    val: Dataset
    num_classes: int
    in_channels: int
    image_size: int
