"""The standard norms (bn, ln, in, gn, rms, none), registered through the public plugin API."""

from __future__ import annotations

from typing import Any

import normkit
from normkit import SpecError
from normkit.hookspecs import RegisterNorm
from normkit.stages import Partition, Pipeline, RMSScale, Standardize, make_step

_BN = ("Ioffe & Szegedy, Batch Normalization: Accelerating Deep Network Training by Reducing "
       "Internal Covariate Shift, ICML 2015, arXiv:1502.03167")
_LN = "Ba, Kiros & Hinton, Layer Normalization, arXiv:1607.06450, 2016"
_IN = ("Ulyanov, Vedaldi & Lempitsky, Instance Normalization: The Missing Ingredient for Fast "
       "Stylization, arXiv:1607.08022, 2016")
_GN = "Wu & He, Group Normalization, ECCV 2018, arXiv:1803.08494"
_RMS = "Zhang & Sennrich, Root Mean Square Layer Normalization, NeurIPS 2019, arXiv:1910.07467"


def _recovery(affine: bool) -> Any:
    return "affine" if affine else "none"


def batch_norm(eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
               track_running_stats: bool = True) -> Pipeline:
    """Per channel over batch and spatial dims; running mean/var for eval."""
    return Pipeline(Partition("batch"), [make_step(Standardize, eps=eps, momentum=momentum,
                                                             track_running_stats=track_running_stats)],
                    _recovery(affine))


def layer_norm(eps: float = 1e-5, affine: bool = True) -> Pipeline:
    """Per sample over channels and spatial dims (per token over channels for N,*,C)."""
    return Pipeline(Partition("layer"), [make_step(Standardize, eps=eps)], _recovery(affine))


def instance_norm(eps: float = 1e-5, affine: bool = True) -> Pipeline:
    """Per sample and channel over spatial dims."""
    return Pipeline(Partition("instance"), [make_step(Standardize, eps=eps)], _recovery(affine))


def group_norm(groups: int = 32, eps: float = 1e-5, affine: bool = True) -> Pipeline:
    """Per sample and group of C/groups channels."""
    return Pipeline(Partition("group", groups), [make_step(Standardize, eps=eps)], _recovery(affine))


def rms_norm(eps: float = 1e-6, affine: bool = True, zero_centered: bool = False) -> Pipeline:
    """Divide by the root mean square over the layer partition; gain only (none: parameter-free).

    zero_centered: the gain is `1 + w` with w starting at 0 (Gemma, Qwen3-Next), so weight decay pulls
    it towards 1; the same function at initialisation, a different parametrisation in training.
    """
    if zero_centered and not affine:
        raise SpecError("rms: zero_centered needs a gain to centre; drop zero_centered=true or affine=false")
    return Pipeline(Partition("layer"), [make_step(RMSScale, eps=eps)], "gain" if affine else "none",
                    gain_offset=1.0 if zero_centered else 0.0)


def no_norm() -> Pipeline:
    """Identity: no statistics, no recovery (the 'no normalization' baseline)."""
    return Pipeline(None, [], "none", core=None)


@normkit.hookimpl
def normkit_register_norms(register: RegisterNorm) -> None:
    register("bn", pipeline=batch_norm, aliases=("batchnorm",), citation=_BN,
             summary="batch norm: standardize per channel over batch+spatial, running stats for eval")
    register("ln", pipeline=layer_norm, aliases=("layernorm",), citation=_LN,
             summary="layer norm: standardize per sample (per token for N,*,C)")
    register("in", pipeline=instance_norm, aliases=("instancenorm",), citation=_IN,
             summary="instance norm: standardize per sample and channel over spatial dims")
    register("gn", pipeline=group_norm, aliases=("groupnorm",), citation=_GN,
             summary="group norm: standardize per sample and group of channels")
    register("rms", pipeline=rms_norm, aliases=("rmsnorm",), citation=_RMS,
             summary="RMS norm: divide by root mean square per sample/token, gain only")
    register("none", pipeline=no_norm, aliases=("identity-norm",),
             summary="no normalization (identity), the baseline without a norm")
