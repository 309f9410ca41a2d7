"""IBNorm for normkit: bounded compression steps ib-s, ib-l, ib-t and the paper's names as norms.

    layer = normkit.build("ln+ib-l(lam=4)", 512, channel_dim=-1)
    layer = normkit.build("ibn-t", 64)   # = bn+ib-t

The formulas are normkit's reading (the authors' code is unreleased); see compression.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import normkit
from normkit.stages import BuildContext
from normkit_ibnorm.compression import COMPRESSIONS, Compression
from normkit_ibnorm.step import IBCompress

CITATION = ("Zou & Zhou, IBNorm: Information-Bottleneck Inspired Normalization for Representation "
            "Learning, arXiv:2510.25262, 2025 (normkit's formulas; the authors' code is unreleased)")
_SHAPES = {"s": "softsign-type", "l": "signed log", "t": "tanh"}

__all__ = ["CITATION", "COMPRESSIONS", "Compression", "IBCompress"]


def _stage_factory(variant: str) -> Callable[..., IBCompress]:
    default_lam = COMPRESSIONS[variant].default_lam

    def factory(ctx: BuildContext, *, lam: float = default_lam, centre: bool | None = None) -> IBCompress:
        return IBCompress(variant, lam, centre)

    factory.__name__ = f"ib_{variant}"
    factory.__doc__ = f"ib-{variant}: {COMPRESSIONS[variant].formula}, before standardization."
    return factory


@normkit.hookimpl
def normkit_register_stages(register: Any) -> None:
    for variant, compression in COMPRESSIONS.items():
        register(f"ib-{variant}", _stage_factory(variant), kind="step", position="before",
                 citation=CITATION,
                 summary=f"IBNorm-{variant.upper()} compression ({_SHAPES.get(variant, 'custom')}: "
                         f"{compression.formula}) of centred values, before standardization")


@normkit.hookimpl
def normkit_register_norms(register: Any) -> None:
    for variant in COMPRESSIONS:
        register(f"ibn-{variant}", compose=f"bn+ib-{variant}", citation=CITATION,
                 summary=f"IBNorm-{variant.upper()} on batch norm (= bn+ib-{variant})")
        register(f"ibln-{variant}", compose=f"ln+ib-{variant}", citation=CITATION,
                 summary=f"IBNorm-{variant.upper()} on layer norm (= ln+ib-{variant})")
