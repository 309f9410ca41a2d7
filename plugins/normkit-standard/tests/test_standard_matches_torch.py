"""bn/ln/gn/in/rms match torch's own layers: outputs, gradients, running stats, checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normkit
from normkit.testing import check_norm

TOL = dict(rtol=1e-5, atol=1e-5)


def _pair(spec: str, shape: tuple[int, ...]) -> tuple[nn.Module, nn.Module, int]:
    c = shape[1]
    torch.manual_seed(0)
    if spec.startswith("bn"):
        native = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)](c)
        if spec == "bn(momentum=none)":
            native.momentum = None
    elif spec == "gn(groups=4)":
        native = nn.GroupNorm(4, c)
    elif spec == "in":
        native = {3: nn.InstanceNorm1d, 4: nn.InstanceNorm2d, 5: nn.InstanceNorm3d}[len(shape)](c, affine=True)
    elif spec == "ln":
        native = nn.LayerNorm(shape[-1])
        c = shape[-1]
    else:
        native = nn.RMSNorm(shape[-1], eps=1e-6)
        c = shape[-1]
    channel_dim = -1 if spec in ("ln", "rms") else 1
    ours = normkit.build(spec, c, channel_dim=channel_dim)
    with torch.no_grad():
        native.weight.normal_(1.0, 0.3)
        ours.weight.copy_(native.weight)
        if getattr(native, "bias", None) is not None:
            native.bias.normal_(0.0, 0.3)
            ours.bias.copy_(native.bias)
    return ours, native, c


CASES = [
    ("bn", (8, 4, 5, 5)), ("bn", (8, 4)), ("bn", (6, 4, 7)), ("bn", (4, 3, 2, 3, 3)),
    ("bn(momentum=none)", (8, 4, 5, 5)), ("gn(groups=4)", (5, 8, 3, 3)), ("gn(groups=4)", (5, 8, 7)),
    ("in", (5, 4, 6, 6)), ("in", (5, 4, 9)), ("ln", (4, 7, 16)), ("ln", (3, 16)), ("rms", (4, 7, 16)),
]


@pytest.mark.parametrize(("spec", "shape"), CASES)
@pytest.mark.parametrize("generic", [False, True], ids=["native", "generic"])
def test_matches_torch_over_steps(spec: str, shape: tuple[int, ...], generic: bool) -> None:
    ours, native, _ = _pair(spec, shape)
    if generic:  # recording forces the generic (readable) path instead of torch's kernels
        ours.recording = True
    for step in range(4):
        x = (torch.randn(shape) * (1 + step) + step).requires_grad_(True)
        x2 = x.detach().clone().requires_grad_(True)
        g = torch.randn(shape)
        y, y2 = ours(x), native(x2)
        torch.testing.assert_close(y, y2, **TOL)
        y.backward(g)
        y2.backward(g)
        torch.testing.assert_close(x.grad, x2.grad, **TOL)
        for name in ("weight", "bias"):
            if getattr(native, name, None) is not None:
                torch.testing.assert_close(getattr(ours, name).grad, getattr(native, name).grad, **TOL)
        ours.zero_grad()
        native.zero_grad()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        if getattr(native, name, None) is not None:
            torch.testing.assert_close(getattr(ours, name), getattr(native, name), **TOL)
    ours.eval()
    native.eval()
    x = torch.randn(shape) * 2 + 1
    torch.testing.assert_close(ours(x), native(x), **TOL)


@pytest.mark.parametrize(("spec", "shape"), [c for c in CASES if c[0] != "bn(momentum=none)"])
def test_torch_checkpoints_load(spec: str, shape: tuple[int, ...]) -> None:
    ours, native, _ = _pair(spec, shape)
    native.train()
    for _ in range(3):
        native(torch.randn(shape) * 3 + 1)
    state = native.state_dict()
    assert set(ours.state_dict()) == set(state)
    ours.load_state_dict(state, strict=True)
    ours.eval()
    native.eval()
    x = torch.randn(shape)
    torch.testing.assert_close(ours(x), native(x), **TOL)


@pytest.mark.parametrize("spec", ["bn", "ln", "gn(groups=4)", "in", "rms", "none", "bn(affine=false)",
                                  "gn(groups=2)+relu", "bn(track_running_stats=false)",
                                  "rms(zero_centered=true)", "rms(affine=false)"])
def test_conformance(spec: str) -> None:
    check_norm(spec, num_channels=8)


@pytest.mark.parametrize("spec", ["ln", "rms", "bn", "rms(zero_centered=true)", "rms(affine=false)"])
def test_conformance_tokens(spec: str) -> None:
    check_norm(spec, num_channels=8, channel_dim=-1)


def test_group_count_must_divide_channels() -> None:
    with pytest.raises(normkit.SpecError, match="not divisible into 3 groups; use groups="):
        normkit.build("gn(groups=3)", 64)
    with pytest.raises(normkit.SpecError, match="not divisible into 32 groups"):
        normkit.build("gn", 48)


def test_batch_norm_of_one_value_per_channel_fails_clearly() -> None:
    layer = normkit.build("bn", 4)
    with pytest.raises(normkit.NormShapeError, match="more than 1 value per channel"):
        layer(torch.randn(1, 4))
    layer.eval()
    assert torch.isfinite(layer(torch.randn(1, 4))).all()


def test_wrong_channel_count_fails_clearly() -> None:
    with pytest.raises(normkit.NormShapeError, match="expects 8 channels in dim 1"):
        normkit.build("bn", 8)(torch.randn(2, 4, 3, 3))


def test_zero_centered_rms_is_gemmas_one_plus_w_and_decays_towards_gain_one() -> None:
    """rms(zero_centered=true): gain 1 + w with w starting at 0, as Gemma's and Qwen3-Next's RMSNorm;
    the same function as rms at initialisation, and weight decay shrinks w, i.e. the gain towards 1."""
    torch.manual_seed(0)
    ours = normkit.build("rms(zero_centered=true)", 16, channel_dim=-1)
    plain = normkit.build("rms", 16, channel_dim=-1)
    assert torch.equal(ours.weight.detach(), torch.zeros(16))
    x = torch.randn(4, 7, 16)
    torch.testing.assert_close(ours(x), plain(x), rtol=0, atol=0)
    with torch.no_grad():
        ours.weight.normal_(0.0, 0.3)
    reference = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + ours.weight.detach())
    torch.testing.assert_close(ours(x), reference, **TOL)
    opt = torch.optim.SGD(ours.parameters(), lr=0.5, weight_decay=1.0)
    before = ours.weight.detach().abs().sum()
    opt.zero_grad()
    (ours(x) * 0).sum().backward()  # a zero loss: only weight decay moves the weight
    opt.step()
    assert ours.weight.detach().abs().sum() < before
    with pytest.raises(normkit.SpecError, match="zero_centered needs a gain"):
        normkit.build("rms(zero_centered=true,affine=false)", 16)


def test_parameter_free_rms_has_no_parameters() -> None:
    layer = normkit.build("rms(affine=false)", 16, channel_dim=-1)
    assert not list(layer.parameters())
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(layer(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), **TOL)
