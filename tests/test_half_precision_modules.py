"""Half-precision modules on CPU (`layer.to(torch.bfloat16)` / `torch.float16`) work wherever torch's
own layer does: statistics in float32, parameters, gradients and output in the module's dtype.

Each standard norm is checked against torch's equivalent module in the same dtype, with the same
parameters and input: outputs (train and eval), running statistics and parameter gradients agree to
the dtype's precision. Every other registered norm at least runs as a half module: finite output and
gradients in the module's dtype.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import normkit

C = 32  # gn's default 32 groups
HALF = [torch.bfloat16, torch.float16]


def _torch_equivalent(name: str) -> tuple[nn.Module, int]:
    """torch's module for a standard norm, and normkit's channel_dim for the input it takes."""
    return {
        "bn": (nn.BatchNorm2d(C), 1),
        "gn": (nn.GroupNorm(32, C), 1),
        "in": (nn.GroupNorm(C, C), 1),  # instance norm with a per-channel affine, no running statistics
        "ln": (nn.GroupNorm(1, C), 1),  # ln over (C, H, W) with a per-channel affine
        "ln-tokens": (nn.LayerNorm(C), -1),
    }[name]


def _copy_parameters(ours: nn.Module, theirs: nn.Module) -> None:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g) if name == "weight" else 0.1 * torch.randn(p.shape,
                                                                                                      generator=g))
        mine = dict(ours.named_parameters())
        for name, p in theirs.named_parameters():
            mine[name].copy_(p)


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["bn", "gn", "in", "ln", "ln-tokens"])
def test_a_half_module_matches_torchs_in_the_same_dtype(name: str, dtype: torch.dtype) -> None:
    theirs, channel_dim = _torch_equivalent(name)
    ours = normkit.build(name.removesuffix("-tokens"), C, channel_dim=channel_dim)
    _copy_parameters(ours, theirs)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    tol = {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {"atol": 5e-3, "rtol": 5e-3}
    g = torch.Generator().manual_seed(0)
    shape = (4, C, 5, 5) if channel_dim == 1 else (4, 7, C)
    for step in range(2):
        x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ya, yb = ours(xa), theirs(xb)
        assert ya.dtype == dtype
        torch.testing.assert_close(ya, yb, **tol, msg=f"train output, step {step}")
        ya.float().square().sum().backward()
        yb.float().square().sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, atol=0.1, rtol=0.05)
    for (pname, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert a.dtype == dtype and a.grad.dtype == dtype, pname
        torch.testing.assert_close(a.grad.float(), b.grad.float(), atol=0.5, rtol=0.05, msg=pname)
    if name == "bn":
        assert ours.running_mean.dtype == dtype
        torch.testing.assert_close(ours.running_mean, theirs.running_mean, **tol)
        torch.testing.assert_close(ours.running_var, theirs.running_var, **tol)
    ours.eval()
    theirs.eval()
    x = torch.randn(shape, generator=g).to(dtype)
    torch.testing.assert_close(ours(x), theirs(x), **tol, msg="eval output")


def test_ln2d_as_a_half_module_matches_torchs_layer_norm_over_channels() -> None:
    ours = normkit.build("ln2d", C)
    theirs = nn.LayerNorm(C, eps=1e-6)
    _copy_parameters(ours, theirs)
    for dtype in HALF:
        a, b = copy.deepcopy(ours).to(dtype), copy.deepcopy(theirs).to(dtype)
        x = torch.randn(3, C, 4, 4).to(dtype)
        y = a(x)
        assert y.dtype == dtype
        tol = {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {"atol": 5e-3, "rtol": 5e-3}
        torch.testing.assert_close(y, b(x.movedim(1, -1)).movedim(-1, 1), **tol)


def _norms() -> list[str]:
    return [e["name"] for e in normkit.available() if e["kind"] == "norm"]


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", _norms())
def test_every_norm_runs_as_a_half_module(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layer = normkit.build(name, C).to(dtype)
    x = torch.randn(4, C, 3, 3).to(dtype).requires_grad_(True)
    for training in (True, False):
        layer.train(training)
        y = layer(x)
        assert y.dtype == dtype and torch.isfinite(y.float()).all(), (name, training)
        y.float().square().mean().backward()
    assert torch.isfinite(x.grad.float()).all()
    for pname, p in layer.named_parameters():
        assert p.dtype == dtype, pname
        assert p.grad is None or (p.grad.dtype == dtype and torch.isfinite(p.grad.float()).all()), pname
