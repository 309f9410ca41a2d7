"""bnn over ghost batches (`bnn(ghost=G)`) on the fused path: the fused function on the batch regrouped
so each (ghost batch, channel) pair is a channel, against the reference path on the grouped tensor."""

from __future__ import annotations

import copy

import normkit
import pytest
import torch
from normkit.testing import autograd_node_names

from normkit_normalnorm.functional import normality_norm


def _pair(spec: str, channels: int, channel_dim: int, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The layer (fused path) and a copy that records, which forces the reference path."""
    fused = normkit.build(spec, channels, channel_dim=channel_dim).to(dtype)
    with torch.no_grad():
        fused.weight.uniform_(0.5, 1.5)
        fused.bias.uniform_(-0.5, 0.5)
    reference = copy.deepcopy(fused)
    reference.recording = True
    return fused, reference


def _skewed(shape: tuple[int, ...], seed: int, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(shape, generator=g, dtype=torch.float64)
    x = (z + 0.3 * z**2).to(dtype)  # skewed, mildly (lambda_hat's gradient is ill-conditioned in float32 on heavy tails)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@pytest.mark.parametrize(("spec", "shape", "channel_dim", "channels_last", "dtype", "tol"), [
    ("bnn(noise=0,ghost=2,kernel=torch)", (8, 4, 3, 3), 1, False, torch.float64, 1e-9),
    ("bnn(noise=0,ghost=3,momentum=none,kernel=torch)", (9, 5, 4), 1, False, torch.float64, 1e-9),
    ("bnn(noise=0,ghost=2,kernel=torch)", (6, 3, 5, 4), 1, True, torch.float64, 1e-9),
    ("bnn(noise=0,ghost=4,kernel=torch)", (8, 7, 6), -1, False, torch.float64, 1e-9),
    ("bnn(noise=0,ghost=2)", (16, 8, 4, 4), 1, False, torch.float32, 1e-4),  # kernel=auto: rows.c on CPU
    ("bnn(noise=0,ghost=2)", (6, 5, 8), -1, False, torch.float32, 1e-4),
    ("bnn(noise=0,ghost=2,kernel=torch)", (5, 4, 3, 3), 1, False, torch.float64, 1e-9),  # a remainder
])
def test_fused_ghost_batches_equal_the_reference_path(spec, shape, channel_dim, channels_last, dtype, tol) -> None:
    fused, reference = _pair(spec, shape[channel_dim], channel_dim, dtype)
    for step in range(3):
        x = _skewed(shape, step, dtype, channels_last)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        out, ref = fused(xa), reference(xb)
        assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        grad = torch.randn_like(out)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(xa.grad, xb.grad, rtol=tol, atol=tol)
        for name, buffer in reference.named_buffers():
            torch.testing.assert_close(dict(fused.named_buffers())[name], buffer, rtol=tol, atol=tol)
    torch.testing.assert_close(fused.weight.grad, reference.weight.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(fused.bias.grad, reference.bias.grad, rtol=tol, atol=tol)
    fused.eval()  # eval: the running statistics, as a layer without ghost= with the same buffers
    plain = normkit.build(spec.replace(f"ghost={fused.partition.ghost}", "ghost=none"), shape[channel_dim],
                          channel_dim=channel_dim).to(dtype).eval()
    plain.load_state_dict(fused.state_dict())
    x = _skewed(shape, 9, dtype, channels_last)
    torch.testing.assert_close(fused(x), plain(x), rtol=0, atol=0)


def _regrouped_call(layer: torch.nn.Module, x: torch.Tensor, ghost: int) -> torch.Tensor:
    """normality_norm on x regrouped as (ghost, N/ghost * C, S), the affine repeated: what the fused
    ghost path computes, noise included."""
    n, c = x.shape[:2]
    k = n // ghost
    regrouped = x.reshape(k, ghost, c, -1).transpose(0, 1).reshape(ghost, k * c, -1)
    y = normality_norm(regrouped, layer.weight.repeat(k), layer.bias.repeat(k), partition="batch",
                       training=True, noise=layer.steps[1].noise)
    return y.reshape(ghost, k, c, -1).transpose(0, 1).reshape(x.shape)


@pytest.mark.parametrize(("kernel", "node"), [("torch", "NormalityFunctionBackward"),
                                               ("auto", "GroupsFunctionBackward")])
def test_with_noise_the_fused_ghost_path_runs_and_repeats_under_a_seed(kernel: str, node: str) -> None:
    layer = normkit.build(f"bnn(ghost=2,kernel={kernel})", 4).train()
    reference = copy.deepcopy(layer)
    reference.recording = True
    x = _skewed((8, 4, 5, 5), 0, torch.float32, False).requires_grad_(True)
    torch.manual_seed(3)
    out = layer(x)
    torch.manual_seed(3)
    again = layer(x)
    torch.manual_seed(3)
    expected = _regrouped_call(layer, x, 2)
    torch.manual_seed(3)
    ref = reference(x)
    assert node in autograd_node_names(out) and node not in autograd_node_names(ref)  # the fused function ran, in one call
    torch.testing.assert_close(out, again, rtol=0, atol=0)
    # Its noise is drawn in the regrouped order, and the reference path draws ghost batches' noise so too.
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # The noise is there, scaled per (ghost batch, channel): the same layer without noise differs by it.
    quiet = normkit.build(f"bnn(noise=0,ghost=2,kernel={kernel})", 4)
    diff = (out - quiet(x)).detach()
    assert 0.1 < diff.std() < 1.0 and diff.abs().max() < 10


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_ghost_batches_of_constant_or_outlying_values_stay_finite(kernel: str) -> None:
    layer = normkit.build(f"bnn(ghost=2,kernel={kernel})", 3)
    x = torch.zeros(4, 3, 2, 2)
    x[2:] = 1e15 * torch.randn(2, 3, 2, 2)  # one ghost batch constant, the other outliers (var 1e30 fits float32)
    x[:, 1] = 5.0  # a constant channel
    out = layer(x.requires_grad_(True))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(b).all() for b in layer.buffers())
