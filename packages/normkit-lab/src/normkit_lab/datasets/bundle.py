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
    """Train and validation splits yielding (float tensor C,H,W, int label), and their shape.

    Token datasets (language models) yield (int64 ids (T,), int64 next ids (T,)) instead, with
    num_classes the vocabulary, in_channels 0 (no channels: token ids) and image_size the
    sequence length T. `test` is an optional held-out split; `metadata` holds JSON-able facts
    the results should record (e.g. a corpus's content hash).
    """

    name: str
    train: Dataset
    val: Dataset
    num_classes: int
    in_channels: int
    image_size: int
    test: Dataset | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
