"""IBNorm for normkit: compression steps ib-s, ib-t (bounded) and ib-l (logarithmic) and the paper's names.

    layer = normkit.build("ln+ib-l(lam=4)", 512, channel_dim=-1)
    layer = normkit.build("ibn-t", 64)   # = bn+ib-t

The formulas are normkit's reading (the authors' code is unreleased); see compression.py.
"""

from __future__ import annotations

from collections.abc import Callable

import normkit
from normkit.hookspecs import RegisterNorm, RegisterStage
from normkit.stages import BuildContext
from normkit_ibnorm.compression import COMPRESSIONS, Compression
from normkit_ibnorm.step import IBCompress

CITATION = ("Zou & Zhou, IBNorm: Information-Bottleneck Inspired Normalization for Representation "
            "Learning, arXiv:2510.25262, 2025 (normkit's formulas; the authors' code is unreleased)")
_SHAPES = {"s": "softsign-type", "l": "signed log", "t": "tanh"}

__all__ = ["CITATION", "COMPRESSIONS", "Compression", "IBCompress"]


def ib_s(ctx: BuildContext, *, lam: float = COMPRESSIONS["s"].default_lam, centre: bool | None = None,
         units: str = "std") -> IBCompress:
    """ib-s: softsign-type compression c / (1 + |c| / lam) of the standardized values (units=std) or the raw ones
    (units=raw), before standardization."""
    return IBCompress("s", lam, centre, units)


def ib_l(ctx: BuildContext, *, lam: float = COMPRESSIONS["l"].default_lam, centre: bool | None = None,
         units: str = "std") -> IBCompress:
    """ib-l: signed log compression sign(c) * lam * log1p(|c| / lam) (unbounded) of the standardized
    values (units=std) or the raw ones (units=raw), before standardization."""
    return IBCompress("l", lam, centre, units)


def ib_t(ctx: BuildContext, *, lam: float = COMPRESSIONS["t"].default_lam, centre: bool | None = None,
         units: str = "std") -> IBCompress:
    """ib-t: tanh compression lam * tanh(c / lam) of the standardized values (units=std) or the raw ones
    (units=raw), before standardization."""
    return IBCompress("t", lam, centre, units)


# Module-level factories (no closures): layers built from them pickle.
STAGE_FACTORIES: dict[str, Callable[..., IBCompress]] = {"s": ib_s, "l": ib_l, "t": ib_t}


@normkit.hookimpl
def normkit_register_stages(register: RegisterStage) -> None:
    for variant, factory in STAGE_FACTORIES.items():
        compression = COMPRESSIONS[variant]
        register(f"ib-{variant}", factory, kind="step", position="before",
                 citation=CITATION, ablations={"compression": None},  # --ablate: the norm without it
                 summary=f"IBNorm-{variant.upper()} compression ({_SHAPES.get(variant, 'custom')}: "
                         f"{compression.formula}) of standardized values, before standardization")


@normkit.hookimpl
def normkit_register_norms(register: RegisterNorm) -> None:
    for variant in STAGE_FACTORIES:
        register(f"ibn-{variant}", compose=f"bn+ib-{variant}", citation=CITATION,
                 summary=f"IBNorm-{variant.upper()} on batch norm (= bn+ib-{variant})")
        register(f"ibln-{variant}", compose=f"ln+ib-{variant}", citation=CITATION,
                 summary=f"IBNorm-{variant.upper()} on layer norm (= ln+ib-{variant})")
