"""normkit-whitening: decorrelated batch norm (`dbn`, ZCA) and IterNorm (`iternorm`).

    layer = normkit.build("dbn(group_size=16)", 64)
    layer = normkit.build("iternorm(iters=5)", 64)
"""

from __future__ import annotations

import functools
from typing import Any

import normkit
from normkit.stages import Partition, Pipeline
from normkit_whitening.inverse_sqrt import inverse_sqrt
from normkit_whitening.whiten import IterWhiten, Whiten, ZCAWhiten

__all__ = ["IterWhiten", "Whiten", "ZCAWhiten", "inverse_sqrt"]

_DBN = ("Huang, Yang, Lang & Deng, Decorrelated Batch Normalization, CVPR 2018, arXiv:1804.08450")
_ITERNORM = ("Huang, Zhou, Zhu, Liu & Shao, Iterative Normalization: Beyond Standardization towards "
             "Efficient Whitening, CVPR 2019, arXiv:1904.03441")


def _step(cls: type, ctx: Any, **params: Any) -> Any:
    """A step factory for functools.partial (module level, so pipelines pickle)."""
    return cls(**params)


def decorrelated_batch_norm(group_size: int = 16, eps: float = 1e-3, momentum: float | None = 0.1) -> Pipeline:
    """ZCA-whiten groups of channels over batch and spatial dims; running whitening for eval."""
    return Pipeline(Partition("batch"), [functools.partial(_step, ZCAWhiten, group_size=group_size,
                                                           eps=eps, momentum=momentum)])


def iterative_norm(group_size: int = 16, iters: int = 5, eps: float = 1e-5,
                   momentum: float | None = 0.1) -> Pipeline:
    """Whiten groups of channels by Newton iterations; running whitening for eval."""
    return Pipeline(Partition("batch"), [functools.partial(_step, IterWhiten, group_size=group_size,
                                                           iters=iters, eps=eps, momentum=momentum)])


@normkit.hookimpl
def normkit_register_norms(register: Any) -> None:
    register("dbn", pipeline=decorrelated_batch_norm, aliases=("zca",), citation=_DBN,
             summary="decorrelated batch norm: ZCA whitening over channel groups, running matrices")
    register("iternorm", pipeline=iterative_norm, citation=_ITERNORM,
             summary="IterNorm: whitening by Newton iterations over channel groups, running matrices")
