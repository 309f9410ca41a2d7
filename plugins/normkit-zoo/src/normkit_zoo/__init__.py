"""normkit-zoo: the classic norms beyond bn/ln/in/gn/rms, composed from normkit's stages.

    layer = normkit.build("brn(r_max=3,d_max=5)", 64)
    layer = normkit.build("frn", 64, activation="relu")   # FRN+TLU: the model's ReLU is dropped

Batch-dependent: brn, bgn, sn (BN part), evonorm-b0. Batch-free: evonorm-s0, frn, dyt, derf, ln2d.
EvoNorm and FRN include their nonlinearity (`includes_activation=True`).
"""

from __future__ import annotations

import functools
from typing import Any

import normkit
from normkit.stages import Partition, Pipeline, RMSScale
from normkit_zoo.batch_group import BatchGroupStandardize
from normkit_zoo.batch_renorm import BatchRenormalize
from normkit_zoo.dyt import DynamicErf, DynamicTanh
from normkit_zoo.evonorm import EvoB0, EvoS0
from normkit_zoo.frn import TLU, tlu
from normkit_zoo.ln2d import LayerNorm2d
from normkit_zoo.switchable import SwitchableStandardize
from normkit_zoo.ws import WeightStandardization, WSConv2d, ws

__all__ = ["TLU", "BatchGroupStandardize", "BatchRenormalize", "DynamicErf", "DynamicTanh", "EvoB0", "EvoS0",
           "LayerNorm2d", "SwitchableStandardize", "WSConv2d", "WeightStandardization"]

CITATIONS = {
    "brn": "Ioffe, Batch Renormalization: Towards Reducing Minibatch Dependence in Batch-Normalized "
           "Models, NeurIPS 2017, arXiv:1702.03275",
    "bgn": "Zhou, Sun, Li, Liu, Peng & Zhang, Batch Group Normalization, arXiv:2012.02782, 2020",
    "sn": "Luo, Ren, Peng, Zhang & Li, Differentiable Learning-to-Normalize via Switchable "
          "Normalization, ICLR 2019, arXiv:1806.10779",
    "evonorm": "Liu, Brock, Simonyan & Le, Evolving Normalization-Activation Layers, NeurIPS 2020, "
               "arXiv:2004.02967",
    "frn": "Singh & Krishnan, Filter Response Normalization Layer: Eliminating Batch Dependence in "
           "the Training of Deep Neural Networks, CVPR 2020, arXiv:1911.09737",
    "dyt": "Zhu, Chen, He, LeCun & Liu, Transformers without Normalization, CVPR 2025, arXiv:2503.10622",
    "derf": "Chen, Lu, Zhu, Sun & Liu, Stronger Normalization-Free Transformers, arXiv:2512.10938, 2025",
    "ws": "Qiao, Wang, Liu, Shen & Yuille, Micro-Batch Training with Batch-Channel Normalization and "
          "Weight Standardization, arXiv:1903.10520, 2019",
    "ln2d": "Liu, Mao, Wu, Feichtenhofer, Darrell & Xie, A ConvNet for the 2020s, CVPR 2022, "
            "arXiv:2201.03545 (timm LayerNorm2d)",
}


def batch_renorm(r_max: float = 3.0, d_max: float = 5.0, warmup: int = 0, eps: float = 1e-5,
                 momentum: float | None = 0.1) -> Pipeline:
    """BN with r, d corrections towards the running statistics in training (clipped, no gradient)."""
    return Pipeline(Partition("batch"), [functools.partial(_step, BatchRenormalize, r_max=r_max, d_max=d_max,
                                                           warmup=warmup, eps=eps, momentum=momentum)])


def batch_group_norm(groups: int = 32, eps: float = 1e-5, momentum: float | None = 0.1) -> Pipeline:
    """Standardize per group of C/G channels over batch and spatial dims; running stats per group."""
    return Pipeline(Partition("batch"), [functools.partial(_step, BatchGroupStandardize, groups=groups,
                                                           eps=eps, momentum=momentum)])


def switchable_norm(eps: float = 1e-5, momentum: float | None = 0.1) -> Pipeline:
    """Standardize with softmax-mixed IN/LN/BN statistics (BN part with running stats)."""
    return Pipeline(Partition("instance"), [functools.partial(_step, SwitchableStandardize, eps=eps,
                                                              momentum=momentum)])


def evonorm_s0(groups: int = 32, eps: float = 1e-5) -> Pipeline:
    """x * sigmoid(v x) / group std, then affine: norm and activation in one (batch-free)."""
    return Pipeline(Partition("group", groups), [functools.partial(_step, EvoS0, eps=eps)])


def evonorm_b0(eps: float = 1e-3, momentum: float | None = 0.1) -> Pipeline:
    """x / max(batch std, v x + instance std), then affine: norm and activation in one."""
    return Pipeline(Partition("batch"), [functools.partial(_step, EvoB0, eps=eps, momentum=momentum)])


def filter_response_norm(eps: float = 1e-6) -> Pipeline:
    """x / sqrt(mean over H,W of x^2 + eps), affine, then TLU max(y, tau)."""
    return Pipeline(Partition("instance"), [functools.partial(_step, RMSScale, eps=eps)], activation="tlu")


def _step(cls: type, ctx: Any, **params: Any) -> Any:
    """A step factory for functools.partial (module level, so pipelines pickle)."""
    return cls(**params)


@normkit.hookimpl
def normkit_register_stages(register: Any) -> None:
    register("tlu", tlu, kind="activation", citation=CITATIONS["frn"],
             summary="activation: thresholded linear unit max(y, tau), tau learned per channel")
    register("ws", ws, kind="step", citation=CITATIONS["ws"],
             summary="weight standardization of the conv feeding the norm (applied by convert and lab models)")


@normkit.hookimpl
def normkit_register_norms(register: Any) -> None:
    register("brn", pipeline=batch_renorm, aliases=("batchrenorm",), citation=CITATIONS["brn"],
             summary="batch renorm: BN corrected by clipped r, d towards running stats in training")
    register("bgn", pipeline=batch_group_norm, aliases=("batchgroupnorm",), citation=CITATIONS["bgn"],
             summary="batch group norm: standardize per group of channels over batch+spatial")
    register("sn", pipeline=switchable_norm, aliases=("switchnorm",), citation=CITATIONS["sn"],
             summary="switchable norm: learned softmax mix of IN, LN and BN statistics")
    register("evonorm-s0", pipeline=evonorm_s0, citation=CITATIONS["evonorm"], includes_activation=True,
             summary="EvoNorm-S0: x*sigmoid(v*x)/group std, batch-free, includes its activation")
    register("evonorm-b0", pipeline=evonorm_b0, citation=CITATIONS["evonorm"], includes_activation=True,
             summary="EvoNorm-B0: x/max(batch std, v*x+instance std), includes its activation")
    register("frn", pipeline=filter_response_norm, citation=CITATIONS["frn"], includes_activation=True,
             summary="filter response norm + TLU: x/sqrt(mean x^2+eps) per channel, then max(y, tau)")
    register("dyt", factory=DynamicTanh, citation=CITATIONS["dyt"],
             summary="Dynamic Tanh: weight*tanh(alpha*x)+bias, no statistics")
    register("derf", factory=DynamicErf, citation=CITATIONS["derf"],
             summary="Dynamic erf: weight*erf(alpha*x+shift)+bias, no statistics")
    register("ln2d", factory=LayerNorm2d, aliases=("layernorm2d",), citation=CITATIONS["ln2d"],
             summary="LayerNorm2d (ConvNeXt/timm): layer norm over channels at each position")
