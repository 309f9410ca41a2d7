"""The conformance suite fails on broken norms (so passing it means something)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import normkit
from normkit.stages import Partition, Pipeline, Standardize, Step
from normkit.testing import check_norm, temporary_plugin


class WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * x

    @staticmethod
    def backward(ctx, g):
        return g  # should be 2 * x * g


class WrongGradStep(Step):
    name = "wrong-grad"

    def forward(self, x, groups, layer):
        return WrongGrad.apply(x)


class HalfStatsStep(Step):
    """Computes statistics in the input precision by casting down: autocast check must notice."""

    name = "half-stats"

    def forward(self, x, groups, layer):
        return (x.half().float() * 1000).round() / 1000 + torch.randn_like(x) * 0.2


class NanOnConstant(Step):
    name = "nan-on-constant"

    def forward(self, x, groups, layer):
        return x / x.std(dim=groups.dims, keepdim=True)  # no eps: 0/0 on constant groups


class Unseeded(nn.Module):
    """Noise from numpy's global generator, which torch.manual_seed does not control."""

    def __init__(self, num_channels: int) -> None:
        super().__init__()

    def forward(self, x):
        return x + torch.from_numpy(np.random.randn(*x.shape)).to(x.dtype)


class NotSaved(nn.Module):
    def __init__(self, num_channels: int) -> None:
        super().__init__()
        self.mean = torch.tensor(0.0)  # a plain attribute, not a buffer: lost in state_dict

    def forward(self, x):
        if self.training:
            self.mean = 0.5 * self.mean + 0.5 * x.mean().detach()
        return x - self.mean


class Broken:
    @normkit.hookimpl
    def normkit_register_stages(self, register):
        register("wrong-grad", lambda ctx: WrongGradStep())
        register("half-stats", lambda ctx: HalfStatsStep())
        register("nan-on-constant", lambda ctx: NanOnConstant(), position="before")

    @normkit.hookimpl
    def normkit_register_norms(self, register):
        register("unseeded", factory=Unseeded)
        register("notsaved", factory=NotSaved)
        register("plain-ln", pipeline=lambda: Pipeline(Partition("layer"), [lambda ctx: Standardize()]))


@pytest.fixture(scope="module", autouse=True)
def broken_plugin():
    with temporary_plugin(Broken(), "broken"):
        yield


@pytest.mark.parametrize(("spec", "check"), [
    ("plain-ln+wrong-grad", "gradients"),
    ("plain-ln+half-stats", "autocast"),
    ("plain-ln+nan-on-constant", "edge_cases"),
    ("unseeded", "determinism"),
    ("notsaved", "state_dict"),
])
def test_the_suite_catches(spec: str, check: str) -> None:
    with pytest.raises(AssertionError, match=rf"\[{check}\]"):
        check_norm(spec, 4, only=[check], shapes=[(4, 4, 3, 3), (5, 4)])


def test_unknown_check_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown checks"):
        check_norm("bn", 4, only=["gradient"])


def test_skip_leaves_checks_out() -> None:
    check_norm("plain-ln+wrong-grad", 4, skip=["gradients", "autocast", "edge_cases"])
    with pytest.raises(AssertionError, match=r"\[gradients\]"):
        check_norm("plain-ln+wrong-grad", 4, skip=["autocast", "edge_cases"])
