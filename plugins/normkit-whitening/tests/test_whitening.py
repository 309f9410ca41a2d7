"""dbn and iternorm: conformance, float64 references over training steps, rank-deficient batches."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import normkit
from normkit.testing import check_norm
from normkit_whitening.inverse_sqrt import inverse_sqrt

SPECS = ["dbn(group_size=4)", "iternorm(group_size=4)", "dbn", "iternorm(iters=3)"]


@pytest.mark.parametrize("spec", SPECS)
def test_conforms(spec: str) -> None:
    check_norm(spec, num_channels=8)


def _reference_whitening(x: torch.Tensor, g: int, eps: float, iters: int | None):
    """Per group of g channels: mean, covariance + eps I, then Sigma^-1/2 (eigh) or Newton's P_T."""
    n, c, h, w = x.shape
    means, mats, out = [], [], torch.empty_like(x)
    for k in range(c // g):
        xs = x[:, k * g:(k + 1) * g].permute(1, 0, 2, 3).reshape(g, -1)
        mu = xs.mean(dim=1, keepdim=True)
        xc = xs - mu
        sigma = xc @ xc.T / xs.shape[1] + eps * torch.eye(g, dtype=x.dtype)
        if iters is None:
            lam, d = torch.linalg.eigh(sigma)
            wmat = d @ torch.diag(lam.rsqrt()) @ d.T
        else:
            tr = torch.trace(sigma)
            p = torch.eye(g, dtype=x.dtype)
            for _ in range(iters):
                p = 0.5 * (3 * p - torch.linalg.matrix_power(p, 3) @ (sigma / tr))
            wmat = p / tr.sqrt()
        out[:, k * g:(k + 1) * g] = (wmat @ xc).reshape(g, n, h, w).permute(1, 0, 2, 3)
        means.append(mu.reshape(g))
        mats.append(wmat)
    return out, torch.cat(means), torch.stack(mats)


@pytest.mark.parametrize(("spec", "eps", "iters"), [("dbn(group_size=4)", 1e-3, None),
                                                    ("iternorm(group_size=4,iters=4)", 1e-5, 4)])
def test_matches_the_paper_over_steps_then_eval(spec: str, eps: float, iters: int | None) -> None:
    torch.manual_seed(0)
    layer = normkit.build(spec, 8).double()
    with torch.no_grad():
        layer.weight.add_(torch.randn(8, dtype=torch.float64) * 0.3)
        layer.bias.add_(torch.randn(8, dtype=torch.float64) * 0.3)
    wgt, bias = layer.weight.detach().view(1, -1, 1, 1), layer.bias.detach().view(1, -1, 1, 1)
    g = torch.Generator().manual_seed(0)
    mixing = torch.randn(8, 8, generator=g, dtype=torch.float64)
    run_mean = torch.zeros(8, dtype=torch.float64)
    run_w = torch.eye(4, dtype=torch.float64).repeat(2, 1, 1)
    for step in range(4):
        x = torch.einsum("dc,nchw->ndhw", mixing, torch.randn(6, 8, 3, 3, generator=g, dtype=torch.float64)) + step
        ref, mean, mats = _reference_whitening(x, 4, eps, iters)
        torch.testing.assert_close(layer(x), ref * wgt + bias, rtol=1e-7, atol=1e-8)
        run_mean += 0.1 * (mean - run_mean)
        run_w += 0.1 * (mats - run_w)
    torch.testing.assert_close(layer.running_mean, run_mean)
    torch.testing.assert_close(layer.running_whitening, run_w, rtol=1e-7, atol=1e-8)
    layer.eval()
    x = torch.randn(3, 8, 2, 2, generator=g, dtype=torch.float64)
    xs = (x - run_mean.view(1, -1, 1, 1)).reshape(3, 2, 4, 4)
    ref = torch.einsum("gij,ngjs->ngis", run_w, xs).reshape(x.shape)
    torch.testing.assert_close(layer(x), ref * wgt + bias)


@pytest.mark.parametrize("spec", ["dbn", "iternorm"])
def test_rank_deficient_batches_give_finite_values_and_gradients(spec: str) -> None:
    layer = normkit.build(spec, 16)
    base = torch.randn(2, 1, 3, 3)
    cases = {"two samples, one pixel": torch.randn(2, 16, 1, 1),  # rank 1 covariance
             "copied channels": base.repeat(1, 16, 1, 1),         # all eigenvalues but one equal eps
             "constant": torch.full((4, 16, 2, 2), 3.0)}
    for what, x in cases.items():
        x = x.clone().requires_grad_(True)
        y = layer(x)
        (y * torch.randn_like(y)).sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all(), what
        assert torch.isfinite(layer.weight.grad).all(), what


def test_inverse_sqrt_gradient_matches_finite_differences_with_repeated_eigenvalues() -> None:
    a = torch.randn(3, 5, dtype=torch.float64)
    sigma = (a.T @ a + 0.5 * torch.eye(5, dtype=torch.float64)).requires_grad_(True)  # eigenvalue 0.5 twice

    def f(s):
        return inverse_sqrt((s + s.T) / 2, 1e-12)

    torch.autograd.gradcheck(f, (sigma,))
    lam, d = torch.linalg.eigh(sigma.detach())
    torch.testing.assert_close(f(sigma), d @ torch.diag(lam.rsqrt()) @ d.T)


@pytest.mark.parametrize("spec", ["dbn(group_size=4)", "iternorm(group_size=4)"])
def test_pickles_and_takes_an_empty_eval_batch(spec: str) -> None:
    layer = normkit.build(spec, 8)
    layer(torch.randn(4, 8, 3, 3))
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    loaded, twin = torch.load(buf, weights_only=False).eval(), copy.deepcopy(layer).eval()
    layer.eval()
    x = torch.randn(2, 8, 3, 3)
    torch.testing.assert_close(loaded(x), layer(x), rtol=0, atol=0)
    torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)
    g, groups = layer.partition.group(torch.randn(0, 8, 9), tokens=False)
    assert layer.steps[0].forward(g, groups, layer).shape == (0, 8, 9)


def test_group_size_must_divide_the_channels() -> None:
    with pytest.raises(normkit.SpecError, match="group_size="):
        normkit.build("dbn(group_size=16)", 40)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["dbn(group_size=4)", "iternorm(group_size=4)"])
def test_compiles_in_training_and_eval(spec: str) -> None:
    eager, layer = normkit.build(spec, 8), normkit.build(spec, 8)
    compiled = torch.compile(layer)
    for training in (True, False):
        eager.train(training)
        layer.train(training)
        x = torch.randn(4, 8, 3, 3)
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ye, yc = eager(xe), compiled(xc)
        torch.testing.assert_close(yc, ye, rtol=1e-4, atol=1e-4)
        ye.square().sum().backward()
        yc.square().sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-3, atol=1e-3)
