"""Normality normalization for normkit: the `nn` stage and the paper's bnn, lnn, gnn, inn.

Registered through the public plugin API only (entry point `normalnorm` in group `normkit`).
"""

from __future__ import annotations

from importlib import resources

import normkit
from normkit.hookspecs import RegisterNorm, RegisterPreset, RegisterStage

from normkit_normalnorm.functional import normality_norm
from normkit_normalnorm.stage import NormalityStep, normality_stage

CITATION = ("Eftekhari & Papyan, On the Importance of Gaussianizing Representations (normality "
            "normalization), ICML 2025, arXiv:2505.00685")

# What `normkit compare --ablate` switches off, one at a time: the training noise, and the power
# transform (lambda clamped to 1, where Yeo-Johnson is the identity), leaving the other part as it was.
ABLATIONS = {"noise": {"noise": 0.0}, "power transform": {"lambda_min": 1.0, "lambda_max": 1.0}}

__all__ = ["ABLATIONS", "CITATION", "NormalityStep", "normality_norm", "normality_stage"]


@normkit.hookimpl
def normkit_register_stages(register: RegisterStage) -> None:
    register("nn", normality_stage, kind="step", position="after", aliases=("normality",),
             citation=CITATION, ablations=ABLATIONS,
             summary="normality normalization step: Yeo-Johnson power transform (one-Newton-step lambda) "
                     "+ noise scaled per group, after standardizing")


@normkit.hookimpl
def normkit_register_norms(register: RegisterNorm) -> None:
    register("bnn", compose="bn+nn", citation=CITATION,
             summary="batch normality norm: bn + power transform + noise (xi 0.4), running lambda for eval")
    register("lnn", compose="ln+nn", citation=CITATION,
             summary="layer normality norm: ln + power transform + noise (xi 1.0), lambda per sample/token")
    register("gnn", compose="gn+nn", citation=CITATION,
             summary="group normality norm: gn + power transform + noise (xi 0.4), lambda per sample and group")
    register("inn", compose="in+nn", citation=CITATION,
             summary="instance normality norm: in + power transform + noise (xi 0.4), lambda per sample and channel")


@normkit.hookimpl
def normkit_register_presets(register: RegisterPreset) -> None:
    """The reproduction presets shipped in presets/ (`normkit reproduce --list`; docs/reproduce.md)."""
    for path in sorted(resources.files(__name__).joinpath("presets").iterdir(), key=lambda p: p.name):
        if path.name.endswith(".yaml"):
            register(path.name.removesuffix(".yaml"), path, citation=CITATION)
