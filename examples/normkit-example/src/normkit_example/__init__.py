"""A minimal normkit plugin: the `softclip` stage, the `scbn` (= bn+softclip) and `scgn` norms, and a
workload for `normkit suite` (`narrow-cnn`).

softclip bounds standardized values smoothly, `limit * tanh(h / limit)`, which tames outliers
while staying the identity near zero. It works after any partition: `bn+softclip`,
`gn(groups=8)+softclip(limit=2)`, `ln+softclip`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

import normkit
from normkit.hookspecs import RegisterNorm, RegisterStage, RegisterWorkload
from normkit.stages import BuildContext, Groups, Partition, Pipeline, Standardize, Step, make_step


class SoftClip(Step):
    """Smoothly clip standardized values to (-limit, limit)."""

    name = "softclip"

    def __init__(self, limit: float) -> None:
        self.limit = limit

    def forward(self, x: Tensor, groups: Groups, layer: Any) -> Tensor:
        return self.limit * torch.tanh(x / self.limit)


def softclip(ctx: BuildContext, limit: float = 3.0) -> SoftClip:
    """Stage factory: parameters are the keyword arguments (typed by their hints, defaults shown in `normkit list`)."""
    if limit <= 0:
        raise normkit.SpecError(f"softclip: limit must be > 0, got {limit}")
    return SoftClip(limit)


def softclip_group_norm(groups: int = 8, limit: float = 3.0, eps: float = 1e-5) -> Pipeline:
    """scgn: group norm then softclip as one pipeline. Its step factories are module-level and get
    their arguments through make_step / functools.partial, never lambdas: layers must pickle."""
    return Pipeline(Partition("group", groups),
                    [make_step(Standardize, eps=eps), functools.partial(softclip, limit=limit)])


@normkit.hookimpl
def normkit_register_stages(register: RegisterStage) -> None:
    register("softclip", softclip, kind="step", position="after",
             summary="smoothly clip standardized values to (-limit, limit)")


@normkit.hookimpl
def normkit_register_norms(register: RegisterNorm) -> None:
    register("scbn", compose="bn+softclip", summary="batch norm with soft-clipped outputs")
    register("scgn", pipeline=softclip_group_norm, summary="group norm with soft-clipped outputs")


# A workload is plain data (docs/suite.md, "Adding a workload"): the model, data and recipe every norm
# trains, the learning rates each norm is tuned over, the validation target, and a held-out variant.
NARROW_CNN = {
    "question": "does the norm train a narrow CNN (8 channels) in a few epochs?",
    "config": {"model": "small-cnn", "model_params": {"width": 8}, "dataset": "digits", "batch_size": 64,
               "epochs": 3},
    "tune": {"lr": [0.05, 0.1]},
    "target": 80.0,
    "variants": {"wider": {"model_params": {"width": 16}}},
}


@normkit.hookimpl
def normkit_register_workloads(register: RegisterWorkload) -> None:
    register("narrow-cnn", NARROW_CNN, summary=NARROW_CNN["question"])
